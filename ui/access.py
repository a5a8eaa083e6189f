"""Who uses the dashboard: single-user mode (the default: one person, the machine's run store) or
shared mode (``ATTN_LAB_SHARED=1``: a login through Streamlit's ``st.login``, OpenID Connect with
the provider of ``.streamlit/secrets.toml``'s ``[auth]`` section, and a run store per person,
``attn_core.runs.users``). ``gate`` runs first on every page (app.py): in shared mode it serves
nothing until the person is logged in, then makes every ``RunStore()``, upload and cache folder of
the session theirs (``attn_core.runs.scope_roots``). Admins (``ATTN_LAB_ADMINS``, e-mail
addresses) may open any user's store from the sidebar."""

from __future__ import annotations

import os
import time
from pathlib import Path

import streamlit as st
from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

from attn_core.runs import RunStoreError, users
from attn_core.runs.names import scope_roots
from ui.markup import plain

ENV_SHARED = "ATTN_LAB_SHARED"
ENV_ADMINS = "ATTN_LAB_ADMINS"
USER = "attn_lab_user"  # session key: the logged-in person's user id, as the job queue's pages read it
ADMIN = "attn_lab_admin"  # session key: whether they are an admin (the queue shows and cancels every entry)
_STORE = "_access_store"  # session key: the store this session acts in (its user's, or one an admin opened)
_PICKED = "_access_picked"  # session key: the store an admin picked (a user id; "" = their own)
_SHARED_KEYS = ("redirect_uri", "cookie_secret")
_PROVIDER_KEYS = ("client_id", "client_secret", "server_metadata_url")
_CLAIMS = ("iss", "sub", "email", "email_verified", "name", "preferred_username", "exp")


def shared() -> bool:
    """Whether the dashboard runs in shared mode: ``$ATTN_LAB_SHARED`` is 1/true/yes (0/false/no
    or unset: single-user mode); any other value is refused in one sentence."""
    raw = os.environ.get(ENV_SHARED, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ValueError(f"{ENV_SHARED} must be 1 (shared mode, with a login) or 0 (one user), got {raw!r:.40}")


def admins() -> set[str]:
    """The admins' e-mail addresses (``$ATTN_LAB_ADMINS``, comma-separated), lower case."""
    return {a.strip().lower() for a in os.environ.get(ENV_ADMINS, "").split(",") if a.strip()}


def providers(auth) -> list[str | None]:
    """The login providers of an ``[auth]`` section: None for one set in the section itself,
    else the names of its ``[auth.<name>]`` subsections."""
    named = [k for k, v in auth.items() if hasattr(v, "items")]
    return named or [None]


def auth_missing(secrets) -> str | None:
    """The sentence saying what shared mode lacks to start in ``secrets`` (``st.secrets``), or None."""
    where = "in .streamlit/secrets.toml (docs/dashboard.md, 'Sharing the dashboard')"
    try:
        auth = secrets.get("auth") if secrets is not None else None
    except (FileNotFoundError, OSError, ValueError):  # no secrets file at all, or an unreadable one
        auth = None
    if not hasattr(auth, "items"):
        return f"Shared mode ({ENV_SHARED}=1) needs a login provider: add an [auth] section {where}."
    lacking = [k for k in _SHARED_KEYS if not auth.get(k)]
    for name in providers(auth):
        section = auth if name is None else auth[name]
        lacking += [k if name is None else f"{name}.{k}" for k in _PROVIDER_KEYS if not section.get(k)]
    if lacking:
        return f"Shared mode ({ENV_SHARED}=1) cannot start: the [auth] section lacks {', '.join(lacking)} {where}."
    return None


def claims() -> dict:
    """The logged-in person's identity claims (``st.user``)."""
    return {k: st.user.get(k) for k in _CLAIMS if st.user.get(k) is not None}


def is_admin(who: dict) -> bool:
    """Whether ``who`` (claims) is on the admin list: a verified e-mail address in ``$ATTN_LAB_ADMINS``."""
    email = str(who.get("email") or "").strip().lower()
    return bool(email) and who.get("email_verified") is not False and email in admins()


def _session_store() -> Path:
    """The acting session's store (``attn_core.runs.default_root`` in shared mode)."""
    if get_script_run_ctx(suppress_warning=True) is None:
        raise RunStoreError("no logged-in user acts here: on a shared server every run store belongs to one user")
    root = st.session_state.get(_STORE)
    if root is None:
        raise RunStoreError("log in first: on this shared server every run store belongs to a logged-in user")
    return Path(root)


def gate() -> None:
    """Run first on every page. Single-user mode: nothing. Shared mode: one sentence and a stop
    when no login provider is configured, a login button when nobody (or an expired login) is
    logged in, else who is logged in, a logout and, for admins, a store picker in the sidebar;
    from here on the session's runs, uploads and caches are the person's own."""
    try:
        on = shared()
    except ValueError as e:
        st.error(plain(e))
        st.stop()
    if not on:
        scope_roots(None)
        return
    scope_roots(_session_store)  # before anything can read a store: nobody's until logged in
    missing = auth_missing(st.secrets)
    if missing:
        _forget()
        st.error(missing)
        st.stop()
    if not st.user.is_logged_in or _expired():
        _forget()
        _login_screen(expired=bool(st.user.is_logged_in))
        st.stop()
    who = claims()
    try:
        own = users.open_store(who)
    except (ValueError, OSError) as e:
        _forget()
        st.error(f"Your run store could not be opened: {plain(e)}")
        st.stop()
    st.session_state[USER], st.session_state[ADMIN] = own.name, is_admin(who)
    st.session_state[_STORE] = str(_store_for(who, own))
    with st.sidebar:
        st.caption(f"Logged in as **{plain(users.label_of(who))}**" + (" (admin)" if is_admin(who) else ""))
        st.button("Log out", on_click=st.logout, icon=":material/logout:", key="access_logout")


def _forget() -> None:
    """Nobody acts in this session any more (no login, or no store)."""
    for key in (_STORE, USER, ADMIN):
        st.session_state.pop(key, None)


def _expired() -> bool:
    """Whether the login's ID token has expired (its ``exp`` claim is past): then it is no login."""
    exp = st.user.get("exp")
    try:
        return exp is not None and float(exp) <= time.time()
    except (TypeError, ValueError):
        return True  # a login whose expiry cannot be read is not trusted


def _login_screen(expired: bool) -> None:
    st.title("attn-lab")
    if expired:
        st.warning("Your login has expired: log in again to go on.", icon=":material/lock_clock:")
    else:
        st.info("This dashboard is shared: log in to see your own runs and uploads.", icon=":material/lock:")
    for name in providers(st.secrets["auth"]):
        label = "Log in" if name is None else f"Log in with {name}"
        st.button(label, on_click=st.login, args=() if name is None else (name,), key=f"access_login_{name}")


def _store_for(who: dict, own: Path) -> Path:
    """The store the session acts in: the person's own, or, for an admin, the user's store picked
    in the sidebar."""
    if not is_admin(who):
        return own
    others = {s["id"]: s for s in users.list_stores() if s["path"] != own}
    options = ["", *others]
    if st.session_state.get(_PICKED) not in options:
        st.session_state[_PICKED] = ""
    picked = st.sidebar.selectbox(
        "Run store",
        options,
        key=_PICKED,
        format_func=lambda uid: "My own" if not uid else f"{others[uid]['label']} ({uid[:8]})",
        help="As an admin you may open any user's runs, sweeps and uploads.",
    )
    return others[picked]["path"] if picked else own
