"""Figures of the bilinear form (attn_core.bilinear): heatmaps of f_x(y) in the sequence,
vocabulary and positional views with a highlighted query, the per-query slice, the long-input
view (exact window, top-k keys, pooled overview), singular-value spectra, eigenvalues in the complex plane, concentration tables and head-detector grids.
Every builder returns a :class:`Plot` whose ``data`` is the tidy table it draws."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from attn_core.bilinear import DETECTORS, LongView, View
from attn_core.figures.base import Plot
from attn_core.figures.layout import (
    FULL_PX,
    HALF_PX,
    TITLE_CHAR_PX,
    TITLE_LINE_PX,
    WIDE_PX,
    fixed_margins,
    short_tick,
    token_ticks,
    wrap_title,
)
from attn_core.figures.tables import cell_text
from attn_core.regularizers import head_label

# What a heatmap shows, and its name in a choice: the scores S = f_x(y) or the pattern A.
VALUE_LABELS = {"scores": "scores S = f_x(y)", "pattern": "pattern A"}
VALUES = tuple(VALUE_LABELS)
# Axis tick labels are drawn for at most this many rows/columns; cell text for at most this many cells.
MAX_CELL_TEXT = 400
CELL_TEXT_PX = 34  # a cell narrower than this cannot hold "-0.02" at 9 px: neighbours' numbers ran together
MAX_HOVER_CELLS = 40_000
KIND_TITLE = {"sequence": "Sequence view", "vocabulary": "Vocabulary view", "positional": "Positional view"}
HIGHLIGHT = "#d62728"
SQUARE_KINDS = ("vocabulary", "positional")  # views whose rows and columns are the same tokens or positions
TABLE_ROW_PX = 24


def _heat_style(value: str) -> dict:
    if value not in VALUES:
        raise ValueError(f"value must be one of {VALUES}, got {value!r}")
    if value == "scores":
        return dict(colorscale="RdBu", zmid=0.0, colorbar=dict(title="f_x(y)"))
    return dict(colorscale="Viridis", zmin=0.0, zmax=1.0, colorbar=dict(title="A"))


def _heatmap(z: torch.Tensor, value: str, queries: list[str], keys: list[str], first: int = 0) -> go.Heatmap:
    """A heatmap of z [nq, nk] (NaN cells blank) at positions first.., hover naming both tokens
    while the cells are few. numpy arrays throughout: plotly validates and sends them as typed
    arrays, where lists cost a Python call per cell (the head-change budget of the dashboard)."""
    nq, nk = z.shape
    hover = None
    if nq * nk <= MAX_HOVER_CELLS:
        hover = np.char.add(np.char.add(np.array(queries)[:, None], " → "), np.array(keys)[None, :])
    heat = go.Heatmap(
        z=z.numpy(),
        x=np.arange(first, first + nk),
        y=np.arange(first, first + nq),
        hovertext=hover,
        hovertemplate=("%{hovertext}" if hover is not None else "q %{y}, k %{x}") + "<br>%{z:.4g}<extra></extra>",
        **_heat_style(value),
    )
    if nq * nk <= MAX_CELL_TEXT:
        heat.update(texttemplate="%{z:.2f}", textfont=dict(size=9))
    return heat


def _fit_cell_text(fig: go.Figure, width: int, n_columns: int) -> None:
    """No cell numbers where a cell (margins set) is narrower than :data:`CELL_TEXT_PX`; hover has them."""
    m = fig.layout.margin
    if (width - (m.l or 0) - (m.r or 0)) / max(n_columns, 1) < CELL_TEXT_PX:
        fig.update_traces(texttemplate=None, selector=dict(type="heatmap"))


def _outline(fig: go.Figure, x0: float, x1: float, y0: float, y1: float, dash: str | None = None) -> None:
    fig.add_shape(
        type="rect",
        x0=x0,
        x1=x1,
        y0=y0,
        y1=y1,
        line=dict(color=HIGHLIGHT, width=3 if dash is None else 2, dash=dash),
        fillcolor="rgba(0,0,0,0)",
    )


def view_plot(view: View, head: int, query: int | None = None, value: str = "scores", width: int = HALF_PX) -> Plot:
    """Heatmap of S (``value="scores"``, diverging around 0) or A (``"pattern"``) of one head of
    any view; hidden (masked) cells are blank; ``query`` outlines that row. ``width``: the
    chart's width on its page (px), which its tick labels are fitted to."""
    _heat_style(value)
    i = view.head_index(head)
    z = (view.scores if value == "scores" else view.pattern)[i].masked_fill(~view.mask, math.nan)
    nq, nk = z.shape
    fig = go.Figure(_heatmap(z, value, view.queries, view.keys))
    if query is not None:
        q = view.check_query(query)
        _outline(fig, -0.5, nk - 0.5, q - 0.5, q + 0.5)
    what = "scores f_x(y) = x B yᵀ" if value == "scores" else "pattern A"
    note = f" ({view.meta['note']})" if view.meta.get("note") else ""
    fig.update_layout(
        title=f"{KIND_TITLE[view.kind]}: {what}, layer {view.layer} head {head}{note}",
        xaxis=dict(title="key y", side="bottom", **token_ticks(view.keys)),
        yaxis=dict(title="query x", autorange="reversed", **token_ticks(view.queries)),
        height=max(420, min(900, 24 * nq + 160)),
    )
    fixed_margins(fig, width=width)
    if view.kind in SQUARE_KINDS:  # rows and columns are the same things: square cells, the height to match
        m = fig.layout.margin
        lines = wrap_title(fig.layout.title.text, int(width / TITLE_CHAR_PX)).count("<br>") + 1
        top = max(m.t, 50 + TITLE_LINE_PX * lines) if lines > 1 else m.t  # the room a wrapped title takes (finish)
        fig.update_layout(height=int(top + m.b + (width - m.l - m.r) * nq / nk), margin_t=top)
        fig.update_yaxes(scaleanchor="x", scaleratio=1, constrain="domain")
        fig.update_xaxes(constrain="domain")
        fixed_margins(fig, width=width)
    _fit_cell_text(fig, width, nk)
    highlighted = view.check_query(query) if query is not None else -1

    def data() -> pd.DataFrame:
        frame = view.frame(head)
        frame["highlighted"] = frame["query"] == highlighted
        return frame

    return Plot(
        f"{view.kind}_{value}_{head_label(view.layer, head)}",
        fig,
        data,
        meta=dict(view=view.kind, layer=view.layer, head=head, query=query, value=value, **view.meta),
        width=width,
    )


def query_plot(
    view: View, head: int, query: int, sort: bool = True, top: int | None = 64, width: int = WIDE_PX
) -> Plot:
    """Bar chart of the per-query slice f_x(y) over the keys x sees (sorted by score unless
    ``sort`` is False; at most ``top`` bars, the CSV has them all), coloured by A."""
    row = view.row(head, query, sort=sort)
    shown = row.head(top) if top else row
    q = view.check_query(query)
    # a category axis merges equal labels, so repeated names get their key index
    names = shown["label"] if shown["label"].is_unique else [f"{r.label} ({r.key})" for r in shown.itertuples()]
    fig = go.Figure(
        go.Bar(
            x=list(names),
            y=shown["score"],
            marker=dict(color=shown["prob"], colorscale="Viridis", cmin=0, cmax=1, colorbar=dict(title="A")),
            customdata=shown[["prob", "rank"]].to_numpy(),
            hovertemplate="%{x}<br>f_x(y) = %{y:.4g}<br>A = %{customdata[0]:.3f}, rank %{customdata[1]}<extra></extra>",
        )
    )
    cut = f", top {top} of {len(row)}" if top and len(row) > top else ""
    fig.update_layout(
        title=f"f_x(y) for x = {view.queries[q]} ({view.kind} view, layer {view.layer} head {head}{cut})",
        xaxis_title="key y" + (" (sorted by score)" if sort else ""),
        yaxis_title="f_x(y)",
    )
    fig.update_xaxes(type="category")
    fixed_margins(fig, x_labels=list(names), width=width)
    data = row.assign(layer=view.layer, head=head, query=q, query_label=view.queries[q])
    return Plot(
        f"query_{view.kind}_{head_label(view.layer, head)}_q{q}",
        fig,
        data,
        meta=dict(view=view.kind, layer=view.layer, head=head, query=q, sort=sort),
        width=width,
    )


# --- long inputs (attn_core.bilinear.long): never n^2 cells ------------------------------------


def window_plot(lv: LongView, value: str = "scores", width: int = HALF_PX) -> Plot:
    """Heatmap of the exact S or A of the window lo..hi around the query of a long input (axes
    in absolute positions, hidden cells blank, the query's row outlined)."""
    _heat_style(value)
    z = (lv.window_scores if value == "scores" else lv.window_pattern).masked_fill(~lv.window_mask, math.nan)
    labels = lv.window_labels
    fig = go.Figure(_heatmap(z, value, labels, labels, first=lv.lo))  # hover: the whole labels
    _outline(fig, lv.lo - 0.5, lv.hi + 0.5, lv.query - 0.5, lv.query + 0.5)
    what = "scores f_x(y)" if value == "scores" else "pattern A"
    ticks = [short_tick(s) for s in labels]  # one long token must not squeeze the heatmap
    fig.update_layout(
        title=f"Window {lv.lo}..{lv.hi} of {lv.n} tokens: {what}, layer {lv.layer} head {lv.head}",
        xaxis=dict(title="key y", **token_ticks(ticks, lv.lo)),
        yaxis=dict(title="query x", autorange="reversed", **token_ticks(ticks, lv.lo)),
        height=max(420, min(900, 12 * len(labels) + 200)),
    )
    fixed_margins(fig, width=width)
    _fit_cell_text(fig, width, len(labels))

    def data() -> pd.DataFrame:
        frame = lv.window_frame()
        frame["highlighted"] = frame["query"] == lv.query
        return frame

    return Plot(
        f"window_{value}_{head_label(lv.layer, lv.head)}_q{lv.query}",
        fig,
        data,
        meta=dict(view="window", layer=lv.layer, head=lv.head, query=lv.query, lo=lv.lo, hi=lv.hi, value=value),
        width=width,
    )


def overview_plot(lv: LongView, value: str = "pattern", width: int = FULL_PX) -> Plot:
    """The whole n x n matrix pooled into lv.n_blocks^2 cells of lv.block x lv.block positions
    (max-pooling by default: a sharp head stays visible); the query's block row is outlined and
    the exact window dashed."""
    _heat_style(value)
    z = lv.overview_pattern if value == "pattern" else lv.overview_scores
    nb, b = lv.n_blocks, lv.block
    centre = np.arange(nb) * b + (b - 1) / 2
    heat = go.Heatmap(
        z=z.numpy(),
        x=centre,
        y=centre,
        hovertemplate=f"queries ≈ %{{y}}, keys ≈ %{{x}} ({b}×{b} block)<br>{lv.pool} %{{z:.4g}}<extra></extra>",
        **_heat_style(value),
    )
    fig = go.Figure(heat)
    top = (lv.query // b) * b
    _outline(fig, -0.5, lv.n - 0.5, top - 0.5, min(lv.n, top + b) - 0.5)
    _outline(fig, lv.lo - 0.5, lv.hi + 0.5, lv.lo - 0.5, lv.hi + 0.5, dash="dot")
    what = "scores S" if value == "scores" else "pattern A"
    fig.update_layout(
        title=f"Overview: {what} {lv.pool}-pooled over {b}×{b} blocks ({nb}×{nb} of {lv.n}×{lv.n}), "
        f"layer {lv.layer} head {lv.head}",
        xaxis=dict(title="key position", range=[-0.5, lv.n - 0.5]),
        yaxis=dict(title="query position", range=[lv.n - 0.5, -0.5]),
        height=600,
    )
    fixed_margins(fig, width=width)
    return Plot(
        f"overview_{value}_{head_label(lv.layer, lv.head)}",
        fig,
        lv.overview_frame,
        meta=dict(view="overview", layer=lv.layer, head=lv.head, query=lv.query, block=b, pool=lv.pool, value=value),
        width=width,
    )


def top_keys_plot(lv: LongView, width: int = WIDE_PX) -> Plot:
    """Bars of f_x(y) for the k keys the query attends to most, anywhere in the input, best
    first, coloured by A."""
    top = lv.top
    fig = go.Figure(
        go.Bar(
            x=list(top["label"]),
            y=top["score"].to_numpy(),
            marker=dict(color=top["prob"].to_numpy(), colorscale="Viridis", cmin=0, cmax=1, colorbar=dict(title="A")),
            customdata=top[["prob", "rank"]].to_numpy(),
            hovertemplate="%{x}<br>f_x(y) = %{y:.4g}<br>A = %{customdata[0]:.3f}, rank %{customdata[1]}<extra></extra>",
        )
    )
    label = lv.labels[lv.query]
    fig.update_layout(
        title=f"Top {len(top)} keys of x = {label} by attention ({lv.query + 1} visible), layer {lv.layer} head {lv.head}",
        xaxis_title="key y (position:token)",
        yaxis_title="f_x(y)",
    )
    fig.update_xaxes(type="category")
    fixed_margins(fig, x_labels=list(top["label"]), width=width)
    data = top.assign(layer=lv.layer, head=lv.head, query=lv.query, query_label=label)
    return Plot(
        f"topk_{head_label(lv.layer, lv.head)}_q{lv.query}",
        fig,
        data,
        meta=dict(view="top_keys", layer=lv.layer, head=lv.head, query=lv.query, k=len(top)),
        width=width,
    )


def spectrum_plot(frame: pd.DataFrame, normalized: bool = False, small_multiples: bool = False) -> Plot:
    """Singular values of B per head on a log scale (``attn_core.bilinear.spectrum_frame``),
    all heads overlaid or one panel per layer; ``normalized`` divides by sigma_1."""
    col = "normalized" if normalized else "singular_value"
    layers = sorted(frame["layer"].unique())
    fig = (
        make_subplots(rows=1, cols=len(layers), shared_yaxes=True, subplot_titles=[f"layer {l}" for l in layers])
        if small_multiples
        else go.Figure()
    )
    # Zeros (beyond a factored head's rank) have no logarithm; they are left out of the plot.
    positive = frame[frame[col] > 0]
    for (layer, head), part in positive.groupby(["layer", "head"]):
        trace = go.Scatter(
            x=part["index"] + 1,
            y=part[col],
            mode="lines+markers",
            name=head_label(layer, head),
            hovertemplate=f"{head_label(layer, head)}: σ_%{{x}} = %{{y:.4g}}<extra></extra>",
        )
        if small_multiples:
            fig.add_trace(trace, row=1, col=layers.index(layer) + 1)
        else:
            fig.add_trace(trace)
    fig.update_yaxes(type="log")
    fig.update_xaxes(title_text="index i")
    heads = frame[["layer", "head"]].drop_duplicates()
    which = f", {head_label(*heads.iloc[0])}" if len(heads) == 1 else " per head"
    fig.update_layout(
        title=f"Singular values of B{which}" + (" (σ_i / σ_1)" if normalized else ""),
        yaxis_title="σ_i / σ_1" if normalized else "σ_i",
    )
    # the CSV numbers them as the plot does: σ_1 is the largest (maths.md), λ_1 likewise
    return Plot("spectrum", fig, frame.assign(index=frame["index"] + 1), meta=dict(normalized=normalized))


def eigen_plot(frame: pd.DataFrame) -> Plot:
    """Eigenvalues of B per head in the complex plane (``attn_core.bilinear.eigen_frame``).
    Mostly positive real eigenvalues mean x B xᵀ > 0: the head attends to its own kind."""
    fig = go.Figure()
    for (layer, head), part in frame.groupby(["layer", "head"]):
        part = part[part["modulus"] > 0]
        fig.add_trace(
            go.Scatter(
                x=part["real"],
                y=part["imag"],
                mode="markers",
                name=head_label(layer, head),
                hovertemplate=f"{head_label(layer, head)}: %{{x:.3g}} %{{y:+.3g}}i<extra></extra>",
            )
        )
    fig.add_hline(y=0, line=dict(color="grey", width=1))
    fig.add_vline(x=0, line=dict(color="grey", width=1))
    fig.update_layout(title="Eigenvalues of B per head", xaxis_title="Re λ", yaxis_title="Im λ", yaxis_scaleanchor="x")
    return Plot("eigenvalues", fig, frame.copy())


def eigen_sym_plot(table: pd.DataFrame) -> Plot:
    """Eigenvalues of the symmetric part (B + Bᵀ)/2 per head, in descending order, numbered from
    1 like the singular values (λ_1 the largest). They bound x B xᵀ over unit x (a token's score against itself): positive ones are directions a token
    attends to its own kind along, negative ones directions it avoids. ``table`` has one row per
    head with ``layer``, ``head`` and the list ``eigenvalues_sym`` (``bilinear.spectrum_rows``)."""
    data = pd.DataFrame(
        [
            {"layer": r.layer, "head": r.head, "index": i, "eigenvalue": float(v)}
            for r in table.itertuples()
            for i, v in enumerate(r.eigenvalues_sym, start=1)  # λ_1 ≥ λ_2 ≥ ..., as σ_1 ≥ σ_2 ≥ ...
        ]
    )
    fig = go.Figure()
    for (layer, head), part in data.groupby(["layer", "head"]):
        fig.add_trace(
            go.Scatter(
                x=part["index"],
                y=part["eigenvalue"],
                mode="lines+markers",
                name=head_label(layer, head),
                hovertemplate=f"{head_label(layer, head)} λ_%{{x}}: %{{y:.4g}}<extra></extra>",
            )
        )
    fig.add_hline(y=0, line=dict(color="grey", width=1))
    fig.update_layout(
        title="Eigenvalues of the symmetric part (B + Bᵀ)/2 per head",
        xaxis_title="index i (descending)",
        yaxis_title="λ_i of (B + Bᵀ)/2",
    )
    return Plot("eigenvalues_sym", fig, data, width=FULL_PX)


def concentration_plot(table: pd.DataFrame) -> Plot:
    """The concentration table (``View.concentration_table`` or ``bilinear.concentration_table``):
    per head and metric, mean / min / max over query rows (and the sink keys left out, if any)."""
    cols = [c for c in ("view", "layer", "head", "metric", "mean", "min", "max", "sink_keys") if c in table]
    cells = [table[c].map(cell_text) for c in cols]  # four significant digits, a dash where missing
    # every row shown (a table taller than its figure scrolls, and an export cuts it), each
    # column as wide as its widest entry
    widths = [max(len(c), *(len(v) for v in col)) if len(col) else len(c) for c, col in zip(cols, cells)]
    fig = go.Figure(
        go.Table(
            columnwidth=widths,
            header=dict(values=cols, align="left", fill_color="rgba(128,128,128,0.25)", height=TABLE_ROW_PX),
            cells=dict(values=cells, align="left", height=TABLE_ROW_PX),
        )
    )
    fig.update_layout(
        title="Concentration of f_x per head (rows with ≥ 2 visible keys"
        + (", without each head's sink keys, renormalized)" if "sink_keys" in table else ")"),
        height=110 + TABLE_ROW_PX * (len(table) + 2),
        margin=dict(t=70, b=20),
    )
    return Plot("concentration", fig, table[cols].copy(), width=FULL_PX)


def heads_plot(detectors: pd.DataFrame) -> Plot:
    """One layer x head grid per detector (``attn_core.bilinear.head_detectors``), each cell the
    head's score in [0, 1]."""
    names = [d for d in DETECTORS if d in set(detectors["detector"])]
    fig = make_subplots(
        rows=1, cols=len(names), subplot_titles=[n.replace("_", " ") for n in names], horizontal_spacing=0.06
    )
    for c, name in enumerate(names, start=1):
        grid = detectors[detectors["detector"] == name].pivot(index="layer", columns="head", values="score")
        fig.add_trace(
            go.Heatmap(
                z=grid.to_numpy().tolist(),
                x=[f"H{h}" for h in grid.columns],
                y=[f"L{l}" for l in grid.index],
                zmin=0,
                zmax=1,
                colorscale="Viridis",
                showscale=c == len(names),
                texttemplate="%{z:.2f}",
                hovertemplate=f"{name}: %{{y}} %{{x}} = %{{z:.3f}}<extra></extra>",
            ),
            row=1,
            col=c,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=c)
    fig.update_layout(
        title="Head detectors (attention mass on the detection pattern)",
        height=max(300, 120 + 50 * detectors["layer"].nunique()),
    )
    return Plot("heads", fig, detectors.copy(), width=FULL_PX)
