"""Figures of the two ranks of a head (attn_core.bilinear.ranks): per head the effective rank of B
(weight space) beside that of the centred scores on probes (data space), the cumulative variance
of both spectra, and the gap over many heads (experiments)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attn_core.bilinear.ranks import Ranks
from attn_core.figures.base import Plot
from attn_core.figures.layout import FULL_PX, HALF_PX
from attn_core.regularizers import head_label

WEIGHT, DATA = "#0068c9", "#ff8700"


def ranks_plot(r: Ranks, width: int = FULL_PX) -> Plot:
    """Per head, side by side: above, the effective rank at ``r.frac`` of the variance of B and of
    the centred scores S_c (the mean over probes), with the rank cap of B; below, their stable
    ranks."""
    rows = pd.DataFrame(r.heads())
    labels = [head_label(l, h) for l, h in zip(rows["layer"], rows["head"])]
    share = f"{r.frac:.0%}"
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.6, 0.4])
    spaces = [("weight", "B", WEIGHT)] + ([("data", "scores S_c", DATA)] if r.data is not None else [])
    for space, name, colour in spaces:
        for row, col, what in ((1, f"{space}_rank", f"rank at {share}"), (2, f"{space}_stable_rank", "stable rank")):
            fig.add_trace(
                go.Bar(
                    x=labels,
                    y=rows[col],
                    name=name,
                    marker_color=colour,
                    legendgroup=space,
                    showlegend=row == 1,
                    hovertemplate=f"%{{x}} {name}: {what} %{{y:.3g}}<extra></extra>",
                ),
                row=row,
                col=1,
            )
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=rows["rank_cap"],
            mode="markers",
            name="rank cap of B",
            marker=dict(symbol="line-ew-open", color="grey", size=16, line=dict(width=2)),
            hovertemplate="%{x}: B has rank at most %{y}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    where = f"on {r.what}" if r.data is not None else "no probes, B only"
    fig.update_yaxes(title_text=f"components for {share}", row=1, col=1)
    fig.update_yaxes(title_text="stable rank", row=2, col=1)
    fig.update_xaxes(type="category", row=1, col=1)
    fig.update_xaxes(type="category", title_text="head", row=2, col=1)
    fig.update_layout(
        title=f"The two ranks of each head: B (weight space) and the centred scores S_c (data space, {where})",
        barmode="group",
        height=560,
    )
    return Plot("two_ranks", fig, rows, meta=dict(variance=r.frac, probes=r.n_probes, inputs=r.what), width=width)


def variance_plot(r: Ranks, layer: int, head: int, width: int = HALF_PX) -> Plot:
    """One head's cumulative share of the variance against the number of components, of B and of
    S_c (mean over probes), with the ``r.frac`` line that the effective rank crosses."""
    curves = pd.DataFrame(r.curves())
    part = curves[(curves["layer"] == layer) & (curves["head"] == head)]
    if part.empty:
        raise ValueError(f"no head L{layer}H{head} in these ranks")
    fig = go.Figure()
    for space, colour, name in (("weight", WEIGHT, "B"), ("data", DATA, "scores S_c")):
        rows = part[part["space"] == space]
        if rows.empty:
            continue
        fig.add_trace(
            go.Scatter(
                x=rows["components"],
                y=rows["variance"],
                mode="lines+markers",
                name=name,
                line=dict(color=colour),
                hovertemplate=f"{name}: %{{x}} components, %{{y:.1%}} of the variance<extra></extra>",
            )
        )
    fig.add_hline(y=r.frac, line=dict(color="grey", dash="dot", width=1))
    fig.update_layout(
        title=f"Cumulative variance of B and of S_c, {head_label(layer, head)}",
        xaxis=dict(title="components k"),
        yaxis=dict(title="share of the variance", range=[0, 1.02]),
        legend=dict(orientation="h", y=-0.25),
    )
    return Plot(f"variance_{head_label(layer, head)}", fig, part.copy(), meta=dict(variance=r.frac), width=width)


def gap_plot(frame: pd.DataFrame, width: int = HALF_PX) -> Plot:
    """Every head of several models: data-space effective rank (x) against weight-space (y), one
    colour per ``model``, the diagonal where the two agree; above it the weights need more
    components than the scores use. ``frame``: model, layer, head, weight_rank, data_rank."""
    fig = go.Figure()
    top = float(max(frame["weight_rank"].max(), frame["data_rank"].max(), 1)) + 1
    fig.add_trace(
        go.Scatter(x=[0, top], y=[0, top], mode="lines", line=dict(color="grey", dash="dot"), name="equal ranks")
    )
    for model, rows in frame.groupby("model", sort=False):
        fig.add_trace(
            go.Scatter(
                x=rows["data_rank"],
                y=rows["weight_rank"],
                mode="markers",
                name=str(model),
                customdata=[head_label(l, h) for l, h in zip(rows["layer"], rows["head"])],
                hovertemplate=f"{model} %{{customdata}}: S_c %{{x:.2f}}, B %{{y}}<extra></extra>",
            )
        )
    fig.update_layout(
        title="Weight-space against data-space effective rank, per head",
        xaxis=dict(title="effective rank of the scores S_c (mean over probes)", range=[0, top]),
        yaxis=dict(title="effective rank of B", range=[0, top]),
        legend=dict(orientation="h", y=-0.25),
        height=460,
    )
    return Plot("rank_gap", fig, frame.copy(), width=width)
