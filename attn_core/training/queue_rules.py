"""The rules of the job queue (:mod:`attn_core.training.queue`) that need no store: the per-user
limits (settings read from the environment, like ``$ATTN_LAB_MAX_JOBS``), the fair order of the
waiting entries of a device, and what a waiting job is told."""

from __future__ import annotations

import os
from collections import Counter

from attn_core.training.estimate import range_text
from attn_core.training.slots import ENV_MAX_JOBS

ENV_USER_JOBS = "ATTN_LAB_USER_JOBS"  # jobs one user may have waiting or running at once
ENV_USER_STEPS = "ATTN_LAB_USER_STEPS"  # steps one job may ask for
ENV_JOB_WALL_S = "ATTN_LAB_JOB_WALL_S"  # seconds one job may run before it is stopped
DEFAULT_USER_JOBS = 10


def _limit(name: str, default: int | None, hi: int) -> int | None:
    """``$name`` checked (a whole number from 1 to ``hi``), else ``default`` (None: no limit)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= hi:
        raise ValueError(f"{name} must be a whole number from 1 to {hi:,}, got {raw!r}")
    return n


def user_jobs() -> int:
    return _limit(ENV_USER_JOBS, DEFAULT_USER_JOBS, 10_000)


def user_steps() -> int | None:
    return _limit(ENV_USER_STEPS, None, 10**9)


def job_wall_s() -> int | None:
    return _limit(ENV_JOB_WALL_S, None, 10**8)


def fair_order(waiting: list[dict], running: Counter | dict) -> list[dict]:
    """The waiting entries (of one device) in the order they start: by their owner's turn, the
    owner's running jobs (``running[user]``) plus the entry's rank among the owner's waiting
    entries (enqueue order), then by enqueue time and id."""
    rank: dict[int, int] = {}
    seen: Counter = Counter()
    for e in sorted(waiting, key=lambda e: (e["enqueued"], e["id"])):
        rank[e["id"]] = seen[e["user"]]
        seen[e["user"]] += 1
    return sorted(waiting, key=lambda e: (running.get(e["user"], 0) + rank[e["id"]], e["enqueued"], e["id"]))


def device_name(device) -> str:
    """ "cpu", "cuda:0", ...: "cuda" is the first GPU."""
    name = str(device)
    return "cuda:0" if name == "cuda" else name


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def waiting_text(place: int, ahead: int, wait: tuple[float, float] | None, limit: int) -> str:
    """``queued: 1 job ahead, 2nd in line (at most 1 at once on this device, ATTN_LAB_MAX_JOBS); wait about 2-6 min``."""
    jobs = f"{ahead} job{'s' if ahead != 1 else ''} ahead"
    text = f"queued: {jobs}, {_ordinal(place)} in line (at most {limit} at once on this device, {ENV_MAX_JOBS})"
    if wait is not None:
        text += f"; estimated wait {range_text(*wait)} (a range, from the estimates of the jobs ahead)"
    return text
