"""How every figure is laid out (one place for pages, CLI exports and the gallery): tick labels
fitted to the width a chart gets on its page (:func:`fixed_margins`, :func:`token_ticks`), the
rules :class:`~attn_core.figures.base.Plot` applies to every figure when it is made
(:func:`finish`: no zero line across heatmaps, bars from zero, log axes by decades in powers of
ten, 0..1 measures on 0..1, wrapped titles, legends that fit), and scatter labels that do not
collide (:func:`place_labels`)."""

from __future__ import annotations

import math
import re

import plotly.graph_objects as go

from attn_core.figures.labels import place_labels  # noqa: F401  (re-exported: every layout rule here)
from attn_core.figures.scales import TEN_COLORS, colors, finite_values, round_ticks

MAX_TICKS = 64  # label every token on an axis up to this many; beyond, plotly picks the ticks


TICK_CHARS = 12  # a tick label longer than this is shortened (:func:`short_tick`); hover keeps it whole


def short_tick(label: str, max_chars: int = TICK_CHARS) -> str:
    """``label`` short enough for an axis: a run of 4 or more of one character written once with
    its count (``5:␣×16`` for sixteen spaces), then cut to ``max_chars`` with an ellipsis."""
    label = re.sub(r"(.)\1{3,}", lambda m: f"{m.group(1)}×{len(m.group(0))}", str(label))
    return label if len(label) <= max_chars else label[: max_chars - 1] + "…"


def token_ticks(labels: list[str], first: int = 0) -> dict:
    """Axis settings that label position ``first + i`` with ``labels[i]`` (none past
    :data:`MAX_TICKS`: plotly's numbers then)."""
    if len(labels) > MAX_TICKS:
        return {}
    return dict(tickmode="array", tickvals=list(range(first, first + len(labels))), ticktext=labels)


# Tick-label character width at plotly's 12 px font and the Streamlit theme's, rounded up; the
# height of one line of labels; the room an axis title and its gap take; the widest label margin
# before labels are clipped.
CHAR_PX = 8
LINE_PX = 22
TITLE_PX = 50
MAX_LABEL_PX = 240
NUMBER_CHARS = 6  # an automatic numeric tick such as "−1.5k" or "1000"
# The width a chart gets in one of two columns of the dashboard (layout "wide", a 1400-pixel
# window with the sidebar open), the width figures are laid out for unless told otherwise.
HALF_PX = 460
FULL_PX, WIDE_PX, THIRD_PX = 940, 700, 300  # a whole row, three quarters ([3, 1] columns), a third
DEFAULT_HEIGHT = 450  # plotly's, when a figure sets none
COLORBAR_PX = 90  # a colour bar with its ticks and title
MIN_TICK_FONT = 9  # px: tick labels are made smaller down to this, then only every k-th is written


def _fit(space_px: float) -> tuple[int, int]:
    """(font size, step) so that labels stacked every ``space_px`` pixels (upright ones across
    the axis, or rows of a y axis) do not overlap: a smaller font, then every step-th label."""
    font = int(min(12, max(MIN_TICK_FONT, space_px / 1.25)))
    return font, max(1, math.ceil(1.25 * font / max(space_px, 1e-9)))


def _thin(axis, step: int, labels) -> None:
    """Keep every ``step``-th tick label of ``axis`` (its tick values, or ``labels``' categories)."""
    if step <= 1:
        return
    vals = list(axis.tickvals) if axis.tickvals is not None else list(labels)
    text = list(axis.ticktext) if axis.ticktext is not None else list(labels)
    axis.update(tickmode="array", tickvals=vals[::step], ticktext=text[::step])


def fixed_margins(
    fig: go.Figure, x_labels=None, y_labels=None, colorbar: bool = True, width: int = HALF_PX
) -> go.Figure:
    """Set the margins, tick angles and tick font from the tick labels and the width the chart
    will have (``width`` px; its height is the figure's) instead of letting plotly measure them.
    The labels are the axes' own ``ticktext`` (:func:`token_ticks`) unless given (a category
    axis's names); none means plotly's numeric ticks. An x axis's labels are drawn upright when
    they do not fit side by side; labels that would still touch get a smaller font (down to
    :data:`MIN_TICK_FONT`), then only every k-th is written (hover names every cell). Measured
    margins and angles make plotly draw a figure, measure every label and the colour bar, then
    draw it again: twice the work of each redraw in the dashboard. Fixed ones draw it once.
    Labels wider than :data:`MAX_LABEL_PX` are clipped."""

    def extent(labels) -> int:
        chars = NUMBER_CHARS if not labels else max(len(str(s)) for s in labels)
        return min(CHAR_PX * chars, MAX_LABEL_PX)

    x_labels = fig.layout.xaxis.ticktext if x_labels is None else x_labels
    y_labels = fig.layout.yaxis.ticktext if y_labels is None else y_labels
    left, right = extent(y_labels) + TITLE_PX, COLORBAR_PX if colorbar else 30
    plot_w = max(width - left - right, 50)
    n_x = len(x_labels) if x_labels else 0
    upright = n_x > 0 and n_x * (extent(x_labels) + 8) > plot_w
    x_font, x_step = _fit(plot_w / n_x) if upright else (12, 1)
    bottom = (min(extent(x_labels) * x_font // 12 + 8, MAX_LABEL_PX) if upright else LINE_PX) + TITLE_PX
    top = 70
    n_y = len(y_labels) if y_labels else 0
    plot_h = max((fig.layout.height or DEFAULT_HEIGHT) - top - bottom, 50)
    y_font, y_step = _fit(plot_h / n_y) if n_y else (12, 1)
    fig.update_layout(
        margin=dict(l=left, b=bottom, t=top, r=right, autoexpand=False),
        xaxis_tickangle=-90 if upright else 0,
        yaxis_tickangle=0,
    )
    if x_labels:
        fig.update_xaxes(tickfont_size=x_font)
        _thin(fig.layout.xaxis, x_step, x_labels)
    if y_labels:
        fig.update_yaxes(tickfont_size=y_font)
        _thin(fig.layout.yaxis, y_step, y_labels)
    return fig


UNIT_RANGE = [-0.02, 1.02]  # the axis range of a quantity bounded by 0 and 1 (accuracy, A, H/log n)
# Measures bounded by 0 and 1 (held-out accuracy, normalized entropy H/log n, top-1 mass): their
# axes show the whole range unless the user zooms, so 0.9998 and 1 do not look far apart.
UNIT_MEASURES = {"accuracy", "eval_accuracy", "entropy_data", "entropy_vocab", "top1_mass"}
# An axis whose title says it shows such a measure keeps the range 0..1 too (finish): accuracy,
# a normalized entropy H / log n, anything titled "(0..1)".
UNIT_TITLE = re.compile(r"accuracy|H / log n|normalized (?:attention )?entropy|\(0\.\.1\)", re.IGNORECASE)
TITLE_CHAR_PX = 8.5  # a title character (16 px font), rounded up: a longer title line is wrapped
TITLE_CHARS = int(HALF_PX / TITLE_CHAR_PX)
TITLE_LINE_PX = 22


def _axes_of(trace) -> tuple[str, str]:
    """The layout keys of a trace's axes ("xaxis", "yaxis2", ...)."""

    def key(ref: str | None, kind: str) -> str:
        ref = ref or kind
        return f"{kind}axis{ref[1:]}"

    return key(getattr(trace, "xaxis", None), "x"), key(getattr(trace, "yaxis", None), "y")


def _values(trace, attr: str) -> list[float]:
    import numpy as np

    v = getattr(trace, attr, None)
    if v is None:
        return []
    try:
        a = np.asarray(v, dtype=float).ravel()
    except (TypeError, ValueError):
        return []
    return [float(x) for x in a[np.isfinite(a) & (a > 0)]]


def finish(fig: go.Figure, width: int = HALF_PX) -> go.Figure:
    """The rules every figure keeps (applied when a :class:`Plot` is made): heatmap axes have
    no zero line or grid (they would cross row 0 and the cells); a bar's value axis starts at
    zero (a bar on a log axis is refused: it cannot start at zero); log axes have one tick per
    decade when the data span one (every few decades when they are many), with powers of ten
    (10⁻⁶, never SI prefixes such as 1µ); every axis writes large and small numbers as powers of
    ten, and where plotly would write them all with one shared power (0.2×10⁴) each is written
    on its own at round ticks (``scales.round_ticks``); a second (right) axis has round ticks of
    its own (plotly's default puts its ticks on the first axis's grid: 3.671, 4.267); an axis
    titled as a measure bounded by 0 and 1 (:data:`UNIT_TITLE`) shows 0..1 unless the user zooms; axes widen the margins to fit their labels (unless the margins were fixed
    from them); a long title is wrapped; a legend taller than the plot goes under it."""
    layout_axes = {k for k in fig.layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))}
    spans: dict[str, list[float]] = {}
    drawn: dict[str, list[float]] = {}  # every value along an axis (for round ticks)
    from_zero: set[str] = set()
    for trace in fig.data:
        if not hasattr(trace, "xaxis"):  # a table: no axes
            continue
        xa, ya = _axes_of(trace)
        if trace.type == "heatmap":
            for a in (xa, ya):
                fig.layout[a].update(zeroline=False, showgrid=False)
        if trace.type == "bar":
            value_axis = xa if trace.orientation == "h" else ya
            if fig.layout[value_axis].type == "log":
                raise ValueError(f"bars on a log axis ({value_axis}) cannot start at zero: draw markers instead")
            if fig.layout[value_axis].range is None:
                fig.layout[value_axis].rangemode = "tozero"
        spans.setdefault(xa, []).extend(_values(trace, "x"))
        spans.setdefault(ya, []).extend(_values(trace, "y"))
        if trace.type in ("scatter", "bar", "scattergl"):
            drawn.setdefault(xa, []).extend(finite_values(trace, "x"))
            drawn.setdefault(ya, []).extend(finite_values(trace, "y"))
            if trace.type == "bar":
                from_zero.add(xa if trace.orientation == "h" else ya)
        layout_axes |= {xa, ya}
    measured = fig.layout.margin.autoexpand is not False  # fixed margins (heatmaps) are set from their labels
    for a in layout_axes:
        axis = fig.layout[a]
        title = axis.title.text or ""
        if axis.range is None and axis.type != "log" and UNIT_TITLE.search(title):
            axis.range = UNIT_RANGE  # a bounded measure shows its whole range unless the user zooms
        if measured and axis.automargin is None:  # long tick labels widen the margin instead of leaving the figure
            axis.automargin = True
            if a.startswith("y") and axis.ticklabelstandoff is None:  # clear of the x axis's first label at the corner
                axis.ticklabelstandoff = 6
        if axis.exponentformat is None:
            axis.exponentformat = "power"
        if axis.overlaying and axis.tickmode is None:  # a second axis: round ticks of its own, not the first's grid
            axis.update(tickmode="auto", showgrid=False)
        round_ticks(axis, drawn.get(a, []), a in from_zero)
        if axis.type == "log" and axis.dtick is None and axis.tickvals is None:
            vals = spans.get(a, [])
            if vals and max(vals) / min(vals) >= 10:  # a tick every k decades, k so that labels stay apart
                decades = math.log10(max(vals) / min(vals))
                room = ((fig.layout.height or DEFAULT_HEIGHT) if a.startswith("y") else width) - 150
                axis.dtick = max(1, math.ceil(decades * LOG_TICK_PX / max(room * _share(fig, a), 1)))
    _wrap_title(fig, int(width / TITLE_CHAR_PX))
    named = sum(1 for t in fig.data if getattr(t, "name", None) and getattr(t, "showlegend", None) is not False)
    if named > len(TEN_COLORS) and fig.layout.colorway is None:  # plotly's ten colours would come round again
        fig.layout.colorway = colors(named)
    _legend_fits(fig, width)
    return fig


LEGEND_ROW_PX = 20  # one legend entry, stacked
LEGEND_MARK_PX = 46  # an entry's symbol and the gaps around it, in a row of entries
LEGEND_SHARE = 0.4  # a legend at the right may take this share of the width; a wider one goes under the plot


def legend_rows(names: list[str], room: int) -> int:
    """How many rows a horizontal legend of ``names`` takes in a plot ``room`` pixels wide:
    plotly gives every entry the width of the widest (its symbol and text)."""
    entry = LEGEND_MARK_PX + 7 * max((len(str(n)) for n in names), default=1)
    per_row = max(1, int(room // entry))
    return math.ceil(len(names) / per_row)


def _legend_fits(fig: go.Figure, width: int = HALF_PX) -> None:
    """Where the legend goes so that it is whole and covers nothing. A vertical legend stays at
    the right when its entries fit the plot's height, no right-hand axis is there and it takes
    at most :data:`LEGEND_SHARE` of the width (a half-width chart's plot was squeezed to a
    third by long names); otherwise
    (and for a legend a figure put under its plot) it goes in rows at the bottom of the figure,
    under the x axis's labels and title (plotly widens the bottom margin for it), and the figure
    grows by the rows' height, so the plot keeps its room: plotly scrolled a taller legend over
    what was under it, and a legend at y = -0.2 of the plot sat on a two-line axis title."""
    if fig.layout.showlegend is False:
        return
    names = [t.name for t in fig.data if getattr(t, "showlegend", None) is not False and getattr(t, "name", None)]
    if not names or (len(names) == 1 and fig.layout.showlegend is None and fig.layout.legend.orientation is None):
        return
    height = fig.layout.height or DEFAULT_HEIGHT
    legend, margin = fig.layout.legend, fig.layout.margin
    right_axis = any(
        fig.layout[k].side == "right" for k in fig.layout.to_plotly_json() if k.startswith("yaxis") and k != "yaxis"
    )
    if legend.orientation in (None, "v"):
        room = height - (margin.t or 100) - (margin.b or 80)
        wide = LEGEND_MARK_PX + 7 * max(len(str(n)) for n in names) > LEGEND_SHARE * width
        if len(names) * LEGEND_ROW_PX <= room and not right_axis and not wide:
            return
    elif legend.y is not None and legend.y >= 0:  # a row of entries above or inside the plot: its figure's choice
        return
    rows = legend_rows(names, width - (margin.l or 80) - (margin.r or 80))
    block = rows * LEGEND_ROW_PX + 10
    legend.update(
        orientation="h", x=0, xanchor="left", yref="container", y=0, yanchor="bottom", maxheight=block + 10
    )  # maxheight in pixels: never a scroll box
    fig.layout.height = height + block


LOG_TICK_PX = 24  # the least room between two labels of a log axis


def _share(fig: go.Figure, axis: str) -> float:
    """The fraction of the figure's plot area an axis spans (its domain; subplots have less)."""
    domain = fig.layout[axis].domain
    return (domain[1] - domain[0]) if domain else 1.0


def _pieces(text: str, chars: int) -> list[tuple[str, bool]]:
    """The units a title line is made of, each with whether it continues the unit before it
    without a space: phrases (broken after ", ", ": " or "; ") while they fit, else words; a word
    longer than a line (a folder's path) is broken after a "/" or "-", or cut, so that no line
    runs out of the figure."""
    out = []
    for piece in re.split(r"(?<=[,:;]) ", text):
        for word in [piece] if len(piece) <= chars else piece.split(" "):
            glued = False
            while len(word) > chars:
                cut = max(word.rfind("/", 0, chars), word.rfind("-", 0, chars)) + 1 or chars
                out.append((word[:cut], glued))
                word, glued = word[cut:], True
            out.append((word, glued))
    return out


def _greedy(pieces: list[tuple[str, bool]], chars: int) -> list[str]:
    lines, line = [], ""
    for word, glued in pieces:
        glue = "" if glued else " "
        if line and len(line) + len(glue) + len(word) > chars:
            lines.append(line)
            line = word
        else:
            line = f"{line}{glue}{word}" if line else word
    return [*lines, line]


def _wrap(text: str, chars: int) -> list[str]:
    """The fewest lines of at most ``chars`` characters, as even as they can be: the greedy
    wrap's number of lines, then the narrowest width that still needs no more (a title is not a
    long line and a stub). Phrases such as "layer 1 head 0" stay on one line where they can."""
    pieces = _pieces(text, chars)
    lines = _greedy(pieces, chars)
    if len(lines) < 2:
        return lines
    narrow = max(len(p) for p, _ in pieces)
    for width in range(max(narrow, len(text) // len(lines)), chars + 1):
        even = _greedy(pieces, width)
        if len(even) <= len(lines):
            return even
    return lines


def wrap_title(text: str, chars: int = TITLE_CHARS) -> str:
    """``text`` with line breaks (<br>) so that no line is longer than ``chars`` characters; a
    ``<sup>...</sup>`` line (a subtitle, in a smaller font) takes 1.4 times as many."""
    out = []
    for part in text.split("<br>"):
        sup = part.startswith("<sup>") and part.endswith("</sup>")
        inner = part[5:-6] if sup else part
        wrapped = _wrap(inner, int(chars * 1.4) if sup else chars)
        out += [f"<sup>{w}</sup>" for w in wrapped] if sup else wrapped
    return "<br>".join(out)


def _wrap_title(fig: go.Figure, chars: int = TITLE_CHARS) -> None:
    """Wrap a long title (a chart cuts it at its edges) and give it the room its lines take."""
    text = fig.layout.title.text
    if not text:
        return
    wrapped = wrap_title(text, chars)
    lines = wrapped.count("<br>") + 1
    fig.layout.title.text = wrapped
    if lines > 1:  # from the top down (plotly centres a title in the top margin and its first line rises out)
        # plotly puts the first line's baseline at y: a line's height below the top, and a gap
        fig.layout.title.update(yref="container", y=1 - 30 / (fig.layout.height or DEFAULT_HEIGHT), yanchor="top")
        top = 50 + TITLE_LINE_PX * lines
        if fig.layout.margin.t is None or fig.layout.margin.t < top:
            fig.layout.margin.t = top
