"""Text labels for scatter points that do not collide: with each other, with the markers, or
with the lines drawn in the plot (arrows, a box's edges, zero lines)."""

from __future__ import annotations

import math
from collections.abc import Sequence

CHAR_PX = 5.6  # the mean width of a character of 11 px text ("L1H2, L1H3, L1H1, L1H0 via L0H3": 172 px)
SIDEWAYS = (0.0, *(s * k / 20 for k in range(1, 11) for s in (-1, 1)))  # slides along a side, in label widths
UPDOWN_PX = (0.0, -4.0, 4.0, -8.0, 8.0, -12.0, 12.0)


def place_labels(
    points: list[tuple[float, float, str]],
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    size_px: tuple[int, int] = (560, 290),
    near_px: float = 14,
    lines: Sequence[tuple[float, float, float, float]] = (),
) -> list[tuple[float, float, str, str]]:
    """Text labels for scatter points that do not sit on each other or on the markers: points
    closer than ``near_px`` on screen share one label (their names joined), and each label takes
    the first side of its point (above, below, right, left, corners) where it meets no marker,
    no label placed before and no line drawn in the plot (``lines``: segments (x0, y0, x1, y1)
    in data units: arrows, a box's edges, zero lines), inside the plot; a label above or below
    its point may slide sideways, one beside it up or down, to find such a place (its x or y then
    differs from the point's). Points whose names end
    alike share the end once ("L1H2, L1H3 via L0H3"). Returns ``(x, y, text, textposition)``
    per label. Positions are estimated for a plot area of ``size_px`` (width, height) showing
    ``x_range`` x ``y_range``, text of 11 px."""
    (x0, x1), (y0, y1), (w, h) = x_range, y_range, size_px

    def px(x: float, y: float) -> tuple[float, float]:
        return (x - x0) / (x1 - x0) * w, (y1 - y) / (y1 - y0) * h

    def clash(a, b, pad: float = 3) -> bool:
        return not (a[2] + pad <= b[0] or b[2] + pad <= a[0] or a[3] + pad <= b[1] or b[3] + pad <= a[1])

    clusters: list[list[tuple[float, float, str]]] = []
    for p in sorted(points, key=lambda p: (-p[1], p[0])):
        for c in clusters:
            if any(math.dist(px(p[0], p[1]), px(q[0], q[1])) < near_px for q in c):
                c.append(p)
                break
        else:
            clusters.append([p])
    markers = [(cx - 7, cy - 7, cx + 7, cy + 7) for cx, cy in (px(p[0], p[1]) for p in points)]
    segments = [(*px(a, b), *px(c, d)) for a, b, c, d in lines]
    sides = {  # textposition: which way the label's box lies from its point
        "top center": (0, -1),
        "bottom center": (0, 1),
        "middle right": (1, 0),
        "middle left": (-1, 0),
        "top right": (1, -1),
        "top left": (-1, -1),
        "bottom right": (1, 1),
        "bottom left": (-1, 1),
    }
    placed: list[tuple[float, float, float, float]] = []
    out = []
    for c in clusters:
        x = sum(p[0] for p in c) / len(c)
        y = sum(p[1] for p in c) / len(c)
        text = _join_names([p[2] for p in c])
        bw, bh = CHAR_PX * len(text) + 4, 15
        cx, cy = px(x, y)
        own = {i for i, p in enumerate(points) if p in c}
        options = []
        for side, (dx, dy) in sides.items():
            # a label may also slide along its side (above or below: sideways by up to half its
            # width; left or right: up or down by up to 12 px) to clear a line: a point in a
            # box's corner, or between an arrow and a zero line, has a line on every side of it
            slides = [(f * bw, 0.0) for f in SIDEWAYS] if dx == 0 else [(0.0, f) for f in UPDOWN_PX]
            for sx, sy in slides:
                mx, my = cx + dx * (bw / 2 + 8) + sx, cy + dy * (bh / 2 + 8) + sy
                box = (mx - bw / 2, my - bh / 2, mx + bw / 2, my + bh / 2)
                hits = (
                    sum(clash(box, b) for b in placed) * 10
                    + sum(clash(box, m, 0) for i, m in enumerate(markers) if i not in own)
                    + sum(_crosses(seg, box, 2) for seg in segments) * 10
                )
                outside = box[0] < 0 or box[2] > w or box[1] < 0 or box[3] > h
                moved = (abs(sx) + abs(sy)) / (bw + bh)  # the nearer to its point, the better
                options.append((hits + 5 * outside + moved, len(options), side, box, sx, sy))
        _, _, side, box, sx, sy = min(options)
        placed.append(box)
        out.append((x + sx / w * (x1 - x0), y - sy / h * (y1 - y0), text, side))
    return out


def _join_names(names: list[str]) -> str:
    """Names of points on one spot, their common ending written once: "L1H2 via L0H3" and "L1H3
    via L0H3" -> "L1H2, L1H3 via L0H3"."""
    ends = {n.rpartition(" via ")[2] if " via " in n else None for n in names}
    if len(names) > 1 and len(ends) == 1 and None not in ends:
        return ", ".join(n.rpartition(" via ")[0] for n in names) + f" via {ends.pop()}"
    return ", ".join(names)


def _crosses(seg: tuple[float, float, float, float], box: tuple[float, float, float, float], pad: float) -> bool:
    """Whether the segment (x0, y0, x1, y1) passes through ``box`` (left, top, right, bottom),
    grown by ``pad`` (Liang-Barsky clipping)."""
    x0, y0, x1, y1 = seg
    dx, dy = x1 - x0, y1 - y0
    lo, hi = 0.0, 1.0
    for p, q in ((-dx, x0 - box[0] + pad), (dx, box[2] + pad - x0), (-dy, y0 - box[1] + pad), (dy, box[3] + pad - y0)):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            lo = max(lo, t)
        else:
            hi = min(hi, t)
        if lo > hi:
            return False
    return True
