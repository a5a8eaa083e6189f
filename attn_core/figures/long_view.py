"""Figures of one head on a long input, from its blocked scores (``bilinear.blocked``,
``bilinear.long_map``), shared by the Heatmaps page, ``attn-lab export`` and the gallery:

- :func:`map_plot`: the multi-resolution map (pooled tiles, or a zoomed region at full
  resolution), the sink column (key 0) beside it on its own colour scale;
- :func:`rows_plot`: the entropy and sink mass of every query row against its position; its CSV
  is every query's top-k keys (``long_map.top_frame``);
- :func:`query_top_plot`: one query's top-k keys with their tokens;
- :func:`offsets_plot`: the mean weight on the key d positions back, d = 0..P-1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from attn_core.bilinear.blocked import RowStats
from attn_core.bilinear.long_map import LongMap, top_frame
from attn_core.figures.base import Plot
from attn_core.figures.layout import FULL_PX, WIDE_PX, fixed_margins
from attn_core.regularizers import head_label

HIGHLIGHT = "#d62728"
MAP_HEIGHT = 760


def _style(value: str, z: torch.Tensor) -> dict:
    if value == "scores":
        return dict(colorscale="RdBu", zmid=0.0)
    top = float(np.nanmax(z.numpy())) if bool(torch.isfinite(z).any()) else 1.0
    return dict(colorscale="Viridis", zmin=0.0, zmax=max(top, 1e-12))


SELECT_GRID = 40  # invisible points a side that make the map box-selectable (plotly selects no heatmap)


def _select_grid(lm: LongMap) -> go.Scatter:
    """Transparent points over the map: plotly offers a box selection only on traces with points,
    and a box drawn on the map is the page's zoom (its x and y ranges; the points are not read)."""
    ys = np.linspace(lm.rows[0], lm.rows[1] - 1, SELECT_GRID)
    xs = np.linspace(lm.key_first, lm.cols[1] - 1, SELECT_GRID)
    gx, gy = np.meshgrid(xs, ys)
    return go.Scatter(
        x=gx.ravel(), y=gy.ravel(), mode="markers", marker=dict(opacity=0, size=4), hoverinfo="skip", showlegend=False
    )


def map_plot(lm: LongMap, query: int | None = None, width: int = FULL_PX, selectable: bool = False) -> Plot:
    """The map's tiles at their positions (tile centres), the query's row outlined; with the
    sink apart, a narrow column of key 0 at the left (0..1 for A) and the map on the scale of
    its own cells (what is left beside the sink). ``selectable``: a drag draws a box (the page's
    zoom), through an invisible grid of points."""
    nr, nc = lm.cells.shape
    t = lm.tile
    y = lm.rows[0] + np.arange(nr) * t + (t - 1) / 2
    x = lm.key_first + np.arange(nc) * t + (t - 1) / 2
    what = "pattern A" if lm.value == "pattern" else "scores S"
    cell = "one cell per query × key" if t == 1 else f"{lm.pool} over {t}×{t} tiles"
    hover = "queries ≈ %{y}, keys ≈ %{x}" if t > 1 else "query %{y}, key %{x}"
    main = go.Heatmap(
        z=lm.cells.numpy(),
        x=x,
        y=y,
        hovertemplate=f"{hover}<br>{lm.pool if t > 1 else ''} %{{z:.4g}}<extra></extra>",
        colorbar=dict(title="A" if lm.value == "pattern" else "S"),
        **_style(lm.value, lm.cells),
    )
    if lm.sink is not None:
        fig = make_subplots(1, 2, column_widths=[0.04, 0.96], shared_yaxes=True, horizontal_spacing=0.015)
        sink_style = (
            dict(colorscale="Viridis", zmin=0.0, zmax=1.0) if lm.value == "pattern" else dict(colorscale="RdBu")
        )
        fig.add_trace(
            go.Heatmap(
                z=lm.sink.numpy()[:, None],
                x=[0],
                y=y,
                showscale=False,
                hovertemplate="queries ≈ %{y}, key 0 (sink)<br>%{z:.4g}<extra></extra>",
                **sink_style,
            ),
            1,
            1,
        )
        fig.add_trace(main, 1, 2)
        if selectable:
            fig.add_trace(_select_grid(lm), 1, 2)
        fig.update_xaxes(title_text="sink", showticklabels=False, row=1, col=1)
        fig.update_xaxes(title_text="key position", range=[lm.key_first - 0.5, lm.cols[1] - 0.5], row=1, col=2)
    else:
        fig = go.Figure(main)
        if selectable:
            fig.add_trace(_select_grid(lm))
        fig.update_xaxes(title_text="key position", range=[lm.cols[0] - 0.5, lm.cols[1] - 0.5])
    fig.update_yaxes(range=[lm.rows[1] - 0.5, lm.rows[0] - 0.5])
    fig.update_layout(yaxis_title_text="query position")
    if query is not None and lm.rows[0] <= query < lm.rows[1]:
        fig.add_hline(y=query, line=dict(color=HIGHLIGHT, width=1, dash="dot"))
    region = (
        ""
        if (lm.rows, lm.cols) == ((0, lm.n), (0, lm.n))
        else f", queries {lm.rows[0]}..{lm.rows[1] - 1} × keys {lm.cols[0]}..{lm.cols[1] - 1}"
    )
    fig.update_layout(
        title=f"{what} of {lm.n} tokens, {cell}{region}, layer {lm.layer} head {lm.head}"
        + (", sink (key 0) apart" if lm.sink is not None else ""),
        height=MAP_HEIGHT,
        dragmode="select" if selectable else None,
    )
    fixed_margins(fig, width=width)
    return Plot(
        f"long_{lm.value}_{head_label(lm.layer, lm.head)}_q{lm.rows[0]}-{lm.rows[1]}_k{lm.cols[0]}-{lm.cols[1]}",
        fig,
        lm.frame,
        meta=dict(
            view="long map", layer=lm.layer, head=lm.head, rows=list(lm.rows), cols=list(lm.cols), tile=t, pool=lm.pool
        ),
        width=width,
    )


def rows_plot(stats: RowStats, layer: int, labels: Sequence[str], width: int = FULL_PX) -> Plot:
    """Entropy (nats) and sink mass of every query row against its position; the CSV is every
    query's top-k keys with tokens, scores and weights."""
    pos = np.arange(stats.n)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=pos, y=stats.entropy.cpu().numpy(), name="entropy (nats)", mode="lines"))
    fig.add_trace(
        go.Scatter(x=pos, y=stats.sink.cpu().numpy(), name="sink mass (key 0)", mode="lines"), secondary_y=True
    )
    fig.update_xaxes(title_text="query position")
    fig.update_yaxes(title_text="entropy (nats)", secondary_y=False)
    fig.update_yaxes(title_text="sink mass", range=[0, 1], secondary_y=True)
    fig.update_layout(title=f"Entropy and sink mass of every query, layer {layer} head {stats.head}", height=380)
    fixed_margins(fig, width=width, colorbar=True)
    return Plot(
        f"long_rows_{head_label(layer, stats.head)}",
        fig,
        lambda: top_frame(stats, labels).assign(layer=layer),
        meta=dict(view="long rows", layer=layer, head=stats.head, k=int(stats.top_keys.shape[1])),
        width=width,
    )


def query_top_plot(stats: RowStats, layer: int, query: int, labels: Sequence[str], width: int = WIDE_PX) -> Plot:
    """Bars of the weights of ``query``'s top-k keys (position:token), best first."""
    top = top_frame(stats, labels, [query])
    fig = go.Figure(
        go.Bar(
            x=list(top["key_label"]),
            y=top["weight"].to_numpy(),
            customdata=top[["score", "offset"]].to_numpy(),
            hovertemplate="%{x}<br>A = %{y:.4f}<br>S = %{customdata[0]:.4g}, offset %{customdata[1]}<extra></extra>",
        )
    )
    fig.update_xaxes(type="category", title_text="key (position:token)")
    fig.update_yaxes(title_text="weight A", range=[0, 1])
    fig.update_layout(
        title=f"Top {len(top)} keys of query {labels[query]} (entropy {float(stats.entropy[query]):.3g} nats, "
        f"sink {float(stats.sink[query]):.3g}), layer {layer} head {stats.head}",
        height=420,
    )
    fixed_margins(fig, x_labels=list(top["key_label"]), width=width, colorbar=False)
    return Plot(
        f"long_top_{head_label(layer, stats.head)}_q{query}",
        fig,
        top.assign(layer=layer),
        meta=dict(view="long top keys", layer=layer, head=stats.head, query=query),
        width=width,
    )


def offsets_plot(stats: RowStats, layer: int, width: int = WIDE_PX) -> Plot:
    """The mean over query rows of the weight on key i - d, d = 0..P-1 (rows that see it)."""
    off = stats.offsets.cpu().double()
    seen = off.isfinite()
    mean = torch.where(seen, off, torch.zeros_like(off)).sum(0) / seen.sum(0).clamp_min(1)
    d = np.arange(off.shape[1])
    fig = go.Figure(go.Bar(x=-d, y=mean.numpy(), hovertemplate="offset %{x}<br>mean A = %{y:.4f}<extra></extra>"))
    fig.update_xaxes(title_text="offset d = key − query")
    fig.update_yaxes(title_text="mean weight A", range=[0, 1])
    fig.update_layout(title=f"Local offset profile, layer {layer} head {stats.head}", height=380)
    fixed_margins(fig, width=width, colorbar=False)
    import pandas as pd

    data = pd.DataFrame(
        dict(layer=layer, head=stats.head, offset=-d, mean_weight=mean.numpy(), rows=seen.sum(0).numpy())
    )
    return Plot(f"long_offsets_{head_label(layer, stats.head)}", fig, data, meta=dict(view="long offsets"), width=width)
