"""How runs are named and where they live: the store's root, run ids, and the run and sweep
statuses (listed here only; see ``attn_core.runs`` and docs/architecture.md)."""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from attn_core.destinations import pid_alive  # noqa: F401  (re-exported: runs of dead processes)
from attn_core.validate import shown

ENV_RUNS = "ATTN_LAB_RUNS"
STATUSES = ("running", "completed", "stopped", "diverged", "failed")
FINAL = STATUSES[1:]
RUN_PREFIX = "run:"  # how a run is named where a model name is expected ("run:20250101-120000-ab12")
SWEEP_STATUSES = ("running", "completed", "interrupted", "failed")  # failed: every trial failed
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class RunStoreError(ValueError):
    """The run store cannot be read or written (a corrupt index, a full or read-only disk): one
    line that names the store and the reason. A ``ValueError``, so the CLI prints it as one line
    and the dashboard's model picker still lists the zoo."""


# A caller that serves several people (the dashboard's shared mode) names each caller's store:
# a function returning it (or raising RunStoreError where no one is acting), set by scope_roots.
_SCOPE: Callable[[], Path] | None = None


def default_root() -> Path:
    """The run store (and uploads) of this user: ``$ATTN_LAB_RUNS`` when set, else
    :func:`user_root`, whatever folder a command or the dashboard runs from. Where a server scopes
    stores by person (:func:`scope_roots`), the acting person's own store instead."""
    return _SCOPE() if _SCOPE is not None else machine_root()


def machine_root() -> Path:
    """The store of this machine's account (``$ATTN_LAB_RUNS``, else :func:`user_root`), whoever
    acts: the CLI's store, and the folder the dashboard's shared mode keeps its users' stores in."""
    return Path(os.environ.get(ENV_RUNS) or user_root()).expanduser()


def scoped() -> bool:
    """Whether stores are scoped by person (:func:`scope_roots`): a shared server."""
    return _SCOPE is not None


def scope_roots(scope: Callable[[], Path] | None) -> None:
    """Make :func:`default_root` (and so every ``RunStore()``, upload and cache folder) call
    ``scope`` for the acting person's store; None undoes it. Set once by a server that serves
    several people (the dashboard's shared mode, ``ui.access``); the CLI never sets it."""
    global _SCOPE
    _SCOPE = scope


def check_root(root: Path) -> Path:
    """``root`` when a run store may be made there (``destinations.check_store``: not in or inside
    a model folder, not inside the shipped assets/), else one :class:`RunStoreError` sentence."""
    from attn_core.destinations import check_store

    try:
        return check_store(root)
    except ValueError as e:
        raise RunStoreError(str(e)) from None


def user_root() -> Path:
    """The platform's per-user data folder for attn-lab, ``runs`` in it (Linux:
    ``$XDG_DATA_HOME/attn-lab/runs``, by default ``~/.local/share/attn-lab/runs``)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("attn-lab", appauthor=False)) / "runs"


def root_origin() -> str:
    """Why the store is where it is, in words (for ``attn-lab runs`` and the Runs page)."""
    if _SCOPE is not None:
        return "your own store on this shared server; no other user can read it"
    if os.environ.get(ENV_RUNS):
        return f"set by ${ENV_RUNS}"
    return f"this user's default; ${ENV_RUNS} chooses another"


def iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def check_run_id(run_id: str) -> str:
    run_id = str(run_id).removeprefix(RUN_PREFIX)
    if not _ID.match(run_id):
        raise ValueError(f"{shown(run_id)} is not a run id (letters, digits, - and _)")
    return run_id


def run_label(run: dict) -> str:
    """A run as a person reads it in a list (the dashboard's pickers): ``run:<id> · <parent> ·
    <regularizers> · <status> · <date>``, from a run record (``RunStore.list_runs``). A parent
    that is a folder is named by its last part; the date is the minute it was created."""
    parent = str(run.get("parent") or "?")
    if "/" in parent or "\\" in parent:
        parent = Path(parent).name or parent
    regs = ", ".join((run.get("config") or {}).get("regularizers") or []) or "no regularizer"
    created = str(run.get("created") or "")[:16]
    parts = [RUN_PREFIX + str(run.get("id")), parent, regs, str(run.get("status") or "?"), created]
    return " · ".join(p for p in parts if p)
