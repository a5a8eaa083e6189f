"""Widget state that survives page switches and URL parameters, and the widget keys every page
shares (the model picker's, the layer/head picker's)."""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Any

import streamlit as st

from ui.markup import plain

MODEL_KEY = "model_choice"  # the picker's widget key; kept across pages like every remembered key
LAYER_KEY, HEAD_KEY = "layer", "head"  # the layer/head picker's widget keys, shared by every page
ALL_HEADS = "all"  # the head picker's extra choice on pages that can draw every head of a layer
_KEPT = "_kept_keys"  # session key: widget keys whose values survive page switches
_PAGE = "_kept_page"  # session key: the page of the last run (its title)
_URL_WARNED = "_url_warned"


def keep_widget_state(page: str) -> None:
    # Streamlit forgets the value of a widget that is not drawn on the current page; writing the
    # value back as plain session state keeps it for when the user returns (Streamlit's own
    # recipe). Only on a page switch: a value written back is also sent to the browser at the end
    # of the run, over any press made meanwhile, so writing on every rerun lost quick arrow
    # presses on a slider (tests/e2e/test_state_browser.py).
    if st.session_state.get(_PAGE) == page:
        return
    st.session_state[_PAGE] = page
    for key in st.session_state.get(_KEPT, ()):
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def remember(key: str, default: Any, valid: Collection | None = None, param: str | None = None) -> str:
    """Make ``key`` a widget key whose value survives page switches; returns ``key``.

    The first time (per session) the value comes from the URL parameter ``param`` when it is
    one of ``valid`` (else a warning says what was ignored), otherwise ``default``; a remembered
    value that is no longer valid (another model has fewer heads, say) goes back to ``default``.
    Give the widget no ``value``/``index`` of its own: the session state holds it."""
    st.session_state.setdefault(_KEPT, set()).add(key)
    if key not in st.session_state:
        st.session_state[key] = _from_url(param, default, valid) if param else default
    elif valid is not None and st.session_state[key] not in valid:
        st.session_state[key] = default
    return key


def _from_url(param: str, default: Any, valid: Collection | None) -> Any:
    raw = st.query_params.get(param)
    if raw is None:
        return default
    if valid is None or isinstance(valid, range):  # a number: parse it, then check the range
        try:
            value = type(default)(raw)
            if valid is None or value in valid:
                return value
        except (TypeError, ValueError):
            pass
        allowed = f"{valid.start}..{valid.stop - 1}" if valid is not None else f"a {type(default).__name__}"
    else:
        found = [v for v in valid if str(v) == raw]
        if found:
            return found[0]
        allowed = ", ".join(map(str, list(valid)[:12]))
    warned = st.session_state.setdefault(_URL_WARNED, set())
    if (param, raw) not in warned:
        warned.add((param, raw))
        st.warning(
            f"URL parameter {param}={plain(repr(raw), 80)} is not valid (allowed: {plain(allowed)}); "
            f"using {plain(repr(default))} instead."
        )
    return default


def to_url(**params: Any) -> None:
    """Write the current choices into the URL, so a copied link opens the same view; a parameter
    given as None is removed (a choice that does not apply to this view, e.g. ``length`` of a
    typed input). Only changed parameters are written: each write is a browser history step."""
    for name, value in params.items():
        if value is None:
            if name in st.query_params:
                del st.query_params[name]
        elif st.query_params.get(name) != str(value):
            st.query_params[name] = str(value)


_INPUTS = "_inputs_seen"


def follow_input(key: str, current: Any, value: Any) -> None:
    """Set the remembered widget ``key`` to ``value`` when ``current`` (what the page's input is
    made of: model, source, tokens) differs from the last run's, so that a new input resets a
    choice that belongs to it (the Heatmaps query moves to the new last token). A page switch, a
    head change or the first run (a URL's choice) leave it alone."""
    digest = hashlib.sha256(repr(current).encode()).hexdigest()
    seen = st.session_state.setdefault(_INPUTS, {})
    if seen.get(key) not in (None, digest):
        st.session_state[key] = value
    seen[key] = digest
