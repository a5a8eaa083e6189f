"""The run stores of a server shared by several people (the dashboard's shared mode).

Each person's store is ``<machine store>/users/<id>/``, the same layout as any run store (index,
runs, sweeps, uploads, token caches). ``<id>`` is a hash of who the login says they are (the
issuer and subject of their OpenID Connect login, else their e-mail address), never text they
typed, so no claim can name a path. An ``owner.json`` in the folder says whose it is (for the
admins' store picker); nothing else reads it."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from attn_core.runs.names import machine_root
from attn_core.untrusted import parse_json

USERS = "users"  # the folder of the users' stores, under the machine's store
OWNER = "owner.json"
_ID = re.compile(r"^[0-9a-f]{32}$")


def user_id(claims: Mapping) -> str:
    """The folder name of the person a login's ``claims`` name: a hash of issuer and subject
    (``iss``, ``sub``), else of the e-mail address (lower case); a ValueError if they name no one."""
    iss, sub, email = (str(claims.get(k) or "").strip() for k in ("iss", "sub", "email"))
    if iss and sub:
        key = f"oidc\0{iss}\0{sub}"
    elif email:
        key = f"email\0{email.lower()}"
    else:
        raise ValueError(
            "the login names no user: its claims have neither an issuer and subject (iss, sub) nor an email"
        )
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def users_root(base: Path | None = None) -> Path:
    """Where the users' stores are: ``<base>/users``, base being the machine's store."""
    return Path(base if base is not None else machine_root()) / USERS


def store_of(uid: str, base: Path | None = None) -> Path:
    """The store folder of user ``uid`` (a :func:`user_id`; anything else is refused in one sentence)."""
    if not isinstance(uid, str) or not _ID.match(uid):
        raise ValueError(f"user id must be 32 lower-case hex digits (a hash of a login), got {uid!r:.80}")
    return users_root(base) / uid


def label_of(claims: Mapping) -> str:
    """How a person is named to the admins: e-mail, else name, else subject."""
    for key in ("email", "name", "preferred_username", "sub"):
        if str(claims.get(key) or "").strip():
            return str(claims[key]).strip()[:200]
    return "unknown"


def open_store(claims: Mapping, base: Path | None = None) -> Path:
    """The store folder of the person ``claims`` name, made (owner-only) on first use, with its
    ``owner.json`` kept up to date; returns the folder."""
    folder = store_of(user_id(claims), base)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    owner = {"label": label_of(claims)}
    path = folder / OWNER
    if _owner(folder) != owner:
        tmp = folder / f".{OWNER}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(owner))
        tmp.replace(path)
    return folder


def _owner(folder: Path) -> dict | None:
    try:
        data = parse_json((folder / OWNER).read_bytes(), OWNER)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def list_stores(base: Path | None = None) -> list[dict]:
    """Every user's store: ``{"id", "label", "path"}``, by label (for the admins' store picker).
    Folders that are not a user's store (another name, a link) are left out."""
    root = users_root(base)
    try:
        entries = sorted(root.iterdir()) if root.is_dir() else []
    except OSError:
        return []
    stores = []
    for p in entries:
        if _ID.match(p.name) and p.is_dir() and not p.is_symlink():
            label = str((_owner(p) or {}).get("label") or "unknown")[:200]
            stores.append({"id": p.name, "label": label, "path": p})
    return sorted(stores, key=lambda s: (s["label"].lower(), s["id"]))
