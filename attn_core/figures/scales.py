"""Colours and ticks every figure shares: distinct colours for any number of lines
(:func:`colors`), round ticks (:func:`nice_ticks`: a step of 1, 2, 2.5 or 5 times a power of
ten) written one by one with a mantissa from 1 to 10 (:func:`tick_text`), for the axes where
plotly would write one shared power of ten (0.2×10⁴) (:func:`round_ticks`, applied by
``layout.finish``)."""

from __future__ import annotations

import math

# Ten distinct colours (D3's category10, plotly's own); more lines than that get colours of
# their own (:func:`colors`), never the ten again.
TEN_COLORS = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def colors(n: int) -> list[str]:
    """``n`` distinct colours: :data:`TEN_COLORS` for up to ten lines, else ``n`` hues around
    the colour wheel in two lightnesses (a figure of 24 heads once drew heads 0 and 10 alike)."""
    if n <= len(TEN_COLORS):
        return list(TEN_COLORS[:n])
    return [f"hsl({round(360 * i / n)}, 70%, {42 if i % 2 else 55}%)" for i in range(n)]


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
PLAIN_TICKS = (1e-3, 1e5)  # |v| in this range is written plainly (0.002, 20000); outside, as m×10ᵏ
SHARED_EXPONENT = 1e4  # from this top tick up (and below 1e-3) plotly writes every tick with the top's power of ten


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """About ``target`` ticks covering lo..hi at a step of 1, 2, 2.5 or 5 times a power of ten,
    each a multiple of the step."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi < lo:
        lo, hi = hi, lo
    if hi - lo <= 1e-9 * max(abs(lo), abs(hi)):  # one value (to float precision): a range around it
        half = 0.05 * abs(hi) or 0.5
        lo, hi = lo - half, hi + half
    span = hi - lo
    power = 10 ** math.floor(math.log10(span / max(target - 1, 1)))

    def count(step: float) -> int:
        return math.floor(hi / step + 1e-9) - math.ceil(lo / step - 1e-9) + 1

    steps = [m * power * f for f in (0.1, 1, 10) for m in (1, 2, 2.5, 5)]
    step = min(steps, key=lambda st: (abs(count(st) - target), -st))
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [float(f"{k * step:.12g}") for k in range(first, last + 1)]


def tick_text(value: float, step: float | None = None) -> str:
    """A tick's label: plain where it reads plainly (0.002, 25000), else mantissa × a power of
    ten with the mantissa from 1 to 10 (2.5×10⁻⁶; plotly's shared exponent wrote 0.2×10⁴). With
    the axis's ``step``, enough digits that ticks a step apart read apart (32768.82813 and
    32768.82814, not 32768.8 twice); at least 6 significant digits either way."""
    if value == 0:
        return "0"
    digits = 6
    if step is not None and step > 0 and math.isfinite(step):
        digits = max(digits, math.floor(math.log10(abs(value))) - math.floor(math.log10(step)) + 2)
    if PLAIN_TICKS[0] <= abs(value) < PLAIN_TICKS[1]:
        return f"{value:.{digits}g}".replace("-", "−")
    exponent = math.floor(math.log10(abs(value)))
    mantissa = float(f"{value / 10**exponent:.{digits}g}")  # as it is written: 9.999995 is written 10
    if abs(mantissa) >= 10:
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{mantissa:.{digits}g}".replace("-", "−") + "×10" + str(exponent).translate(SUPERSCRIPT)


def finite_values(trace, attr: str) -> list[float]:
    """Every finite value a trace draws along ``attr`` (x or y), signs kept."""
    import numpy as np

    v = getattr(trace, attr, None)
    if v is None or isinstance(v, str):
        return []
    try:
        a = np.asarray(v, dtype=float).ravel()
    except (TypeError, ValueError):
        return []
    return [float(x) for x in a[np.isfinite(a)]]


def round_ticks(axis, values: list[float], zero: bool) -> None:
    """Our own round ticks on a linear axis whose numbers plotly would write with one shared
    power of ten for all of them (0.2×10⁴, 0.5×10⁻⁶): each tick is written on its own
    (:func:`tick_text`)."""
    if axis.type not in (None, "linear", "-") or axis.tickvals is not None or axis.tickmode == "sync" or not values:
        return
    lo, hi = (axis.range[0], axis.range[1]) if axis.range else (min(values), max(values))
    if zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    top = max(abs(lo), abs(hi))
    if top == 0 or PLAIN_TICKS[0] <= top < SHARED_EXPONENT:
        return
    ticks = nice_ticks(lo, hi)
    if len(ticks) >= 2:
        step = ticks[1] - ticks[0]
        axis.update(tickmode="array", tickvals=ticks, ticktext=[tick_text(t, step) for t in ticks])
