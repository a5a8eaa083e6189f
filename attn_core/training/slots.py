"""The in-process side of the job queue: the ``$ATTN_LAB_MAX_JOBS`` setting (training jobs at
once per device, default :data:`DEFAULT_MAX_JOBS`), :class:`JobSlots` (a line of one process,
first come first served, that keeps no record: :data:`SLOTS`, where a job started outside the dashboard
waits (a sweep's trial on its Ray worker, a benchmark), one sweep at a time in a process,
:mod:`attn_core.sweep.line`, and tests), and the jobs started in this process
(:func:`running_jobs`), for a new session of the Retrain page to show. The server's durable,
fair queue is :mod:`attn_core.training.queue`."""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from collections.abc import Callable

ENV_MAX_JOBS = "ATTN_LAB_MAX_JOBS"
DEFAULT_MAX_JOBS = 1  # toy models train fastest on one core; the other serves the pages
MAX_JOBS_LIMIT = 64


def max_jobs() -> int:
    """``$ATTN_LAB_MAX_JOBS`` checked (a whole number from 1 to MAX_JOBS_LIMIT), else the default."""
    raw = os.environ.get(ENV_MAX_JOBS, "").strip()
    if not raw:
        return DEFAULT_MAX_JOBS
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_JOBS_LIMIT:
        raise ValueError(
            f"{ENV_MAX_JOBS} must be a whole number from 1 to {MAX_JOBS_LIMIT} (training jobs at once per device), got {raw!r}"
        )
    return n


class JobSlots:
    """A first-come-first-served line of jobs, ``limit()`` of which hold a slot at once (the
    limit is read on every check, so a changed setting applies to the next job)."""

    def __init__(self, limit: Callable[[], int] = max_jobs):
        self.limit = limit
        self._cond = threading.Condition()
        self._holding: set[int] = set()
        self._line: deque[int] = deque()
        self._tickets = itertools.count()

    def ticket(self, **entry) -> int:
        """A place at the end of the line (raises the limit's ValueError if it is mis-set);
        ``entry`` (what the durable queue records of a job) is not kept."""
        self.limit()
        with self._cond:
            t = next(self._tickets)
            self._line.append(t)
            return t

    def ahead(self, ticket: int) -> int:
        """How many jobs must end before ``ticket`` trains (0: it may start now)."""
        with self._cond:
            return self._ahead(ticket)

    def _ahead(self, ticket: int) -> int:
        if ticket in self._holding or ticket not in self._line:
            return 0
        free = self.limit() - len(self._holding)
        place = self._line.index(ticket)
        return 0 if place < free else place - free + 1

    def wait(
        self,
        ticket: int,
        cancelled: Callable[[], bool],
        on_wait: Callable[[int], None] | None = None,
        poll_s: float = 0.2,
    ) -> bool:
        """Block until ``ticket`` holds a slot (True) or ``cancelled()`` (False: it leaves the
        line). ``on_wait(ahead)`` is called whenever the number of jobs ahead changes."""
        shown = None
        with self._cond:
            while True:
                if cancelled():
                    self._leave(ticket)
                    return False
                ahead = self._ahead(ticket)
                if ahead == 0:
                    self._line.remove(ticket)
                    self._holding.add(ticket)
                    return True
                if ahead != shown and on_wait is not None:
                    shown = ahead
                    on_wait(ahead)
                self._cond.wait(poll_s)

    def describe(self, ticket: int) -> str:
        """What a waiting job's status says."""
        return queued_message(self.ahead(ticket))

    def watch(self, ticket: int, stop, done) -> None:
        """A line of one process sets no limit on a running job (the durable queue's does)."""

    def release(self, ticket: int, **outcome) -> None:
        """The job ended (or never started): its slot or place goes to the next in line."""
        with self._cond:
            self._leave(ticket)

    def _leave(self, ticket: int) -> None:
        self._holding.discard(ticket)
        if ticket in self._line:
            self._line.remove(ticket)
        self._cond.notify_all()

    def counts(self) -> tuple[int, int]:
        """(training, waiting) now."""
        with self._cond:
            return len(self._holding), len(self._line)


SLOTS = JobSlots()  # this process's line: where a job started outside the dashboard's queue waits


def queued_message(ahead: int) -> str:
    return f"queued: {ahead} job{'s' if ahead != 1 else ''} ahead (at most {max_jobs()} train at once, {ENV_MAX_JOBS})"


_STARTED: list = []  # the jobs started in this process, oldest first (running_jobs)
_STARTED_LOCK = threading.Lock()


def started(job) -> None:
    """Note a job that ``TrainingJob.start`` started (it is listed until it ends)."""
    with _STARTED_LOCK:
        _STARTED.append(job)


def running_jobs(user: str = "", admin: bool = False) -> list:
    """The jobs started in this process that have not ended, oldest first, of ``user`` (all of
    them for an ``admin``): what a new session of the dashboard's Retrain page shows (a run
    started in another tab, or rebuilt from the queue after a restart)."""
    with _STARTED_LOCK:
        _STARTED[:] = [j for j in _STARTED if not j.snapshot().done]
        return [j for j in _STARTED if admin or getattr(j, "user", "") == user]
