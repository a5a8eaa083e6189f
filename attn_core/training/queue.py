"""The job queue of a dashboard server: every retrain and sweep started from any session waits in
one durable, fair queue, a table of the run store's SQLite index (``queue``,
:mod:`attn_core.runs.db`), before it trains. At most ``$ATTN_LAB_MAX_JOBS`` jobs run at once per
device ("cpu", "cuda:0", ...); the others wait, each told its place and a range for its wait.

API (``user``: the owner's id, "" in single-user mode; ``admin``: may act on every entry)::

    q = JobQueue(root=None)   # the queue in the index of the run store at root (None: the machine's, runs.names.machine_root())
    entry = q.submit(user=, kind=, device=, spec=, steps=None, estimate_s=None, target=None) -> int
        # kind "retrain" or "sweep"; spec: what rebuilds the job, as JSON (never pickle);
        # estimate_s: the job's estimated seconds. Refuses (ValueError, one sentence naming the
        # limit and its setting) over a per-user limit: USER_JOBS (waiting and running), USER_STEPS.
    q.get(entry, user, admin=False) -> dict       # the entry; another user's: PermissionError
    q.entries(user, admin=False, active=True) -> list[dict]   # the user's own (every one for an admin)
    q.cancel(entry, user, admin=False) -> str     # "cancelled" (it left the line, never trains) or
        # "stopping" (it runs: its job stops after the current step); another user's: PermissionError
    q.wait(entry, cancelled, on_wait=None) -> bool   # blocks until the entry is claimed (True)
    q.describe(entry) -> str                      # "queued: 1 job ahead, 2nd in line (...); estimated wait 2-6 min"
    q.watch(entry, stop, done)                    # a running job's guard: wall time, a cancel
    q.release(entry, status=, message=, target=)  # the job ended
    q.check(user, steps=None)                     # what submit would refuse now, refused
    q.reap() / q.adopt()                          # after a restart (see below); queue_keeper.serve(q) does both

Each entry is a dict: id, user, kind, device, target (run or sweep id), status (waiting, running,
then completed, stopped, diverged, failed, cancelled or interrupted), message, steps, estimate_s,
enqueued, started, finished, pid, host, and for a waiting one ``ahead`` (jobs that must end
before it starts) and ``wait`` ((low, high) seconds, None without estimates). A store that
cannot be read or written is one :class:`~attn_core.runs.RunStoreError` sentence.

Order (:func:`fair_order`): the waiting entries of a device go by their owner's turn, the owner's
running jobs on that device plus the entry's rank among the owner's waiting entries, then by
enqueue time: one user's ten jobs do not wait ahead of another's first. Claiming is atomic: one
``UPDATE ... WHERE status = 'waiting'`` in an immediate transaction that first checks the entry's
turn, so two servers on one store never run an entry twice nor more than the limit at once.

After a restart: an entry ``running`` in a process of this host that is gone becomes
``interrupted`` (never run again by itself); a ``waiting`` entry whose process is gone is adopted
by a live server (``queue_keeper.serve``, one atomic UPDATE of its pid), rebuilt from its spec by the
builder registered for its kind (:func:`register`) and runs once when its turn comes."""

from __future__ import annotations

import functools
import json
import os
import socket
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from attn_core.destinations import pid_alive
from attn_core.runs.db import Index, store_error
from attn_core.runs.names import machine_root
from attn_core.training.estimate import load_per_core, run_range
from attn_core.training.queue_rules import (
    ENV_JOB_WALL_S,
    ENV_USER_JOBS,
    ENV_USER_STEPS,
    device_name,
    fair_order,
    job_wall_s,
    user_jobs,
    user_steps,
    waiting_text,
)
from attn_core.training.slots import max_jobs

KINDS = ("retrain", "sweep")
ACTIVE = ("waiting", "running", "stopping")
POLL_S = 0.5  # a waiting job looks at its place, a running job at its limits, this often
BUILDERS: dict[str, Callable] = {}  # kind -> build(queue, entry): a job rebuilt from its spec, started


def register(kind: str, build: Callable) -> None:
    """``build(queue, entry)`` rebuilds a job of ``kind`` from its entry's spec and starts it (it
    then waits for ``entry["id"]``): how a server adopts the waiting entries of a gone one."""
    BUILDERS[kind] = build


def _said(method):
    """A method of the queue whose SQLite errors become the store's one sentence (RunStoreError)."""

    @functools.wraps(method)
    def said(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as e:
            raise store_error(self.root, e, write=True) from None

    return said


def _gone(row) -> bool:
    """Whether the process an entry belongs to is known to be gone (this host's, not alive)."""
    return row["host"] == socket.gethostname() and not pid_alive(row["pid"])


class JobQueue:
    """The durable queue in the index of the run store at ``root`` (see the module)."""

    def __init__(self, root: str | Path | None = None, limit: Callable[[], int] = max_jobs):
        self.root = Path(root).expanduser() if root is not None else machine_root()
        self.index = Index(self.root)
        self.limit = limit
        self._live: dict[int, Callable[[str], None]] = {}  # entry -> stop(reason) of the jobs run here

    # --- plumbing ---------------------------------------------------------------------------
    def _con(self):
        return self.index.writer()

    def _rows(self, con, where: str = "1", args: tuple = ()) -> list[dict]:
        return [dict(r) for r in con.execute(f"SELECT * FROM queue WHERE {where} ORDER BY id", args)]

    def _places(self, con, device: str) -> dict[int, dict]:
        """id -> {ahead, wait} of the waiting entries of ``device`` whose process is alive."""
        running = self._rows(con, "status IN ('running', 'stopping') AND device = ?", (device,))
        running = [r for r in running if not _gone(r)]
        waiting = [r for r in self._rows(con, "status = 'waiting' AND device = ?", (device,)) if not _gone(r)]
        limit = self.limit()
        now = time.time()
        work: float | None = 0.0  # seconds of work ahead, the running jobs' left
        for r in running:
            if r["estimate_s"] is None or work is None:
                work = None
            else:
                work += max(0.0, r["estimate_s"] - (now - (r["started"] or now)))
        places = {}
        free = max(0, limit - len(running))
        for i, e in enumerate(fair_order(waiting, Counter(r["user"] for r in running))):
            ahead = 0 if i < free else i - free + 1
            wait = None if work is None or not ahead else run_range(work / limit, load_per_core())
            places[e["id"]] = {"place": i + 1, "ahead": ahead, "wait": wait}
            work = None if work is None or e["estimate_s"] is None else work + e["estimate_s"]
        return places

    def _immediate(self, con) -> None:
        if con.in_transaction:
            con.commit()
        con.execute("BEGIN IMMEDIATE")

    # --- submitting -------------------------------------------------------------------------
    def submit(
        self,
        *,
        user: str,
        kind: str,
        device: str,
        spec: dict,
        steps: int | None = None,
        estimate_s: float | None = None,
        target: str | None = None,
    ) -> int:
        """A new waiting entry (owned by this process until it ends); refused, with one sentence,
        over a per-user limit (see the module)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not isinstance(user, str):
            raise TypeError(f"user must be a string (the owner's id, '' in single-user mode), got {user!r}")
        payload = json.dumps(spec)  # JSON only: a spec that is not refuses here
        con = self._con()
        self._immediate(con)
        try:
            self._check(con, user, steps)
            cur = con.execute(
                "INSERT INTO queue (user, kind, device, target, spec, steps, estimate_s, status, enqueued, pid, host) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'waiting', ?, ?, ?)",
                (
                    user,
                    kind,
                    device_name(device),
                    target,
                    payload,
                    steps,
                    estimate_s,
                    time.time(),
                    os.getpid(),
                    socket.gethostname(),
                ),
            )
            con.commit()
            return int(cur.lastrowid)
        except BaseException:
            con.rollback()
            raise

    def check(self, user: str, steps: int | None = None) -> None:
        """Refuse (ValueError, one sentence naming the limit and its setting) what :meth:`submit`
        would refuse now for ``user``: a page checks before it records anything."""
        con = self._con()
        with con:
            self._check(con, user, steps)

    def _check(self, con, user: str, steps: int | None) -> None:
        self.limit()  # a mis-set ATTN_LAB_MAX_JOBS refuses here
        most_steps, most_jobs = user_steps(), user_jobs()
        if steps is not None and most_steps is not None and steps > most_steps:
            raise ValueError(f"steps {steps:,} is over the limit of {most_steps:,} steps per job ({ENV_USER_STEPS})")
        active = "status IN ('waiting', 'running', 'stopping')"
        mine = con.execute(f"SELECT count(*) FROM queue WHERE user = ? AND {active}", (user,)).fetchone()[0]
        if mine >= most_jobs:
            raise ValueError(
                f"you already have {mine} jobs waiting or running, the most one user may have at once "
                f"({ENV_USER_JOBS}={most_jobs}); cancel one or wait for one to end"
            )

    def ticket(self, **entry) -> int:
        """:meth:`submit` under the name a job's line of one process (``slots.JobSlots``) gives it."""
        return self.submit(**entry)

    # --- reading ----------------------------------------------------------------------------
    def _entry(self, con, entry: int) -> dict:
        rows = self._rows(con, "id = ?", (int(entry),))
        if not rows:
            raise KeyError(f"there is no queue entry {entry}")
        row = rows[0]
        if row["status"] == "waiting":
            row.update(self._places(con, row["device"]).get(row["id"], {"place": None, "ahead": None, "wait": None}))
        return row

    def _check_owner(self, row: dict, user: str, admin: bool) -> None:
        if not admin and row["user"] != user:
            raise PermissionError(
                f"queue entry {row['id']} belongs to another user; only its owner or an admin may act on it"
            )

    def get(self, entry: int, user: str, admin: bool = False) -> dict:
        """The entry (with its place while it waits); another user's is refused unless ``admin``."""
        con = self._con()
        with con:
            row = self._entry(con, entry)
        self._check_owner(row, user, admin)
        return row

    def entries(self, user: str, admin: bool = False, active: bool = True) -> list[dict]:
        """The user's entries (every user's for an ``admin``), waiting ones first in their order,
        then running ones; with ``active=False`` the ended ones too, newest last."""
        con = self._con()
        with con:
            rows = self._rows(con, "status IN ('waiting', 'running', 'stopping')" if active else "1")
            places = {}
            for device in {r["device"] for r in rows if r["status"] == "waiting"}:
                places.update(self._places(con, device))
        out = []
        for r in rows:
            if admin or r["user"] == user:
                r.update(places.get(r["id"], {}))
                out.append(r)
        # waiting first, in their order on their device; then running; then ended, oldest first
        first = {"waiting": 0, "running": 1, "stopping": 1}
        return sorted(out, key=lambda r: (first.get(r["status"], 2), r["device"], r.get("place") or 0, r["id"]))

    def ahead(self, entry: int) -> int:
        """How many jobs must end before a waiting entry starts (0: it may start now, or it is not waiting)."""
        con = self._con()
        with con:
            return self._entry(con, entry).get("ahead") or 0

    def describe(self, entry: int) -> str:
        """What a waiting entry's job says: its place, the jobs ahead and a range for its wait."""
        con = self._con()
        with con:
            row = self._entry(con, entry)
        if row["status"] != "waiting" or row["ahead"] is None:
            return f"queued ({row['status']})"
        return waiting_text(row["place"], row["ahead"], row["wait"], self.limit())

    # --- running ----------------------------------------------------------------------------
    def claim(self, entry: int) -> bool:
        """Mark the entry running in this process if it is its turn (atomic: True for one caller only)."""
        con = self._con()
        self._immediate(con)
        try:
            row = self._rows(con, "id = ? AND status = 'waiting'", (int(entry),))
            if not row or self._places(con, row[0]["device"]).get(int(entry), {}).get("ahead") != 0:
                con.rollback()
                return False
            cur = con.execute(
                "UPDATE queue SET status = 'running', started = ?, pid = ?, host = ? WHERE id = ? AND status = 'waiting'",
                (time.time(), os.getpid(), socket.gethostname(), int(entry)),
            )
            con.commit()
            return cur.rowcount == 1
        except BaseException:
            con.rollback()
            raise

    def wait(
        self, entry: int, cancelled: Callable[[], bool], on_wait: Callable[[int], None] | None = None, poll_s=POLL_S
    ) -> bool:
        """Block until the entry is claimed here (True), or it is cancelled (``cancelled()`` or
        :meth:`cancel`: False, it leaves the line). ``on_wait(ahead)`` when its place changes."""
        shown = None
        while True:
            if cancelled():
                self._end(entry, "cancelled", "cancelled while it waited; nothing was trained", ("waiting",))
                return False
            self.adopt()
            if self.claim(entry):
                return True
            con = self._con()
            with con:
                row = self._entry(con, entry)
            if row["status"] != "waiting":
                return False  # cancelled by its owner or an admin (or taken by another server)
            if on_wait is not None and (row["ahead"], row["wait"] and tuple(round(w) for w in row["wait"])) != shown:
                shown = (row["ahead"], row["wait"] and tuple(round(w) for w in row["wait"]))
                on_wait(row["ahead"])
            time.sleep(poll_s)

    def watch(self, entry: int, stop: Callable[[str], None], done: Callable[[], bool]) -> None:
        """Guard a claimed entry's job in a thread until ``done()``: ``stop(reason)`` once its wall
        time passes ``$ATTN_LAB_JOB_WALL_S`` or a cancel is asked for (from any process)."""
        self._live[int(entry)] = stop
        wall, t0 = job_wall_s(), time.monotonic()

        def guard() -> None:
            try:
                while not done():
                    if wall is not None and time.monotonic() - t0 > wall:
                        return stop(f"the wall time limit of {wall:,} s per job was reached, {ENV_JOB_WALL_S}")
                    try:
                        con = self._con()
                        with con:
                            asked = "SELECT message FROM queue WHERE id = ? AND status = 'stopping'"
                            row = con.execute(asked, (entry,)).fetchone()
                    except sqlite3.Error:  # the store is busy or unreadable now: asked again next time
                        row = None
                    if row is not None:
                        return stop(row[0] or "cancelled")
                    time.sleep(POLL_S)
            finally:
                self._live.pop(int(entry), None)

        threading.Thread(target=guard, name=f"attn-lab queue guard {entry}", daemon=True).start()

    def release(self, entry: int, status: str = "completed", message: str = "", target: str | None = None) -> None:
        """The entry's job ended with ``status``: it leaves the queue (a waiting one too)."""
        self._end(entry, status, message, ("waiting", "running", "stopping"), target)

    def _end(self, entry, status, message, were, target=None) -> bool:
        con = self._con()
        with con:
            marks = ",".join("?" * len(were))
            cur = con.execute(
                f"UPDATE queue SET status = ?, message = ?, finished = ?, target = coalesce(?, target) "
                f"WHERE id = ? AND status IN ({marks})",
                (status, message, time.time(), target, int(entry), *were),
            )
            return cur.rowcount == 1

    def cancel(self, entry: int, user: str, admin: bool = False) -> str:
        """Cancel the entry: a waiting one leaves the line at once ("cancelled"); a running one's
        job is stopped after its current step ("stopping"). Another user's is refused unless ``admin``."""
        row = self.get(entry, user, admin)
        who = "cancelled by an admin" if admin and row["user"] != user else "cancelled by its owner"
        if row["status"] == "waiting" and self._end(entry, "cancelled", f"{who} while it waited", ("waiting",)):
            return "cancelled"
        con = self._con()
        with con:
            cur = con.execute(
                "UPDATE queue SET status = 'stopping', message = ? WHERE id = ? AND status = 'running'",
                (who, int(entry)),
            )
        if cur.rowcount == 1 or row["status"] == "stopping":
            stop = self._live.get(int(entry))
            if stop is not None:
                stop(who)
            return "stopping"
        raise ValueError(f"queue entry {entry} has already ended ({self.get(entry, user, admin)['status']})")

    # --- after a restart --------------------------------------------------------------------
    def reap(self) -> list[int]:
        """Entries that ran in a process of this host that is gone become ``interrupted``."""
        con = self._con()
        with con:
            gone = [r["id"] for r in self._rows(con, "status IN ('running', 'stopping')") if _gone(r)]
        msg = "interrupted: the server process that ran it ended; it is not run again by itself"
        return [e for e in gone if self._end(e, "interrupted", msg, ("running", "stopping"))]

    def adopt(self) -> list:
        """Waiting entries of gone processes of this host, of a kind this process can build
        (:func:`register`): each taken by one atomic UPDATE, rebuilt and started here."""
        con = self._con()
        with con:
            orphans = [r for r in self._rows(con, "status = 'waiting'") if r["kind"] in BUILDERS and _gone(r)]
        jobs = []
        for r in orphans:
            with con:
                cur = con.execute(
                    "UPDATE queue SET pid = ?, host = ? WHERE id = ? AND status = 'waiting' AND pid = ? AND host = ?",
                    (os.getpid(), socket.gethostname(), r["id"], r["pid"], r["host"]),
                )
            if cur.rowcount != 1:
                continue  # another server took it
            r["spec"] = json.loads(r["spec"])
            try:
                jobs.append(BUILDERS[r["kind"]](self, r))
            except Exception as e:  # its model or store is gone: it ends failed, saying why
                self.release(r["id"], "failed", f"could not be rebuilt after a restart: {e}")
        return jobs


for _name in ("submit", "check", "get", "entries", "ahead", "describe", "claim", "_end", "cancel", "reap", "adopt"):
    setattr(JobQueue, _name, _said(getattr(JobQueue, _name)))
