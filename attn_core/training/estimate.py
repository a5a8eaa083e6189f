"""How long a run will take, said before it starts: the floating-point operations of its steps,
evaluations and before/after measurements (6 per parameter per token for a training step, 2 for
a forward, and the attention scores and their weighted sum), divided by the speed this device
multiplies matrices at now (:func:`device_rate`, measured once per process and device in about
0.2 s), plus what a step costs whatever its size (three forwards of one short sequence through
the model, timed when the model is given: Python and kernel launches, which dominate a tiny
model's step). Every speed rests on several timings (:func:`typical`: their lower quartile), never
on one, so a stall of the machine while it is measured does not make the estimate. An estimate, not a promise (docs/training.md, "Retraining your own models on text")."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

OVERHEAD = 1.5  # measured steps over estimated (see the module)
TIMINGS = 9  # timings of an operation, of which the lower quartile is taken (:func:`typical`)
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


@functools.cache
def device_rate(device: str = "cpu", clock: Callable[[], float] = time.perf_counter) -> float:
    """Operations per second a matrix product of a typical size runs at on ``device`` now (once
    per process and device: about 0.2 s): each product timed alone, at least :data:`TIMINGS` of
    them, their :func:`typical` time. ``clock``: the timer (a test gives its own)."""
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


def fixed_seconds(model, device: str = "cpu", clock: Callable[[], float] = time.perf_counter) -> float:
    """What a training step of ``model`` costs whatever its size: three times the :func:`typical`
    time of :data:`TIMINGS` forwards of one sequence of 8 tokens, after one untimed (no gradients:
    the model is left as it was). ``clock``: the timer (a test gives its own)."""
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
) -> dict:
    """The estimated seconds of a run: ``step_s`` (one step), ``train_s`` (every step, the
    held-out evaluations every ``eval_every`` steps) and ``measure_s`` (the before/after
    measurement of ``measure_samples`` sequences, about three forwards each), ``total_s``.
    With ``model`` (on ``device``), each step adds its :func:`fixed_seconds`."""
    rate = device_rate(str(device)) / OVERHEAD
    fixed = fixed_seconds(model, str(device)) if model is not None else 0.0
    step = fixed + step_flops(cfg, block, batch, kl) / rate
    evals = (math.ceil(steps / eval_every) + 1) * forward_flops(cfg, block, eval_samples) / rate
    measure = 2 * 3 * forward_flops(cfg, block, measure_samples) / rate
    return {
        "step_s": step,
        "train_s": steps * step + evals,
        "measure_s": measure,
        "total_s": steps * step + evals + measure,
        "rate_gflops": device_rate(str(device)) / 1e9,
    }


def duration_text(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def say(cfg, steps: int, batch: int, block: int, device: str = "cpu", kl: float = 0.0, **settings) -> str:
    """One line: the estimated duration of a run, its step and what it rests on (``settings``:
    those of :func:`run_seconds`)."""
    e = run_seconds(cfg, steps, batch, block, device, kl, **settings)
    return (
        f"estimated duration: about {duration_text(e['total_s'])} on {device} ({steps} steps of {batch} x {block} "
        f"tokens, ~{e['step_s']:.2g} s a step, and ~{duration_text(e['measure_s'])} measuring before and after; "
        f"a rough estimate from its speed now, {e['rate_gflops']:.3g} GFLOP/s)"
    )
