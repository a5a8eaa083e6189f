"""Progress of long work (training steps, a comparison's runs) on stderr, the one helper every
command and script uses: a tqdm bar on a terminal; elsewhere (a pipe, a log file, CI) one plain
line each time another ``every`` percent is done, as pip and git do, never thousands of carriage
returns.

    with progress(300, "retrain induction-2l", unit="step") as bar:
        for step in ...:
            bar.set(step + 1, note="loss 0.12")
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

EVERY = 10  # percent between two lines when the stream is not a terminal


class Progress:
    """Position ``n`` of ``total`` (steps, or any unit; a float total works too), shown as a bar
    on a terminal and as a line every :data:`EVERY` percent elsewhere. ``set`` moves to an
    absolute position (it never goes back), ``update`` by an increment; ``close`` prints where
    it ended (and is idempotent)."""

    def __init__(
        self, total: float, desc: str, unit: str = "step", stream: TextIO | None = None, every: int = EVERY
    ) -> None:
        self.total, self.desc, self.unit, self.every = max(float(total), 0.0), desc, unit, every
        self.stream = stream if stream is not None else sys.stderr
        self.n, self.note, self.closed = 0.0, "", False
        self._start = time.monotonic()
        self._shown = -1  # the last percentage step printed (line mode)
        self.bar = None
        if _is_terminal(self.stream):
            from tqdm import tqdm

            total = int(self.total) if self.total.is_integer() else self.total  # "50/50", not "50.0/50.0"
            self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True)

    def set(self, n: float, note: str | None = None) -> None:
        """Move to position ``n`` (a smaller ``n`` is ignored) with an optional note (loss, ...)."""
        if note is not None:
            self.note = note
        n = min(max(float(n), self.n), self.total) if self.total else float(n)
        delta, self.n = n - self.n, n
        if self.bar is not None:
            if note is not None:
                self.bar.set_postfix_str(note, refresh=False)
            self.bar.update(int(delta) if float(delta).is_integer() else delta)
            return
        step = int(100 * self.n / self.total) // self.every if self.total else 0
        if step > self._shown and step < 100 // self.every:  # the 100% line comes from close()
            self._shown = step
            self._line()

    def update(self, k: float = 1, note: str | None = None) -> None:
        self.set(self.n + k, note)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
        else:
            self._line()

    def _line(self) -> None:
        pct = 100 * self.n / self.total if self.total else 100.0
        count = f"{self.n:g}/{self.total:g} {self.unit}s, " if self.unit else ""
        note = f" {self.note}" if self.note else ""
        elapsed = time.monotonic() - self._start
        print(f"{self.desc}: {pct:3.0f}% ({count}{elapsed:.1f} s){note}", file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(total: float, desc: str, unit: str = "step", stream: TextIO | None = None) -> Progress:
    """A :class:`Progress` on stderr (or ``stream``)."""
    return Progress(total, desc, unit, stream)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or odd stream: plain lines
        return False
