"""Figures of rotary heads' offset-dependent form B(delta) (``attn_core.bilinear.offsets``)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attn_core.figures.base import Plot
from attn_core.figures.layout import FULL_PX, fixed_margins
from attn_core.regularizers import head_label


def offset_spectrum_plot(frame: pd.DataFrame, reference: pd.DataFrame, layer: int, head: int) -> Plot:
    """Left: the top singular values of B(delta) against the offset delta = key - query.
    Right: the spectra no offset changes (the un-rotated W_Q W_K^T, and the offset-free part
    of a partially rotary head), to read the left panel against."""
    label = head_label(layer, head)
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.7, 0.3],
        shared_yaxes=True,
        subplot_titles=["σᵢ(B(δ)) against the offset δ", "without the offset"],
    )
    for i, part in frame.groupby("index"):
        fig.add_trace(
            go.Scatter(
                x=part["delta"],
                y=part["singular_value"],
                mode="lines",
                name=f"σ{i + 1}",
                legendgroup="offset",
                hovertemplate=f"σ{i + 1}(B(δ=%{{x}})) = %{{y:.4g}}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    for name, part in reference.groupby("part", sort=False):
        fig.add_trace(
            go.Scatter(
                x=part["index"] + 1,
                y=part["singular_value"],
                mode="markers+lines",
                name=name,
                hovertemplate=f"{name}: σ%{{x}} = %{{y:.4g}}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="δ = key position − query position", row=1, col=1)
    fig.update_xaxes(title_text="index i", row=1, col=2)
    fig.update_yaxes(title_text="σᵢ", type="log", row=1, col=1)
    fig.update_layout(title=f"{label}: the rotary form B(δ) = W_Q R(δ) W_Kᵀ/√d against the offset")
    data = pd.concat([frame.assign(part="B(delta)"), reference.assign(delta=None)], ignore_index=True)
    return Plot(f"offset_spectrum_L{layer}H{head}", fig, data, meta=dict(layer=layer, head=head), width=FULL_PX)


def pair_offset_plot(
    frame: pd.DataFrame, layer: int, head: int, query: str, key: str, actual: int | None = None
) -> Plot:
    """f(delta) = x B(delta) y^T of one query token and one key token against the offset; a
    dashed line marks ``actual``, the offset at which they meet in the input shown."""
    label = head_label(layer, head)
    fig = go.Figure(
        go.Scatter(
            x=frame["delta"],
            y=frame["score"],
            mode="lines+markers",
            marker=dict(size=4),
            hovertemplate="δ = %{x}: score %{y:.4g}<extra></extra>",
        )
    )
    if actual is not None:
        fig.add_vline(x=actual, line_dash="dash", line_color="grey", annotation_text=f"in the input: δ = {actual}")
    fig.update_layout(
        title=f"{label}: score of query {query!r} and key {key!r} against their offset",
        xaxis_title="δ = key position − query position",
        yaxis_title="f_x(y) = x B(δ) yᵀ (pre-softmax score)",
    )
    fixed_margins(fig, colorbar=False)
    return Plot(
        f"pair_offset_L{layer}H{head}", fig, frame.copy(), meta=dict(layer=layer, head=head, query=query, key=key)
    )
