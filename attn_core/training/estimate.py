"""How long a run will take, said before it starts: the floating-point operations of its steps,
evaluations and before/after measurements (6 per parameter per token for a training step, 2 for
a forward, and the attention scores and their weighted sum), divided by the speed this device
multiplies matrices at now (:func:`device_rate`, measured once per process and device in about
0.2 s), plus what a step costs whatever its size (three forwards of one short sequence through
the model, timed when the model is given: Python and kernel launches, which dominate a tiny
model's step). Every speed rests on several timings (:func:`typical`: their lower quartile), never
on one, so a stall of the machine while it is measured does not make the estimate. An estimate, not a promise (docs/training.md, "Retraining your own models on text").

It is said as a range (:func:`run_range`): the speed measured is what the machine gives when it
lets the run go; other work on a busy machine slows the run by up to its load per core, and the
run may also beat the estimate. Once the run goes, :class:`Pace` refines it from the measured
steps (the seconds left, low to high, from the run's pace so far and its recent pace)."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections import deque
from collections.abc import Callable

OVERHEAD = 1.5  # measured steps over estimated (see the module)
TIMINGS = 9  # timings of an operation, of which the lower quartile is taken (:func:`typical`)
# The range said before a run: LOW x the estimate to HIGH x the estimate x the machine's load per
# core (at least 1). The estimate counts the steps' arithmetic, not a live job's telemetry and
# bookkeeping: on a busy 2-core machine (load average 3.7 to 11), retrains of reverse-1l took
# about 3x (200 steps) and 5x (2000 steps) their estimate; one retrain was reported 2.2x faster
# than its estimate.
LOW, HIGH = 0.5, 4.0
RECENT_S = 20.0  # seconds of the run's latest steps that give its recent pace (Pace)
MIN_PACE_STEPS = 3  # steps measured before a run's pace is said
PACE_MARGIN = 0.1  # the refined range is at least this much either side of the pace
CPU_STEP_FLOPS = 1e10  # a text run's default batch on the CPU: the most blocks within this (text.task.default_batch)


def step_flops(cfg, block: int, blocks: int = 1, kl: float = 0.0) -> float:
    """Operations of one training step of the model ``cfg`` on ``blocks`` sequences of ``block``
    tokens: per token 6 per parameter (forward and backward) and 12 x layers x heads x d_head x
    block for the scores and their weighted sum; the KL term's starting model adds a forward
    (2 per parameter)."""
    params = cfg.n_params()
    per_token = (6 + (2 if kl > 0 else 0)) * params + 12 * cfg.n_layers * cfg.n_heads * cfg.d_head * block
    return float(blocks) * block * per_token


def forward_flops(cfg, block: int, blocks: int = 1) -> float:
    """Operations of a forward pass (a third of a training step without the KL term)."""
    return step_flops(cfg, block, blocks) / 3


def typical(times: list[float]) -> float:
    """The lower quartile of timings of one operation: what it costs when the machine lets it run.
    A few timings stretched by other work (a loaded machine, a first call) do not move it, where
    a median of three did: one of five identical retrains said ~1.7 s a step and trained in
    6.6 s."""
    ordered = sorted(times)
    return ordered[(len(ordered) - 1) // 4]


@contextlib.contextmanager
def timing_threads(threads: int | None):
    """torch's intra-op threads set to ``threads`` (None: left) while timing, then put back: an
    estimate is timed with the threads the run will train with, not with the caller's."""
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_threads(cfg, batch: int, block: int, device: str = "cpu", threads: int | None = None) -> int | None:
    """The threads a run of the model ``cfg`` on ``batch`` x ``block`` tokens trains with
    (``threads`` when given; else as the trainer chooses them: ``device.choose_threads``)."""
    from attn_core.device import choose_threads, cpu_cores

    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    work = cfg.n_params() * batch * block
    return choose_threads(work, cpu_cores(), threads, os.environ.get("OMP_NUM_THREADS"), load, device)


@functools.cache
def device_rate(
    device: str = "cpu", clock: Callable[[], float] = time.perf_counter, threads: int | None = None
) -> float:
    """Operations per second a matrix product of a typical size runs at on ``device`` now with
    ``threads`` torch threads (None: the process's; once per process, device and threads: about
    0.2 s): each product timed alone, at least :data:`TIMINGS` of them, their :func:`typical`
    time. ``clock``: the timer (a test gives its own)."""
    with timing_threads(threads):
        return _rate(device, clock)


def _rate(device: str, clock: Callable[[], float]) -> float:
    import torch

    a = torch.randn(1024, 512, device=device)
    b = torch.randn(512, 1024, device=device)
    (a @ b).sum().item()  # warm up (and CUDA's context)
    times: list[float] = []
    while len(times) < TIMINGS or (sum(times) < 0.2 and len(times) < 100):
        started = clock()
        (a @ b)[0, 0].item()
        times.append(clock() - started)
    return 2 * 1024 * 512 * 1024 / max(typical(times), 1e-9)


def fixed_seconds(
    model, device: str = "cpu", clock: Callable[[], float] = time.perf_counter, threads: int | None = None
) -> float:
    """What a training step of ``model`` costs whatever its size: three times the :func:`typical`
    time of :data:`TIMINGS` forwards of one sequence of 8 tokens, after one untimed (no gradients:
    the model is left as it was), with ``threads`` torch threads (None: the process's).
    ``clock``: the timer (a test gives its own)."""
    with timing_threads(threads):
        return _fixed(model, device, clock)


def _fixed(model, device: str, clock: Callable[[], float]) -> float:
    import torch

    tokens = torch.zeros(1, min(8, model.cfg.n_ctx), dtype=torch.long, device=device)
    times = []
    with torch.no_grad():
        model(tokens)[0, 0, 0].item()  # a first call: lazy set-up, caches
        for _ in range(TIMINGS):
            started = clock()
            model(tokens)[0, 0, 0].item()
            times.append(clock() - started)
    return 3 * typical(times)


def run_seconds(
    cfg,
    steps: int,
    batch: int,
    block: int,
    device: str = "cpu",
    kl: float = 0.0,
    eval_every: int = 100,
    eval_samples: int = 256,
    measure_samples: int = 512,
    model=None,
    threads: int | None = None,
) -> dict:
    """The estimated seconds of a run: ``step_s`` (one step), ``train_s`` (every step, the
    held-out evaluations every ``eval_every`` steps) and ``measure_s`` (the before/after
    measurement of ``measure_samples`` sequences, about three forwards each), ``total_s``.
    With ``model`` (on ``device``), each step adds its :func:`fixed_seconds`. Timed with the
    threads the run takes (:func:`run_threads`; ``threads``: the user's choice)."""
    threads = run_threads(cfg, batch, block, str(device), threads)
    rate = device_rate(str(device), threads=threads) / OVERHEAD
    fixed = fixed_seconds(model, str(device), threads=threads) if model is not None else 0.0
    step = fixed + step_flops(cfg, block, batch, kl) / rate
    evals = (math.ceil(steps / eval_every) + 1) * forward_flops(cfg, block, eval_samples) / rate
    measure = 2 * 3 * forward_flops(cfg, block, measure_samples) / rate
    return {
        "step_s": step,
        "train_s": steps * step + evals,
        "measure_s": measure,
        "total_s": steps * step + evals + measure,
        "rate_gflops": device_rate(str(device), threads=threads) / 1e9,
        "threads": threads,
    }


def load_per_core() -> float:
    """This machine's one-minute load average per CPU (0 where the system does not say)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return 0.0


def run_range(total_s: float, load: float = 0.0) -> tuple[float, float]:
    """(low, high) seconds of a run estimated at ``total_s`` on a machine whose load per core is
    ``load``: LOW x to HIGH x max(1, load) x the estimate."""
    return LOW * total_s, HIGH * max(1.0, load) * total_s


class Pace:
    """The seconds left of a running loop of ``steps`` steps, refined from its measured steps:
    :meth:`add` each step with the loop's seconds so far; :meth:`left` says (low, high): the
    steps left at the run's pace so far and at its pace over its last :data:`RECENT_S` seconds
    (the slower gives high), at least :data:`PACE_MARGIN` either side, plus ``after_s`` (what
    follows the loop: measuring the final weights, saving)."""

    def __init__(self, steps: int, after_s: float = 0.0):
        self.steps, self.after_s = steps, after_s
        self.points: deque[tuple[int, float]] = deque()

    def add(self, step: int, seconds: float) -> None:
        self.points.append((step, seconds))
        while len(self.points) > 2 and seconds - self.points[1][1] >= RECENT_S:
            self.points.popleft()

    def left(self) -> tuple[float, float] | None:
        """(low, high) seconds left; None before :data:`MIN_PACE_STEPS` steps are measured."""
        if not self.points or self.points[-1][0] < MIN_PACE_STEPS:
            return None
        step, seconds = self.points[-1]
        overall = seconds / step
        old_step, old_s = self.points[0]
        recent = (seconds - old_s) / (step - old_step) if step > old_step else overall
        remaining = max(0, self.steps - step)
        low = remaining * min(overall, recent) * (1 - PACE_MARGIN)
        high = remaining * max(overall, recent) * (1 + PACE_MARGIN)
        return low + self.after_s, high + self.after_s


def range_text(low: float, high: float) -> str:
    """``20-45 s``, ``2-7 min``, ``50 s - 3 min``; one figure when both read the same."""
    a, b = duration_text(low), duration_text(max(high, low))
    if a == b:
        return f"about {a}"
    (x, unit), (y, unit_b) = a.split(" "), b.split(" ")
    return f"{x}–{y} {unit}" if unit == unit_b else f"{a} – {b}"


def duration_text(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def duration_line(cfg, steps: int, batch: int, block: int, device: str = "cpu", kl: float = 0.0, **settings) -> str:
    """One line: the estimated duration of a run, its step and what it rests on (``settings``:
    those of :func:`run_seconds`)."""
    e = run_seconds(cfg, steps, batch, block, device, kl, **settings)
    low, high = run_range(e["total_s"], load_per_core())
    return (
        f"estimated duration: {range_text(low, high)} on {device} ({steps} steps of {batch} x {block} "
        f"tokens, ~{e['step_s']:.2g} s a step, and ~{duration_text(e['measure_s'])} measuring before and after; "
        f"a rough estimate from its speed now, {e['rate_gflops']:.3g} GFLOP/s, and this machine's load; "
        "refined from the measured steps as the run goes)"
    )
