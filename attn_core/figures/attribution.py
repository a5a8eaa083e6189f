"""The "why this key" figures of the circuits (attn_core.circuits): the rank-1 terms of the top
keys' scores and what separates the winner from the runner-up, the token/position split at
layer 0, and value-weighted attention. Every builder returns a :class:`Plot` whose ``data`` is
the tidy table it draws."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attn_core.circuits.attribution import SPLIT_PARTS, Attribution
from attn_core.figures.base import Plot
from attn_core.figures.layout import COLORBAR_PX, FULL_PX, fixed_margins, token_ticks
from attn_core.regularizers import head_label

OTHER = "other directions"


def _key_names(frame: pd.DataFrame) -> list[str]:
    return [f"{r.label} ({r.key})" for r in frame.itertuples()]


# --- attribution --------------------------------------------------------------------------------


def attribution_plot(attr: Attribution, top: int = 8, n_terms: int = 8) -> Plot:
    """Stacked bars of the scores of the query's ``top`` keys, split into their rank-1 terms
    sigma_i (x . u_i)(y . v_i): the ``n_terms`` directions that matter most for these keys each
    get a colour, the rest are one "other directions" bar, the bias its own; a diamond marks
    each key's score (the sum)."""
    data = attr.frame(top)
    keys = data.drop_duplicates("key")[["key", "label", "score"]]
    names = _key_names(keys)
    by_dir = data[data["direction"] >= 0].groupby("direction")["contribution"].apply(lambda s: s.abs().max())
    chosen = set(by_dir.sort_values(ascending=False).index[:n_terms].tolist())
    fig = go.Figure()
    for d in sorted(chosen):
        part = data[data["direction"] == d]
        fig.add_trace(
            go.Bar(
                x=names,
                y=part["contribution"],
                name=part["term"].iloc[0] if attr.term_names else f"σ{d + 1} = {part['sigma'].iloc[0]:.3g}",
                hovertemplate=f"{part['term'].iloc[0]}: %{{y:.4g}}<extra>%{{x}}</extra>",
            )
        )
    rest = data[(data["direction"] >= 0) & ~data["direction"].isin(chosen)]
    if not rest.empty:
        summed = rest.groupby("key", sort=False)["contribution"].sum().reindex(keys["key"])
        fig.add_trace(
            go.Bar(
                x=names,
                y=summed.tolist(),
                name=OTHER,
                marker_color="lightgrey",
                hovertemplate=f"{OTHER}: %{{y:.4g}}<extra>%{{x}}</extra>",
            )
        )
    bias = data[data["direction"] < 0]
    if bias["contribution"].abs().max() > 0:
        fig.add_trace(
            go.Bar(
                x=names,
                y=bias["contribution"],
                name="bias",
                marker_color="black",
                hovertemplate="bias: %{y:.4g}<extra>%{x}</extra>",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=names,
            y=keys["score"],
            mode="markers",
            name="score f_x(y)",
            marker=dict(symbol="diamond", size=11, color="white", line=dict(color="black", width=2)),
            hovertemplate="f_x(y) = %{y:.4g}<extra>%{x}</extra>",
        )
    )
    capped = ""
    if attr.cap is not None:  # the terms add up to S before the cap; the model's score beside it
        fig.add_trace(
            go.Scatter(
                x=names,
                y=data.drop_duplicates("key")["capped_score"],
                mode="markers",
                name=f"capped {attr.cap:g} tanh(f / {attr.cap:g})",
                marker=dict(symbol="x", size=10, color="black"),
                hovertemplate="capped score = %{y:.4g}<extra>%{x}</extra>",
            )
        )
        capped = " (scores before the soft cap)"
    fig.update_layout(
        barmode="relative",
        xaxis_title="key y (best first)",
        yaxis_title="contribution to f_x(y)",
        title=f"Why these keys: rank-1 terms of B, layer {attr.layer} head {attr.head}, "
        f"query {attr.query} ({attr.meta.get('query_token', '')}){capped}",
    )
    fig.update_xaxes(type="category", tickangle=-45 if len(names) > 4 else 0)
    return Plot(
        f"attribution_{head_label(attr.layer, attr.head)}_q{attr.query}",
        fig,
        data,
        meta=dict(layer=attr.layer, head=attr.head, query=attr.query, top=top),
    )


def runner_up_plot(attr: Attribution, top: int = 12) -> Plot:
    """Per term, the winning key's contribution minus the runner-up's (the bars add up to the
    score margin): the directions that make the winner win point right."""
    data = attr.runner_up()
    shown = data.head(top).iloc[::-1]
    w, r = data.attrs.get("winner"), data.attrs.get("runner_up")
    fig = go.Figure(
        go.Bar(
            x=shown["difference"],
            y=shown["term"],
            orientation="h",
            marker_color=["#2ca02c" if v > 0 else "#d62728" for v in shown["difference"]],
            customdata=shown[["winner", "runner_up"]].to_numpy(),
            hovertemplate="%{y}: %{x:.4g}<br>winner %{customdata[0]:.4g}, "
            "runner-up %{customdata[1]:.4g}<extra></extra>",
        )
    )
    margin = float(data["difference"].sum()) if len(data) else math.nan
    fig.update_layout(
        title=f"Winner (key {w}) vs runner-up (key {r}): margin {margin:.4g}, "
        f"layer {attr.layer} head {attr.head}, query {attr.query}",
        xaxis_title="winner − runner-up",
        yaxis_title="term",
    )
    fig.update_yaxes(type="category")
    return Plot(
        f"runner_up_{head_label(attr.layer, attr.head)}_q{attr.query}",
        fig,
        data.reset_index(drop=True),
        meta=dict(layer=attr.layer, head=attr.head, query=attr.query, winner=w, runner_up=r),
    )


def token_position_plot(split: pd.DataFrame, top: int | None = 12) -> Plot:
    """Stacked bars of each key's layer-0 score split into token-token, token-position,
    position-token, position-position and bias parts (``circuits.token_position_split``), the
    ``top`` keys by score; a diamond marks the score."""
    shown = split.sort_values("score", ascending=False, kind="stable")
    shown = shown.head(top) if top else shown
    names = _key_names(shown)
    fig = go.Figure()
    for part in SPLIT_PARTS:
        fig.add_trace(
            go.Bar(x=names, y=shown[part], name=part, hovertemplate=f"{part}: %{{y:.4g}}<extra>%{{x}}</extra>")
        )
    fig.add_trace(
        go.Scatter(
            x=names,
            y=shown["score"],
            mode="markers",
            name="score",
            marker=dict(symbol="diamond", size=11, color="white", line=dict(color="black", width=2)),
        )
    )
    head, query = int(split["head"].iloc[0]), int(split["query"].iloc[0])
    fig.update_layout(
        barmode="relative",
        title=f"Token and position parts of f_x(y), layer 0 head {head}, query {query}",
        xaxis_title="key y (best first)",
        yaxis_title="contribution",
    )
    fig.update_xaxes(type="category", tickangle=-45 if len(names) > 8 else 0)
    return Plot(
        f"token_position_L0H{head}_q{query}",
        fig,
        split.copy(),
        meta=dict(layer=0, head=head, query=query),
        width=FULL_PX,
    )


# --- value-weighted attention -------------------------------------------------------------------


def value_weighted_plot(
    vw: dict, labels: list[str], layer: int, heads: list[int], head: int, width: int = FULL_PX
) -> Plot:
    """The pattern A beside the value-weighted attention A_ij ||v_j W_O|| of one head
    (``circuits.value_weighted``, computed for ``heads``); masked cells are blank. The panels
    share their rows (query labels on the left only) and each colour bar sits in the gap to the
    right of its own panel."""
    i = heads.index(head)
    A, W = vw["pattern"][i], vw["weighted"][i]
    T = A.shape[0]
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=["pattern A", "value-weighted A_ij ||v_j W_O||"],
        horizontal_spacing=0.16,
        shared_yaxes=True,
    )
    for c, (z, scale, title) in enumerate(((A, dict(zmin=0.0, zmax=1.0), "A"), (W, {}, "A·‖vW_O‖")), start=1):
        cells = [[float(z[q, k]) if k <= q else None for k in range(T)] for q in range(T)]
        fig.add_trace(
            go.Heatmap(
                z=cells,
                x=list(range(T)),
                y=list(range(T)),
                colorscale="Viridis",
                colorbar=dict(
                    x=0.43 if c == 1 else 1.01, xanchor="left", thickness=14, title=dict(text=title, side="right")
                ),
                **scale,
                hovertemplate="q %{y}, k %{x}: %{z:.4g}<extra></extra>",
            ),
            row=1,
            col=c,
        )
        fig.update_xaxes(title_text="key", row=1, col=c, **token_ticks(labels))
    fig.update_yaxes(autorange="reversed", title_text="query", row=1, col=1, **token_ticks(labels))
    fig.update_layout(
        title=f"Value-weighted attention, layer {layer} head {head}", height=max(420, min(900, 22 * T + 160))
    )
    fixed_margins(fig, width=width // 2)  # each panel is about half the chart wide
    fig.update_xaxes(
        tickangle=fig.layout.xaxis.tickangle,
        tickfont_size=fig.layout.xaxis.tickfont.size,
        tickvals=fig.layout.xaxis.tickvals,
        ticktext=fig.layout.xaxis.ticktext,
        row=1,
        col=2,
    )
    fig.update_layout(margin=dict(r=COLORBAR_PX))
    data = pd.DataFrame(
        [
            dict(
                layer=layer,
                head=head,
                query=q,
                key=k,
                query_label=labels[q],
                key_label=labels[k],
                prob=float(A[q, k]),
                value_norm=float(vw["value_norms"][i, k]),
                weighted=float(W[q, k]),
            )
            for q in range(T)
            for k in range(q + 1)
        ]
    )
    return Plot(f"value_weighted_{head_label(layer, head)}", fig, data, meta=dict(layer=layer, head=head), width=width)
