"""PNG and SVG through kaleido's headless Chromium, bounded in time: one browser for the process,
kept open (every export after the first is fast) and driven from an event loop in a thread of its
own. Opening the browser and each export wait at most :func:`bound` seconds. A browser that cannot
start (a memory cap, missing libraries, a ``BROWSER_PATH`` that is no browser) or that never
answers is one sentence (:class:`ExportError`, which `figures.base` re-exports), not a hang or the browser's
traceback (kaleido's own persistent server waited for ever once its browser had failed); the
browser is ended then, and the next export starts a fresh one."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import signal
import subprocess
import threading

EXPORT_S = 60.0  # seconds to open the browser, and again for one export
EXPORT_ENV = "ATTN_LAB_EXPORT_S"  # another bound, in seconds (tests use a short one)
CLOSE_S = 5.0  # seconds a browser has to close before it is killed


class ExportError(RuntimeError):
    """An export could not be made; the message says why and what to do."""


def bound() -> float:
    """Seconds the browser has to open, and an export to finish (:data:`EXPORT_ENV`, else :data:`EXPORT_S`)."""
    try:
        value = float(os.environ.get(EXPORT_ENV, EXPORT_S))
    except ValueError:
        return EXPORT_S
    return value if 0 < value < float("inf") else EXPORT_S


class Browser:
    """A ``kaleido.Kaleido`` opened in this object's own event loop (a daemon thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="attn-lab kaleido", daemon=True)
        self.thread.start()
        self.kaleido = None

    def _run(self, coro, seconds: float):
        future = asyncio.run_coroutine_threadsafe(_settled(coro), self.loop)
        try:
            ok, value = future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError from None
        if not ok:
            raise value
        return value

    def open(self, seconds: float) -> None:
        import kaleido

        for name in ("choreographer", "kaleido"):  # their warnings on a failing browser: said in one line here
            logging.getLogger(name).setLevel(logging.ERROR)

        async def opened():
            self.kaleido = kaleido.Kaleido(n=1, timeout=seconds)
            _record_spawns(self.kaleido)
            await self.kaleido.open()

        self._run(opened(), seconds)

    def image(self, fig, opts: dict, seconds: float) -> bytes:
        return self._run(self.kaleido.calc_fig(fig, opts=opts), seconds)

    def end(self) -> None:
        """Close the browser (kaleido removes its temporary page), kill what is left of it (its
        process group: choreographer's wrapper and the browser) and stop the loop."""
        if self.kaleido is not None:
            try:
                self._run(self.kaleido.close(), CLOSE_S)
            except BaseException:  # noqa: BLE001 -- a browser that failed may fail to close too
                pass
        kept = getattr(self.kaleido, "subprocess", None)
        if isinstance(kept, subprocess.Popen):
            _kill(kept)
        # An open given up on while choreographer's thread was starting the browser leaves a process
        # it never kept (its `subprocess` is set after the start returns): the recorded start has it.
        started = getattr(getattr(self.kaleido, "_process_executor", None), "futures", [])
        concurrent.futures.wait(started, timeout=CLOSE_S)
        for f in started:
            if f.done() and not f.cancelled() and f.exception() is None:
                proc = f.result()
                if isinstance(proc, subprocess.Popen) and proc is not kept:
                    _kill(proc)
        self.loop.call_soon_threadsafe(self.loop.stop)


def _kill(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s process group (choreographer starts the browser in a session of its own:
    its wrapper and the browser) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    proc.wait()


class _Recording:
    """An executor that keeps the futures of what it runs: choreographer starts the browser in its
    own executor, and the process of a start whose waiter was cancelled is only in its future."""

    def __init__(self, inner) -> None:
        self.inner, self.futures = inner, []

    def submit(self, fn, *args, **kwargs):
        future = self.inner.submit(fn, *args, **kwargs)
        self.futures.append(future)
        return future

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _record_spawns(browser) -> None:
    """Record the starts of ``browser``'s executor (a choreographer internal: nothing when it is gone)."""
    inner = getattr(browser, "_process_executor", None)
    if inner is not None and not isinstance(inner, _Recording):
        browser._process_executor = _Recording(inner)


async def _settled(coro) -> tuple[bool, object]:
    """(True, result) or (False, the exception), cancellation included: an export given up on
    leaves no "exception was never retrieved" behind."""
    try:
        return True, await coro
    except BaseException as e:  # noqa: BLE001 -- handed to the waiting thread
        return False, e


def _end_at_exit() -> None:
    global _browser
    with _lock:
        if _browser is not None:
            _browser.end()
            _browser = None


_lock = threading.Lock()
_browser: Browser | None = None


def image_bytes(fig, opts: dict) -> bytes:
    """``fig`` drawn by the process's browser (opened on the first call) as ``opts`` say (format,
    scale, width, height); raises :class:`ExportError` in one sentence when the browser cannot
    start, fails, or does not answer within :func:`bound` seconds."""
    global _browser
    fmt, seconds = str(opts.get("format", "png")).upper(), bound()
    with _lock:
        step = "start"
        try:
            if _browser is None:
                _browser = Browser()
                atexit.register(_end_at_exit)  # once per browser: it does nothing once the browser is gone
                _browser.open(seconds)
            step = "draw"
            return _browser.image(fig, opts, seconds)
        except Exception as e:  # noqa: BLE001 -- kaleido and its browser raise many kinds
            if _browser is not None and (step == "start" or isinstance(e, TimeoutError)):  # the next tries afresh
                _browser.end()
                _browser = None
            if isinstance(e, TimeoutError):
                why = (
                    f"the headless browser (Chromium) did not start within {seconds:g} s"
                    if step == "start"
                    else f"it did not finish within {seconds:g} s"
                )
            else:
                said = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)
                first = (said.strip().splitlines() or [type(e).__name__])[0]
                why = (
                    f"the headless browser (Chromium) could not start ({first[:200]})"
                    if step == "start"
                    else f"{first[:200]}"
                )
            raise ExportError(
                f"{fmt} export failed: {why}; HTML and CSV exports work without a browser (--out FILE.html or FILE.csv)"
            ) from None
