"""Figures of one head's scores in parts (:func:`attn_core.bilinear.score_parts`): the per-token
gains of QK-norm as a factor beside the scores, the scores before or after a soft cap, the affine
form's terms (the bias terms' share of the scores), each query's mass on a learned sink beside
token 0's, and an MLA head's two terms (its absorbed B's and the rotary one)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attn_core.bilinear import ScoreParts
from attn_core.figures.base import Plot
from attn_core.figures.layout import fixed_margins, token_ticks

NORM_NOTE = {
    "head": "per head",
    "all": "across all heads: shared by the heads of a token",
    "latent": "MLA's latent norms: g_q of the query latent, g_kv of the key/value latent",
}


def gains_plot(parts: ScoreParts) -> Plot:
    """g_q(i) and g_k(j) per position: S_ij = g_q(i) g_k(j) x_i B~ x_j^T (QK-norm's per-token factor)."""
    pos = np.arange(len(parts.labels))
    fig = go.Figure(
        [
            go.Scatter(x=pos, y=parts.g_q.numpy(), mode="lines+markers", name="g_q(i), query side"),
            go.Scatter(x=pos, y=parts.g_k.numpy(), mode="lines+markers", name="g_k(j), key side"),
        ]
    )
    fig.update_layout(
        title=f"{'Latent' if parts.norm == 'latent' else 'QK-norm'} gains ({NORM_NOTE.get(parts.norm, parts.norm)}), layer {parts.layer} head {parts.head}",
        xaxis=dict(title="position", **token_ticks(parts.labels)),
        yaxis=dict(title="gain 1 / rms"),
        legend=dict(orientation="h"),  # two long names: in a row under the plot, where they fit whole
        height=420,
    )
    fixed_margins(fig)
    data = pd.DataFrame({"position": pos, "token": parts.labels, "g_q": parts.g_q.numpy(), "g_k": parts.g_k.numpy()})
    return Plot(f"gains_L{parts.layer}H{parts.head}", fig, data, meta=dict(norm=parts.norm))


def capped_plot(parts: ScoreParts, capped: bool = True) -> Plot:
    """The head's scores after the cap c tanh(S / c) (``capped``) or before it; hidden cells blank."""
    S = parts.capped if capped else parts.uncapped
    z = S.masked_fill(~parts.mask, math.nan).numpy()
    fig = go.Figure(go.Heatmap(z=z, colorscale="RdBu", zmid=0.0, colorbar=dict(title="S")))
    what = "after the cap" if capped else "before the cap"
    cap = f" (c = {parts.cap:g})" if parts.cap is not None else ""
    fig.update_layout(
        title=f"Scores {what}{cap}, layer {parts.layer} head {parts.head}",
        xaxis=dict(title="key y", side="bottom", **token_ticks(parts.labels)),
        yaxis=dict(title="query x", autorange="reversed", **token_ticks(parts.labels)),
        height=max(420, min(900, 24 * len(parts.labels) + 160)),
    )
    fixed_margins(fig)
    T = len(parts.labels)

    def table() -> pd.DataFrame:
        i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
        return pd.DataFrame({"query": i.ravel(), "key": j.ravel(), "score": z.ravel()})

    name = f"scores_{'capped' if capped else 'uncapped'}_L{parts.layer}H{parts.head}"
    return Plot(name, fig, table, meta=dict(capped=capped, cap=parts.cap))


TERMS = {
    "xx": "x_i B x_j (the bilinear form)",
    "xb": "x_i W_Q b_K (query by key bias)",
    "bx": "b_Q W_K^T x_j (query bias by key)",
    "bb": "b_Q b_K (bias by bias)",
}


def terms_plot(parts: ScoreParts) -> Plot:
    """The share of each of the affine form's four terms in the size of the scores (mean |term| over
    the visible cells, as a share of the four): S = X' B' X'^T split by the augmented row."""
    shares = parts.term_shares()
    names = list(shares)
    fig = go.Figure(go.Bar(x=[TERMS.get(k, k) for k in names], y=[shares[k] for k in names]))
    fig.update_layout(
        title=f"Terms of the affine form: the biases take {parts.bias_share:.0%} of the scores, "
        f"layer {parts.layer} head {parts.head}",
        yaxis=dict(title="share of mean |S|", range=[0, 1]),
        height=420,
    )
    fixed_margins(fig)
    data = pd.DataFrame(
        {"term": names, "meaning": [TERMS.get(k, k) for k in names], "share": [shares[k] for k in names]}
    )
    return Plot(f"bias_terms_L{parts.layer}H{parts.head}", fig, data, meta=dict(bias_share=parts.bias_share))


def sink_share_plot(parts: ScoreParts) -> Plot:
    """Per query: its mass on the head's learned sink (the softmax's extra column, outside B) and
    its weight on token 0."""
    if parts.sink_share is None:
        raise ValueError("this head has no learned sink")
    pos = np.arange(len(parts.labels))
    fig = go.Figure(
        [
            go.Scatter(x=pos, y=parts.sink_share.numpy(), mode="lines+markers", name="learned sink"),
            go.Scatter(x=pos, y=parts.token0_share.numpy(), mode="lines+markers", name="token 0"),
        ]
    )
    mean = float(parts.sink_share.mean())
    fig.update_layout(
        title=f"Each query's mass on the learned sink (mean {mean:.0%}) and on token 0, layer {parts.layer} "
        f"head {parts.head}",
        xaxis=dict(title="query position", **token_ticks(parts.labels)),
        yaxis=dict(title="attention mass", range=[0, 1]),
        height=420,
    )
    fixed_margins(fig)
    data = pd.DataFrame(
        {
            "position": pos,
            "token": parts.labels,
            "learned_sink": parts.sink_share.numpy(),
            "token_0": parts.token0_share.numpy(),
        }
    )
    return Plot(f"sink_share_L{parts.layer}H{parts.head}", fig, data, meta=dict(mean_learned=mean))


def mla_terms_plot(parts: ScoreParts) -> Plot:
    """An MLA head's scores in its two terms side by side: g_q g_kv x B y^T (the absorbed B) and the
    rotary term g_q x B_R(j - i) y^T; hidden cells blank, one colour scale for both."""
    from plotly.subplots import make_subplots

    zs = [t.masked_fill(~parts.mask, math.nan).numpy() for t in (parts.absorbed, parts.rotary)]
    top = float(np.nanmax(np.abs(np.stack(zs)))) or 1.0
    titles = ["absorbed B: g_q g_kv · x B yᵀ", "rotary term: g_q · x B_R(j − i) yᵀ"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.12)
    for c, z in enumerate(zs, start=1):
        fig.add_trace(
            go.Heatmap(
                z=z, colorscale="RdBu", zmid=0.0, zmin=-top, zmax=top, showscale=c == 2, colorbar=dict(title="S")
            ),
            row=1,
            col=c,
        )
        fig.update_xaxes(title="key y", **token_ticks(parts.labels), row=1, col=c)
        fig.update_yaxes(
            title="query x" if c == 1 else None, autorange="reversed", **token_ticks(parts.labels), row=1, col=c
        )
    fig.update_layout(
        title=f"The two terms of the scores (MLA), layer {parts.layer} head {parts.head}",
        height=max(420, min(900, 24 * len(parts.labels) + 160)),
    )
    fixed_margins(fig)
    T = len(parts.labels)

    def table() -> pd.DataFrame:
        i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
        return pd.DataFrame({"query": i.ravel(), "key": j.ravel(), "absorbed": zs[0].ravel(), "rotary": zs[1].ravel()})

    return Plot(f"mla_terms_L{parts.layer}H{parts.head}", fig, table, meta=dict(norm=parts.norm))
