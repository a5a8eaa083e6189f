"""Ctrl-C (SIGINT), SIGTERM and SIGHUP: a stop request while a command trains, one line and the
shell's status (128 + the signal) everywhere else.

While a command trains (:func:`sigint_stops`), the three signals ask the step loop to stop between
two steps (the run then ends ``stopped`` and is saved with the weights trained so far) instead of
raising ``KeyboardInterrupt`` wherever the main thread happens to be. A ``kill`` (SIGTERM) or a
closed terminal (SIGHUP) saves as Ctrl-C does. Why not let ``KeyboardInterrupt`` fly: raised
inside ``Thread.join`` (Python 3.11), it can mark a worker thread as finished while it still
trains (bpo-45274's clean-up releases the worker's own lock), so the command printed a half-run
and the interpreter shut down under a thread that was inside libtorch: "terminate called without
an active exception", SIGABRT, nothing saved. Raised inside a step in the main thread, it skipped
the code that saves the run.

The CLI process as a whole (:class:`CliSignals`, installed by ``attn_core.__main__`` before any
other module loads): during start-up (modules loading, options parsed) a signal ends the process
at once with ``interrupted`` (there is nothing to save, and a ``KeyboardInterrupt`` inside an
import leaves half-initialised modules that fail later: "module 'numpy' has no attribute
'intp'"); while a command runs, a signal no command handles raises ``KeyboardInterrupt`` (clean-up
runs), and a process that has not ended :data:`GRACE_S` seconds later (a library that swallowed
it, or waits for ever) ends then; a second signal, or one while the process exits, ends it at
once. The status a signal decided is the process's to the end: its last exit handler exits with it
(:meth:`CliSignals._final`), so the interpreter's own end cannot turn it into a death by SIGINT
(-2: a ``KeyboardInterrupt`` it saw leave code a C extension ran) or an abort (-6)."""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SIGINT_EXIT = 130  # the shell's status for a command ended by Ctrl-C (128 + SIGINT)
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
GRACE_S = 5.0  # seconds a command has to end after a signal it does not handle


def exit_code(signum: int | None) -> int:
    """The shell's status for a process ended by ``signum`` (130 for Ctrl-C)."""
    return 128 + int(signum or signal.SIGINT)


def said(signum: int | None) -> str:
    """``Ctrl-C``, ``SIGTERM``, ``SIGHUP``: how a stop is named in messages."""
    if signum is None or signum == signal.SIGINT:
        return "Ctrl-C"
    return signal.Signals(signum).name


class StopRequest:
    """A thread-safe flag set by a stop signal (or anyone); ``message()`` is the stop message a
    step loop's ``interrupt`` returns (``attn_core.training.record.record_run``), None while
    unset; ``signum`` the first signal, ``code`` the exit status it calls for."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._then: list[Callable[[], None]] = []
        self.signals = 0  # how many stop signals arrived
        self.signum: int | None = None

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

    @property
    def code(self) -> int:
        return exit_code(self.signum)

    def message(self) -> str | None:
        return f"stopped by {said(self.signum)}" if self._event.is_set() else None


def stop_line(signum: int | None) -> str:
    """What a stop signal says while a run trains."""
    return f"\n{said(signum)}: stopping after the current step and saving what was trained so far"


def _handled() -> list[int]:
    """The stop signals not ignored on purpose (nohup ignores SIGHUP, a background job SIGINT)."""
    return [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]


@contextmanager
def sigint_stops(
    notice: Callable[[str], None] | None = None,
    exiting: bool = False,
    line: Callable[[int | None], str] | None = None,
) -> Iterator[StopRequest]:
    """Inside the block, SIGINT, SIGTERM and SIGHUP set the yielded :class:`StopRequest` (which
    calls what was registered with ``then``); ``notice`` gets a one-line message (default:
    stderr) the first time: ``line(signum)`` when given (what the stop does at that moment),
    else :func:`stop_line`. The previous handlers are restored on exit, except with ``exiting``
    (a command that ends after the block) once a stop was asked: further signals are then
    ignored, so they cannot cut the interpreter's clean-up short. Outside the main thread (where
    Python delivers no signal) it only yields the request."""
    request = StopRequest()
    say = notice or (lambda text: print(text, file=sys.stderr, flush=True))
    if threading.current_thread() is not threading.main_thread() or signal.SIGINT not in _handled():
        yield request  # no signal here, or SIGINT ignored on purpose (nohup, a background job)
        return

    def on_signal(signum, frame) -> None:
        request.signals += 1
        request.signum = request.signum or signum
        if _CLI is not None:  # the process ends by this signal: its status holds to the end (CliSignals._final)
            _CLI.stopped = _CLI.stopped or signum
        request.set()
        if request.signals == 1:
            text = (line or stop_line)(signum)
            try:
                say(text)
            except RuntimeError:  # the signal came inside a write to stderr (a full pipe): "reentrant call"
                _write(2, text + "\n")  # raised here, it would end the command instead of stopping it

    previous = {s: signal.signal(s, on_signal) for s in _handled()}
    if _CLI is not None and _CLI.signum is not None and not _CLI.said:
        # a signal came before, and its KeyboardInterrupt was lost (raised inside a callback,
        # where Python only reports it): the command stops now, and says so itself
        _CLI.said = True
        on_signal(_CLI.signum, None)
    try:
        yield request
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_IGN if exiting and request.is_set() else handler)


@contextmanager
def exit_on_ctrl_c(note: str) -> Iterator[None]:
    """For a command whose work cannot stop half-way (training a preset, growing a head): Ctrl-C,
    SIGTERM or SIGHUP ends it with one line on stderr (``note``: what was kept) and the status
    128 + the signal, no traceback. A save under way cleans up after itself (``checkpoint.save``
    writes to a temporary folder)."""
    got: list[int] = []

    def on_signal(signum, frame) -> None:
        got.append(signum)
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, on_signal) for s in _handled()} if main else {}
    try:
        if _CLI is not None and _CLI.signum is not None and not _CLI.said:  # a signal whose interrupt was lost
            raise KeyboardInterrupt
        yield
    except KeyboardInterrupt:
        signum = got[0] if got else (_CLI.signum if _CLI is not None and _CLI.signum else signal.SIGINT)
        print(f"\ninterrupted by {said(signum)}; {note}", file=sys.stderr, flush=True)
        if _CLI is not None:
            _CLI.said = True
        raise SystemExit(exit_code(signum)) from None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# --- the CLI process ----------------------------------------------------------------------------

_CLI: CliSignals | None = None  # the process's, while attn_core.cli.main runs


class CliSignals:
    """How the ``attn-lab`` process answers SIGINT, SIGTERM and SIGHUP (see the module): phase
    ``start-up`` (exit at once), ``command`` (``KeyboardInterrupt``, then the grace period) and
    ``exit`` (exit at once with the status decided). ``process`` is True for the process's own
    entry (the handlers then stay through the interpreter's exit, and the grace period is
    armed); a call of ``attn_core.cli.main`` in a test restores the previous handlers."""

    def __init__(self, process: bool = True) -> None:
        self.process, self.as_json = process, False
        self.phase = "start-up"
        self.signum: int | None = None  # the first signal this handler got
        self.said = False  # the one line was printed
        self.code: int | None = None  # the exit status, once decided
        self._previous: dict[int, object] = {}
        self._signalled = threading.Event()  # set by the first signal of a command (the grace period)
        self.stopped: int | None = None  # the first signal a command took as its stop request
        self._unraisable = sys.unraisablehook

    def install(self) -> CliSignals:
        global _CLI
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal) for s in _handled()}
        if self.process:
            # the grace period's thread waits from now: a signal handler that started a thread
            # needed threading's lock, which the main thread it interrupted may hold
            threading.Thread(target=self._late, name="attn-lab signal grace", daemon=True).start()
            # registered first, so it runs after every other exit handler (Ray's, kaleido's): the
            # status decided for a signal is the process's, whatever the interpreter's end does
            atexit.register(self._final)
            self._unraisable = sys.unraisablehook
            sys.unraisablehook = self._quiet
        _CLI = self
        return self

    def restore(self) -> None:
        global _CLI
        for s, handler in self._previous.items():
            if signal.getsignal(s) == self._on_signal:
                signal.signal(s, handler)
        _CLI = None

    def line(self, raw: bool = False) -> None:
        """The one line of a signal no command handled (and its JSON object with ``--json``);
        ``raw``: written to the descriptors (inside a signal handler, where the streams may be
        in the middle of a write)."""
        if self.said:
            return
        self.said = True
        extra = "" if self.signum in (None, signal.SIGINT) else f" ({said(self.signum)})"
        lines = [(2, f"interrupted{extra}\n")]
        if self.as_json:
            lines.insert(0, (1, json.dumps({"error": f"interrupted{extra}", "kind": "interrupted"}) + "\n"))
        for fd, text in lines:
            if raw:
                _write(fd, text)
            else:
                print(text, end="", file=sys.stdout if fd == 1 else sys.stderr, flush=True)

    def _on_signal(self, signum, frame) -> None:
        first = self.signum is None
        self.signum = self.signum or signum
        if self.phase == "exit":
            _exit_now(self.code if self.code is not None else exit_code(signum))
        if self.phase == "start-up" or not first:
            self.line(raw=True)
            _exit_now(exit_code(self.signum))
        if self.process:
            self._signalled.set()
        raise KeyboardInterrupt

    def _late(self) -> None:
        """A command that has not ended :data:`GRACE_S` after the signal ends now."""
        self._signalled.wait()
        time.sleep(GRACE_S)
        if self.phase != "exit":
            self.line(raw=True)
            _exit_now(exit_code(self.signum))

    def _quiet(self, unraisable) -> None:
        """Python's report of an exception it cannot raise (one raised in a callback, a
        ``__del__``): the KeyboardInterrupt of this process's own signal is not reported (the
        command hears the signal at its next stop point, or the grace period ends it); any
        other goes to the previous hook."""
        if self.signum is not None and isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        self._unraisable(unraisable)

    def _final(self) -> None:
        """At the interpreter's exit, after the other exit handlers: a process a signal ended
        exits now with the status decided (128 + the signal), flushed, and the rest of the
        interpreter's end cannot change it (a ``KeyboardInterrupt`` it noted as unhandled makes
        Python kill itself with SIGINT, -2; a library's thread can abort it, -6)."""
        signum = self.signum or self.stopped
        if signum is not None:
            _exit_now(self.code if self.phase == "exit" and self.code is not None else exit_code(signum))


def command_started() -> None:
    """Start-up is over: the command's own code runs (called around every command's callback)."""
    if _CLI is not None and _CLI.phase == "start-up":
        _CLI.phase = "command"


def _write(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode())
    except OSError:
        pass


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)
