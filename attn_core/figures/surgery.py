"""Figures of head surgery and head diffing (attn_core.surgery): a head's attention before and
after an edit side by side, its modes before and after, the heads x heads distance matrix of a
layer with the matching marked, and the loss against the rank kept (experiments)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from attn_core.figures.base import PALETTE, Plot
from attn_core.figures.layout import FULL_PX, HALF_PX, fixed_margins, token_ticks
from attn_core.regularizers import head_label
from attn_core.surgery.diff import LayerDiff
from attn_core.surgery.modes import Modes

MATCH_MARK = "#d62728"


def pattern_pair_plot(before: torch.Tensor, after: torch.Tensor, labels: list[str], layer: int, head: int) -> Plot:
    """The head's attention A [T, T] (queries down, keys across) before and after the edit, on 0..1."""
    T = before.shape[-1]
    who = head_label(layer, head)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("before", "after"), horizontal_spacing=0.08)
    for col, A in ((1, before), (2, after)):
        fig.add_trace(
            go.Heatmap(
                z=A.numpy(),
                zmin=0.0,
                zmax=1.0,
                colorscale="Viridis",
                showscale=col == 2,
                colorbar=dict(title=dict(text="A", side="right"), thickness=14),
                hovertemplate="query %{y}, key %{x}<br>A %{z:.3f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="key", row=1, col=col, **token_ticks(labels))
        fig.update_yaxes(autorange="reversed", row=1, col=col, **token_ticks(labels))
    fig.update_yaxes(title_text="query", row=1, col=1)
    fig.update_layout(title=f"{who}: attention before and after the edit ({T} tokens)", height=460)
    fixed_margins(fig, width=FULL_PX)
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")

    def data() -> pd.DataFrame:
        return pd.DataFrame(
            dict(query=i.ravel(), key=j.ravel(), before=before.numpy().ravel(), after=after.numpy().ravel())
        )

    return Plot(f"edit_pattern_L{layer}H{head}", fig, data, meta=dict(layer=layer, head=head), width=FULL_PX)


def modes_plot(modes: Modes, factors: torch.Tensor) -> Plot:
    """Each mode's sigma before and |f| sigma after (singular values, or rotation planes' norms)."""
    before = modes.sigma.numpy()
    after = (modes.sigma * factors.abs()).numpy()
    what = "σ of the rotation plane (offset 0)" if modes.kind == "plane" else "singular value σ"
    fig = go.Figure(
        [
            go.Bar(x=modes.names, y=before, name="before", marker_color=PALETTE[1]),
            go.Bar(x=modes.names, y=after, name="after", marker_color=PALETTE[0]),
        ]
    )
    fig.update_layout(
        title=f"{head_label(modes.layer, modes.head)}: modes of B before and after",
        xaxis=dict(title="mode", type="category"),
        yaxis=dict(title=what),
        barmode="group",
        legend=dict(orientation="h", y=-0.25),
    )
    fixed_margins(fig, x_labels=modes.names, colorbar=False, width=HALF_PX)
    frame = pd.DataFrame(dict(mode=modes.names, before=before, after=after, factor=factors.numpy()))
    return Plot(f"edit_modes_L{modes.layer}H{modes.head}", fig, frame, meta=dict(layer=modes.layer, head=modes.head))


def diff_plot(ld: LayerDiff, a: str, b: str, width: int = HALF_PX) -> Plot:
    """Heads of A (rows) x heads of B (columns): the relative Frobenius distance of their B, the
    optimal matching outlined."""
    D = ld.distance
    ya = [f"A H{h}" for h in range(D.shape[0])]
    xb = [f"B H{h}" for h in range(D.shape[1])]
    fig = go.Figure(
        go.Heatmap(
            z=D,
            x=xb,
            y=ya,
            zmin=0.0,
            zmax=1.0,
            colorscale="Viridis_r",
            colorbar=dict(title=dict(text="distance", side="right"), thickness=14),
            hovertemplate="%{y} vs %{x}<br>distance %{z:.4f}<extra></extra>",
        )
    )
    for i, j in ld.pairs:  # the whole cell of a matched pair outlined (axes are categories: index +- 0.5)
        fig.add_shape(type="rect", x0=j - 0.5, x1=j + 0.5, y0=i - 0.5, y1=i + 0.5, line=dict(color=MATCH_MARK, width=3))
    if ld.pairs:
        fig.add_trace(
            go.Scatter(
                x=[xb[j] for _, j in ld.pairs],
                y=[ya[i] for i, _ in ld.pairs],
                mode="markers",
                marker=dict(symbol="circle", size=6, color=MATCH_MARK),
                name="matched",
                customdata=[float(D[i, j]) for i, j in ld.pairs],
                hovertemplate="matched: %{y} ↔ %{x}<br>distance %{customdata:.4f}<extra></extra>",
            )
        )
    n = max(D.shape)
    fig.update_layout(
        title=f"Layer {ld.layer}: ||B_a − B_b|| / (||B_a|| + ||B_b||), A = {a}, B = {b}",
        xaxis=dict(title="head of B (outlined: the matching)", type="category"),
        yaxis=dict(title="head of A", type="category", autorange="reversed"),
        height=max(380, min(900, 56 * n + 220)),  # cells near square at the page's width
        showlegend=False,
    )
    fixed_margins(fig, x_labels=xb, y_labels=ya, width=width)
    matched = dict(ld.pairs)
    rows = [
        dict(layer=ld.layer, head_a=i, head_b=j, distance=float(D[i, j]), matched=matched.get(i) == j)
        for i in range(D.shape[0])
        for j in range(D.shape[1])
    ]
    return Plot(f"diff_L{ld.layer}", fig, pd.DataFrame(rows), meta=dict(layer=ld.layer, a=a, b=b), width=width)


def loss_vs_rank_plot(frame: pd.DataFrame, title: str = "") -> Plot:
    """Loss against the rank kept, one line per head (``frame``: head, rank, loss; the full loss
    as a dotted line)."""
    fig = go.Figure()
    for k, (head, rows) in enumerate(frame.groupby("head", sort=False)):
        fig.add_trace(
            go.Scatter(
                x=rows["rank"], y=rows["loss"], mode="lines+markers", name=head, line_color=PALETTE[k % len(PALETTE)]
            )
        )
    if "full_loss" in frame:
        fig.add_hline(y=float(frame["full_loss"].iloc[0]), line=dict(color="grey", dash="dot"))
    fig.update_layout(
        title=title or "Loss against the rank of one head's B (others unedited)",
        xaxis=dict(title="rank R kept"),
        yaxis=dict(title="loss (nats)", type="log"),
        legend=dict(orientation="h", y=-0.25),
    )
    fixed_margins(fig, colorbar=False, width=FULL_PX)
    return Plot("edit_loss_vs_rank", fig, frame, width=FULL_PX)
