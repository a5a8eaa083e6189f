"""A parent-death watchdog for the Ray a sweep starts: when the driver dies, even by ``kill -9``,
the processes it started (Ray's GCS, raylet, dashboard, log monitor and the agents and workers
the raylet starts) are ended, instead of living on for a minute or more (Ray's DashboardAgent and
RuntimeEnvAgent wait about 75 s for a GCS that is gone before they exit).

:func:`start` runs this file as a separate small process (standard library only, in its own
session so that a terminal's Ctrl-C does not reach it) with a pipe from the driver. While the
driver lives, the watchdog notes the driver's descendants (pid and start time, from ``/proc``)
every :data:`POLL_S` seconds; when the pipe closes (the driver exited or was killed) it waits
:data:`GRACE_S` for an orderly ``ray.shutdown`` to finish, then kills, by pid, each noted process
that still runs and is still the same process (same start time). Linux only (``/proc``); where
there is none, :func:`start` returns None and Ray's own clean-up is all there is.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 2.0
DONE = b"done"  # what the driver writes after ray.shutdown


def start() -> subprocess.Popen | None:
    """Start the watchdog of this process (None where ``/proc`` is missing); :func:`stop` ends it."""
    if not os.path.isdir(f"/proc/{os.getpid()}"):
        return None
    return subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a terminal's Ctrl-C goes to the driver only
        close_fds=True,
    )


def stop(proc: subprocess.Popen | None) -> None:
    """After ``ray.shutdown``: tell the watchdog so (it ends at once, and with it anything noted
    that still runs, which should be nothing) and reap it."""
    if proc is None:
        return
    try:
        proc.stdin.write(DONE)
        proc.stdin.close()
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return None if fields[0] == "Z" else fields[19]


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids of every process on this machine."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                text = f.read().decode(errors="replace")
            ppid = int(text[text.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> dict[int, str]:
    """{pid: start time} of every living descendant of ``pid``."""
    tree, out, todo = _children(), {}, [pid]
    while todo:
        for child in tree.get(todo.pop(), ()):
            started = _start_time(child)
            if started is not None and child not in out:
                out[child] = started
                todo.append(child)
    return out


def watch(driver: int, pipe: int) -> None:
    """Note the driver's descendants until ``pipe`` closes, then end those still running."""
    me = os.getpid()
    noted: dict[int, str] = {}
    while True:
        ready, _, _ = select.select([pipe], [], [], POLL_S)
        data = os.read(pipe, 4096) if ready else b"-"
        if not data or data.endswith(DONE):
            break
        noted.update({p: t for p, t in descendants(driver).items() if p != me})
    if not data.endswith(DONE):
        time.sleep(GRACE_S)  # the driver died: give a shutdown under way the time to end them itself
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p, t in noted.items() if _start_time(p) == t]
        for pid in alive:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if not alive:
            return
        time.sleep(1.0)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]), sys.stdin.fileno())
