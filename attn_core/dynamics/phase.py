"""Where a phase change happened: the window of steepest fall of the in-context-learning score.

Olsson et al. (2022) see induction heads form in a sudden *phase change*: after a plateau the ICL
score (late-position loss minus early-position loss) falls fast, then slowly. Given the score y at
checkpoint steps s_0 < s_1 < ... (non-finite values dropped):

1. Slopes g_k = (y_{k+1} - y_k) / (s_{k+1} - s_k) between consecutive checkpoints; the steepest
   fall is the most negative one, g*. None if no interval falls.
2. The window [a, b] = [s_lo, s_hi]: the run of consecutive intervals around the steepest one
   that still fall at least ``frac`` (1/4) as fast as it does (g_k <= frac * g*).
3. It is a phase change only if the score falls by at least ``min_drop`` nats across the window
   (y(a) - y(b)), the window does not start at the first checkpoint (a change needs a plateau
   before it: a fall that starts with training is the start of learning), and it is short:
   b - a <= ``max_width`` (1/3) of the span of steps. Otherwise None.
4. The phase change ``step`` is where the score (linearly interpolated) crosses the middle of its
   fall inside the window, (y(a) + y(b)) / 2.

The result is ``{"step": S, "window": [a, b], "by": "icl_score"}`` (whole steps), or None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MIN_DROP = 0.1  # nats: a smaller fall across the window is not a phase change
MAX_WIDTH = 1 / 3  # of the span of steps: a longer window is not sudden
FRAC = 0.25  # intervals falling at least this fraction of the steepest rate belong to its window


def phase_change(
    steps: Sequence[float],
    values: Sequence[float | None],
    min_drop: float = MIN_DROP,
    max_width: float = MAX_WIDTH,
    frac: float = FRAC,
    by: str = "icl_score",
) -> dict | None:
    """The phase change of ``values`` at ``steps`` (see the module doc); None when there is none."""
    pts = sorted((float(s), float(v)) for s, v in zip(steps, values) if v is not None and math.isfinite(v))
    pts = [p for i, p in enumerate(pts) if i == 0 or p[0] > pts[i - 1][0]]
    if len(pts) < 3:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    g = [(ys[k + 1] - ys[k]) / (xs[k + 1] - xs[k]) for k in range(len(xs) - 1)]
    k_star = min(range(len(g)), key=g.__getitem__)
    if g[k_star] >= 0:
        return None
    lo, hi = k_star, k_star
    while lo > 0 and g[lo - 1] <= frac * g[k_star]:
        lo -= 1
    while hi < len(g) - 1 and g[hi + 1] <= frac * g[k_star]:
        hi += 1
    a, b = xs[lo], xs[hi + 1]
    fall = ys[lo] - ys[hi + 1]
    if fall < min_drop or lo == 0 or b - a > max_width * (xs[-1] - xs[0]):
        return None
    level = (ys[lo] + ys[hi + 1]) / 2
    mid = b
    for k in range(lo, hi + 1):
        if ys[k + 1] <= level:
            y0, y1 = ys[k], ys[k + 1]
            t = 1.0 if y0 == y1 else (y0 - level) / (y0 - y1)
            mid = xs[k] + t * (xs[k + 1] - xs[k])
            break
    return {"step": round(mid), "window": [round(a), round(b)], "by": by}
