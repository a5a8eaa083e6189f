"""A parent-death watchdog for the Ray a sweep starts: when the driver dies, even by ``kill -9``,
the processes it started (Ray's GCS, raylet, dashboard, log monitor and the agents and workers
the raylet starts) are ended, instead of living on for a minute or more (Ray's DashboardAgent and
RuntimeEnvAgent wait about 75 s for a GCS that is gone before they exit).

:func:`start` runs this file as a separate small process (standard library only, in its own
session so that a terminal's Ctrl-C does not reach it) with a pipe from the driver. While the
driver lives, the watchdog notes *Ray's* processes among the driver's descendants (pid and start
time, from ``/proc``) every :data:`POLL_S` seconds: the driver's children that run Ray's code (a
program or script inside Ray's package folder) and everything below them (the workers and
agents). Nothing else is noted: the driver may be a long-lived process (the dashboard's
server runs sweeps in a thread) whose other children (a live training job's worker, kaleido's
browser) are none of the watchdog's business. When the pipe closes (the driver exited or was
killed) it waits :data:`GRACE_S` for an orderly ``ray.shutdown`` to finish, then kills, by pid,
each noted process that still runs and is still the same process (same start time). Linux only
(``/proc``); where there is none, :func:`start` returns None and Ray's own clean-up is all there is.
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


def start(ray_dir: str) -> subprocess.Popen | None:
    """Start the watchdog of the Ray this process is about to start (``ray_dir``: Ray's package
    folder, ``os.path.dirname(ray.__file__)``); None where ``/proc`` is missing. :func:`stop` ends it."""
    if not os.path.isdir(f"/proc/{os.getpid()}"):
        return None
    return subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), os.path.abspath(ray_dir)],
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


def descendants(pid: int, tree: dict[int, list[int]] | None = None) -> dict[int, str]:
    """{pid: start time} of every living descendant of ``pid`` (``tree``: :func:`_children`, read
    now when not given)."""
    tree, out, todo = tree if tree is not None else _children(), {}, [pid]
    while todo:
        for child in tree.get(todo.pop(), ()):
            started = _start_time(child)
            if started is not None and child not in out:
                out[child] = started
                todo.append(child)
    return out


def _args(pid: int) -> list[str]:
    """The program (``/proc/<pid>/exe``) and command line of a process ([] when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []
    try:
        return [os.readlink(f"/proc/{pid}/exe"), *args]
    except OSError:
        return args


def is_ray(pid: int, ray_dir: str) -> bool:
    """Whether a process runs Ray's code: its program or an argument lies in Ray's package folder
    ``ray_dir`` (gcs_server, raylet, dashboard.py, log_monitor.py, the autoscaler's monitor.py:
    what ``ray.init`` starts; the workers and agents are the raylet's children)."""
    prefix = os.path.join(os.path.abspath(ray_dir), "")
    return any(a.startswith(prefix) for a in _args(pid))


def ray_processes(driver: int, ray_dir: str) -> dict[int, str]:
    """{pid: start time} of the Ray processes the driver started: its children that run Ray's
    code (:func:`is_ray`) and every living descendant of those. Any other child of the driver,
    and what runs below it, is left out."""
    tree = _children()
    out: dict[int, str] = {}
    for child in tree.get(driver, ()):
        started = _start_time(child)
        if started is not None and is_ray(child, ray_dir):
            out[child] = started
            out.update(descendants(child, tree))
    return out


def watch(driver: int, pipe: int, ray_dir: str) -> None:
    """Note the driver's Ray processes until ``pipe`` closes, then end those still running."""
    me = os.getpid()
    noted: dict[int, str] = {}
    while True:
        ready, _, _ = select.select([pipe], [], [], POLL_S)
        data = os.read(pipe, 4096) if ready else b"-"
        if data:  # the driver lives (after DONE too: what is left of its Ray is noted once more)
            noted.update({p: t for p, t in ray_processes(driver, ray_dir).items() if p != me})
        if not data or data.endswith(DONE):
            break
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
    watch(int(sys.argv[1]), sys.stdin.fileno(), sys.argv[2])
