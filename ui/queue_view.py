"""What the Retrain and Sweeps pages show of the server's job queue (attn_core.training.queue):
this session's user's entries that wait or run (each waiting one's place and a range for its
wait, refreshed while any is active), a Cancel for each, and the entries that a server's end
interrupted (they are never run again by themselves). The page also keeps the queue served
(:func:`keep`, ``training.queue_keeper``): entries of a server that is gone are marked or adopted by this one."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from attn_core.runs import RunStoreError
from attn_core.training import queue as Q
from attn_core.training.estimate import range_text
from attn_core.training.queue_keeper import serve
from attn_core.training.slots import ENV_MAX_JOBS
from ui.plots import show_table

USER = "attn_lab_user"  # session key: the signed-in user's id (shared mode); absent: "" (single user)
ADMIN = "attn_lab_admin"  # session key: whether that user is an admin (sees and cancels every entry)
REFRESH_S = 1.0
INTERRUPTED_SHOWN_S = 24 * 3600  # an interrupted entry is said for a day after its server ended


def who() -> tuple[str, bool]:
    """(the acting user, admin) of this session: ("", False) in single-user mode."""
    return str(st.session_state.get(USER, "")), bool(st.session_state.get(ADMIN, False))


def keep() -> Q.JobQueue | None:
    """The server's queue, kept by this process (``queue_keeper.serve``: it can rebuild both kinds
    of job); None when its store cannot be read. app.py calls it on every run, before the login:
    the first starts the keeper, the next cost a lookup (one keeper per process and store; one
    that could not read the store is tried again on the next call)."""
    import attn_core.retraining.job  # noqa: F401 -- registers how a retrain is rebuilt
    import attn_core.sweep.run  # noqa: F401 -- registers how a sweep is rebuilt

    try:
        return serve()
    except (RunStoreError, OSError, ValueError) as e:
        st.warning(f"The job queue cannot be read now: {e}")
        return None
    except Exception as e:  # a broken index: said, the page goes on
        st.warning(f"The job queue cannot be read now: {type(e).__name__}: {e}")
        return None


def _entries(queue: Q.JobQueue, kind: str) -> list[dict]:
    user, admin = who()
    return [e for e in queue.entries(user, admin, active=False) if e["kind"] == kind]


def show(queue: Q.JobQueue | None, kind: str) -> None:
    """The panel of ``kind`` ("retrain" or "sweep") entries, in a fragment refreshed while any is active."""
    if queue is None:
        return
    try:
        active = any(e["status"] in Q.ACTIVE for e in _entries(queue, kind))
    except Exception:
        return
    st.fragment(run_every=REFRESH_S if active else None)(panel)(queue, kind)


def panel(queue: Q.JobQueue, kind: str) -> None:
    user, admin = who()
    try:
        entries = _entries(queue, kind)
    except Exception as e:
        st.warning(f"The job queue cannot be read now: {e}")
        return
    live = [e for e in entries if e["status"] in Q.ACTIVE]
    for e in entries:
        if e["status"] == "interrupted" and time.time() - (e["finished"] or 0) < INTERRUPTED_SHOWN_S:
            what = f"run `{e['target']}`" if e["target"] else f"queue entry {e['id']}"
            again = (
                f"resume it with `attn-lab sweep --resume {e['target']}`"
                if kind == "sweep" and e["target"]
                else "start it again with the same settings (a retrain has no resume)"
            )
            st.warning(
                f"The {kind} {what} was interrupted: the server that ran it ended. It is not run again by "
                f"itself; {again}.",
                icon=":material/warning:",
            )
    if not live:
        return
    st.markdown("**Your jobs in the server's queue**" if not admin else "**Jobs in the server's queue**")
    rows = [
        {
            "entry": e["id"],
            **({"user": e["user"] or "–"} if admin else {}),
            "status": e["status"],
            "device": e["device"],
            "place": e.get("place"),
            "jobs ahead": e.get("ahead") if e["status"] == "waiting" else None,
            "estimated wait": range_text(*e["wait"]) if e.get("wait") else None,
            "run": e["target"],
        }
        for e in live
    ]
    show_table(pd.DataFrame(rows), hide_index=True)
    if any(e["status"] == "waiting" for e in live):
        st.caption(
            "Waiting jobs start by themselves when their turn comes: one user's jobs take turns with everyone "
            f"else's, at most {queue.limit()} at once per device ({ENV_MAX_JOBS}); the wait is a range from "
            "the estimates of the jobs ahead."
        )
    pick_col, go_col = st.columns([3, 1])
    picked = pick_col.selectbox(
        "Entry", [e["id"] for e in live], key=f"queue_pick_{kind}", format_func=lambda i: f"entry {i}"
    )
    if go_col.button(
        "Cancel",
        key=f"queue_cancel_{kind}",
        icon=":material/cancel:",
        help="A waiting job leaves the line and never trains; a running one stops after its current step",
    ):
        try:
            said = queue.cancel(picked, user, admin)
        except (PermissionError, ValueError, KeyError) as e:
            st.error(str(e))
        else:
            st.success(f"Entry {picked}: {'cancelled' if said == 'cancelled' else 'stopping after its current step'}.")
