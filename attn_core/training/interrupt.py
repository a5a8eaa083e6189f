"""Ctrl-C as a stop request: while a command trains, SIGINT asks the step loop to stop between two
steps (the run then ends ``stopped`` and is saved with the weights trained so far) instead of
raising ``KeyboardInterrupt`` wherever the main thread happens to be.

Why not let ``KeyboardInterrupt`` fly: raised inside ``Thread.join`` (Python 3.11), it can mark a
worker thread as finished while it still trains (bpo-45274's clean-up releases the worker's own
lock), so the command printed a half-run and the interpreter shut down under a thread that was
inside libtorch: "terminate called without an active exception", SIGABRT, nothing saved. Raised
inside a step in the main thread, it skipped the code that saves the run."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SIGINT_EXIT = 130  # the shell's status for a command ended by Ctrl-C (128 + SIGINT)


class StopRequest:
    """A thread-safe flag set by Ctrl-C (or anyone); ``message()`` is the stop message a step
    loop's ``interrupt`` returns (``attn_core.training.record.record_run``), None while unset."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._then: list[Callable[[], None]] = []
        self.signals = 0  # how many SIGINTs arrived

    def set(self) -> None:
        self._event.set()
        for stop in list(self._then):
            stop()

    def then(self, stop: Callable[[], None]) -> None:
        """Call ``stop()`` (a job's ``stop``) on the request; at once if it was already made."""
        self._then.append(stop)
        if self.is_set():
            stop()

    def is_set(self) -> bool:
        return self._event.is_set()

    def message(self) -> str | None:
        return "stopped by Ctrl-C" if self._event.is_set() else None


@contextmanager
def sigint_stops(notice: Callable[[str], None] | None = None, exiting: bool = False) -> Iterator[StopRequest]:
    """Inside the block, SIGINT sets the yielded :class:`StopRequest` (which calls what was
    registered with ``then``); ``notice`` gets a one-line message (default: stderr) the first
    time. The previous handler is restored on exit, except with ``exiting`` (a command that
    ends after the block) once Ctrl-C was pressed: further presses are then ignored, so they
    cannot cut the interpreter's clean-up short. Outside the main thread (where Python delivers
    no signal) it only yields the request."""
    request = StopRequest()
    say = notice or (lambda text: print(text, file=sys.stderr, flush=True))
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield request  # no signal here, or SIGINT ignored on purpose (nohup, a background job)
        return

    def on_sigint(signum, frame) -> None:
        request.signals += 1
        request.set()
        if request.signals == 1:
            say("\nCtrl-C: stopping after the current step and saving what was trained so far")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield request
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN if exiting and request.is_set() else previous)


@contextmanager
def exit_on_ctrl_c(note: str) -> Iterator[None]:
    """For a command whose work cannot stop half-way (training a preset, growing a head): Ctrl-C
    ends it with one line on stderr (``note``: what was kept) and the status 130, no traceback.
    A save under way cleans up after itself (``checkpoint.save`` writes to a temporary folder)."""
    try:
        yield
    except KeyboardInterrupt:
        print(f"\ninterrupted by Ctrl-C; {note}", file=sys.stderr, flush=True)
        raise SystemExit(SIGINT_EXIT) from None
