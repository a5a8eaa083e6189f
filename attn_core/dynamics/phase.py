"""Where a phase change happened: a sudden fall of the in-context-learning score that the loss
shares, both beyond the series' noise.

Olsson et al. (2022) see induction heads form in a sudden *phase change*: after a plateau the ICL
score (late-position loss minus early-position loss) falls fast, and the loss falls with it (the
"bump" of their loss curves). A steep stretch of the ICL score alone is no evidence: the ICL
score of a converged model that is trained on keeps drifting as its early (unpredictable)
positions grow more confidently wrong, while its loss stays flat. Given the ICL score y and the
loss l at checkpoint steps s_0 < s_1 < ... (steps where either is not finite dropped):

1. Slopes g_k = (y_{k+1} - y_k) / (s_{k+1} - s_k) between consecutive checkpoints; the steepest
   fall is the most negative one, g*. None if no interval falls.
2. The window [a, b] = [s_lo, s_hi]: the run of consecutive intervals around the steepest one
   that still fall at least ``frac`` (1/4) as fast as it does (g_k <= frac * g*).
3. The window must not start at the first checkpoint (a change needs a plateau before it: a fall
   that starts with training is the start of learning).
4. Evidence, against the noise of each series (:func:`noise`: the robust spread of its second
   differences, what a smooth trend leaves): the ICL score falls across the window by at least
   ``z`` (4) times its noise and ``min_drop`` (0.1 nats), **and the loss falls across the same
   window** by at least ``z`` times its noise and ``min_loss_drop`` (0.02 nats). Otherwise None.
5. The phase change ``step`` is where the score (linearly interpolated) crosses the middle of its
   fall inside the window, (y(a) + y(b)) / 2.

The result is ``{"step": S, "window": [a, b], "by": "icl_score", "fall": y(a) - y(b),
"loss_fall": l(a) - l(b), "noise": {"icl_score": .., "loss": ..}}`` (whole steps, nats), or None.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

MIN_DROP = 0.1  # nats: a smaller fall of the ICL score across the window is not a phase change
MIN_LOSS_DROP = 0.02  # nats: nor one the loss does not share by at least this much
Z = 4.0  # both falls at least this many times their series' noise
FRAC = 0.25  # intervals falling at least this fraction of the steepest rate belong to its window


def noise(values: Sequence[float]) -> float:
    """The point-to-point noise of a series: 1.4826 x the median absolute second difference,
    divided by sqrt(6) (the standard deviation of independent noise, which a second difference
    multiplies by sqrt(6); a linear trend leaves nothing). 0.0 for fewer than 3 values."""
    d2 = [abs(values[k + 1] - 2 * values[k] + values[k - 1]) for k in range(1, len(values) - 1)]
    return 1.4826 * statistics.median(d2) / math.sqrt(6) if d2 else 0.0


def phase_change(
    steps: Sequence[float],
    values: Sequence[float | None],
    loss: Sequence[float | None] | None = None,
    min_drop: float = MIN_DROP,
    min_loss_drop: float = MIN_LOSS_DROP,
    z: float = Z,
    frac: float = FRAC,
    by: str = "icl_score",
) -> dict | None:
    """The phase change of ``values`` at ``steps`` with the ``loss`` as evidence (see the module
    doc); None when there is none, or no loss to show one."""
    if loss is None:
        return None
    pts = sorted(
        (float(s), float(v), float(l))
        for s, v, l in zip(steps, values, loss)
        if v is not None and l is not None and math.isfinite(v) and math.isfinite(l)
    )
    pts = [p for i, p in enumerate(pts) if i == 0 or p[0] > pts[i - 1][0]]
    if len(pts) < 3:
        return None
    xs, ys, ls = [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]
    g = [(ys[k + 1] - ys[k]) / (xs[k + 1] - xs[k]) for k in range(len(xs) - 1)]
    k_star = min(range(len(g)), key=g.__getitem__)
    if g[k_star] >= 0:
        return None
    lo, hi = k_star, k_star
    while lo > 0 and g[lo - 1] <= frac * g[k_star]:
        lo -= 1
    while hi < len(g) - 1 and g[hi + 1] <= frac * g[k_star]:
        hi += 1
    fall, loss_fall = ys[lo] - ys[hi + 1], ls[lo] - ls[hi + 1]
    spread = {by: noise(ys), "loss": noise(ls)}
    if lo == 0 or fall < max(min_drop, z * spread[by]) or loss_fall < max(min_loss_drop, z * spread["loss"]):
        return None
    level = (ys[lo] + ys[hi + 1]) / 2
    mid = xs[hi + 1]
    for k in range(lo, hi + 1):
        if ys[k + 1] <= level:
            y0, y1 = ys[k], ys[k + 1]
            t = 1.0 if y0 == y1 else (y0 - level) / (y0 - y1)
            mid = xs[k] + t * (xs[k + 1] - xs[k])
            break
    return {
        "step": round(mid),
        "window": [round(xs[lo]), round(xs[hi + 1])],
        "by": by,
        "fall": fall,
        "loss_fall": loss_fall,
        "noise": spread,
    }


def describe(pc: dict | None) -> str:
    """The phase change (a result of :func:`phase_change`, or None) in one sentence."""
    if not pc:
        return (
            "no phase change (no fall of the ICL score after a plateau that the loss shares, "
            "both beyond the series' noise)"
        )
    a, b = pc["window"]
    by = pc["by"].replace("_", " ").replace("icl", "ICL")
    return (
        f"phase change at step {pc['step']}, window {a}..{b}: the {by} falls {pc['fall']:.3g} nats and the loss "
        f"{pc['loss_fall']:.3g} nats across it (noise {pc['noise'][pc['by']]:.2g} and {pc['noise']['loss']:.2g} nats)"
    )
