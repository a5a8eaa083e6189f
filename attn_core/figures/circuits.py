"""Figures of the circuits (attn_core.circuits): OV spectra, the full OV circuit, the
QK-versus-OV positivity scatter, composition heatmaps and the head graph. Every builder returns
a :class:`Plot` whose ``data`` is the tidy table it draws. The "why this key" figures
(attribution, runner-up, token/position split, value-weighted attention) are in
:mod:`attn_core.figures.attribution`."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attn_core.circuits.composition import KINDS, Composition
from attn_core.figures.base import PALETTE, Plot
from attn_core.figures.layout import (
    CHAR_PX,
    COLORBAR_PX,
    FULL_PX,
    TITLE_CHAR_PX,
    TITLE_PX,
    fixed_margins,
    place_labels,
    token_ticks,
)
from attn_core.figures.scales import colors
from attn_core.regularizers import head_label

MAX_CELL_TEXT = 400
CELL_TEXT_PX = 34  # a cell narrower than this does not write its value ("−0.05" at 10 px)
KIND_NAME = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}


# --- OV -----------------------------------------------------------------------------------------


def ov_spectrum_plot(frame: pd.DataFrame, normalized: bool = False) -> Plot:
    """Singular values of W_OV = W_V W_O per head on a log scale (``circuits.ov_spectrum_frame``)."""
    col = "normalized" if normalized else "singular_value"
    fig = go.Figure()
    for (layer, head), part in frame[frame[col] > 0].groupby(["layer", "head"]):
        fig.add_trace(
            go.Scatter(
                x=part["index"] + 1,
                y=part[col],
                mode="lines+markers",
                name=head_label(layer, head),
                hovertemplate=f"{head_label(layer, head)}: σ_%{{x}} = %{{y:.4g}}<extra></extra>",
            )
        )
    fig.update_yaxes(type="log")
    fig.update_layout(
        title="Singular values of W_OV = W_V W_O per head" + (" (σ_i / σ_1)" if normalized else ""),
        xaxis_title="index i",
        yaxis_title="σ_i / σ_1" if normalized else "σ_i",
    )
    return Plot("ov_spectrum", fig, frame.copy(), meta=dict(normalized=normalized), width=FULL_PX)


def ov_circuit_plot(matrix, labels: list[str], layer: int, head: int, copying_score: float | None = None) -> Plot:
    """Heatmap of the full OV circuit E W_V W_O U (rows: the token attended to, columns: the
    logit it raises), diverging around 0; a copying head has a bright diagonal."""
    z = [list(map(float, row)) for row in (matrix.tolist() if hasattr(matrix, "tolist") else matrix)]
    n = len(z)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(n)),
            y=list(range(n)),
            colorscale="RdBu",
            zmid=0.0,
            colorbar=dict(title="logit"),
            hovertemplate="attend %{y} → logit %{x}: %{z:.4g}<extra></extra>",
        )
    )
    if n * n <= MAX_CELL_TEXT:
        fig.data[0].update(texttemplate="%{z:.2f}", textfont=dict(size=9))
    score = f", copying score {copying_score:.3f}" if copying_score is not None else ""
    fig.update_layout(
        title=f"Full OV circuit E W_OV U, layer {layer} head {head}{score}",
        xaxis=dict(title="output logit", **token_ticks(labels)),
        yaxis=dict(title="token attended to", autorange="reversed", **token_ticks(labels)),
        height=max(420, min(900, 18 * n + 160)),
    )
    fixed_margins(fig, width=FULL_PX)
    data = pd.DataFrame(
        [
            dict(
                layer=layer,
                head=head,
                source=i,
                source_label=labels[i],
                target=j,
                target_label=labels[j],
                value=z[i][j],
            )
            for i in range(n)
            for j in range(n)
        ]
    )
    return Plot(
        f"ov_circuit_{head_label(layer, head)}",
        fig,
        data,
        meta=dict(layer=layer, head=head, copying_score=copying_score),
        width=FULL_PX,
    )


def positivity_plot(table: pd.DataFrame, qk_column: str = "qk_positivity") -> Plot:
    """Every head's QK positivity (x) against its OV copying score (y), both in [-1, 1]
    (``circuits.head_circuits``); heads that attend to and copy the same token sit top right,
    in the dotted region (both above 0.5, in the legend). ``qk_column`` may name another
    positivity column. When the table has ``qk_positivity_composed`` (and ``writer``:
    ``circuits.composed_qk_positivities`` merged in), each such head also gets an open circle
    there and an arrow from its direct point: induction heads move to the corner. Heads that sit
    on the same spot share one label (``base.place_labels``)."""
    data = table.drop(columns=[c for c in ("ov_singular_values",) if c in table]).copy()
    x_range, y_range = (-1.1, 1.1), (-1.1, 1.2)
    fig = go.Figure()
    labels = []
    n_layers = data["layer"].nunique()
    shades = [PALETTE[2 * i] for i in range(n_layers)] if 2 * n_layers <= len(PALETTE) else colors(n_layers)
    for i, (layer, part) in enumerate(data.groupby("layer")):
        fig.add_trace(
            go.Scatter(
                x=part[qk_column],
                y=part["copying_score"],
                mode="markers",
                text=[head_label(layer, h) for h in part["head"]],
                name=f"layer {layer}",
                marker=dict(size=11, color=shades[i]),
                hovertemplate="%{text}: QK %{x:.3f}, OV %{y:.3f}<extra></extra>",
            )
        )
        labels += [(getattr(r, qk_column), r.copying_score, head_label(layer, r.head)) for r in part.itertuples()]
    if "qk_positivity_composed" in data and data["qk_positivity_composed"].notna().any():
        # the same heads' QK positivity read through their strongest K-composition writer
        part = data[data["qk_positivity_composed"].notna()]
        names = [
            f"{head_label(r.layer, r.head)} via {r.writer}" if "writer" in part else head_label(r.layer, r.head)
            for r in part.itertuples()
        ]
        fig.add_trace(
            go.Scatter(
                x=part["qk_positivity_composed"],
                y=part["copying_score"],
                mode="markers",
                marker=dict(size=11, symbol="circle-open", color="#d62728", line=dict(width=2)),
                text=names,
                name="QK read through the K-composition writer (arrow: from the direct QK)",
                hovertemplate="%{text}: QK %{x:.3f}, OV %{y:.3f}<extra></extra>",
            )
        )
        for r, name in zip(part.itertuples(), names):
            fig.add_annotation(
                x=r.qk_positivity_composed,
                y=r.copying_score,
                ax=getattr(r, qk_column),
                ay=r.copying_score,
                xref="x",
                yref="y",
                axref="x",
                ayref="y",
                text="",
                showarrow=True,
                arrowhead=2,
                arrowwidth=1,
                arrowcolor="rgba(214,39,40,0.45)",
                standoff=7,
                startstandoff=7,
            )
            labels.append((r.qk_positivity_composed, r.copying_score, name))
    box = (0.5, 1.05, 0.5, 1.05)  # the region both > 0.5 (x0, x1, y0, y1)
    lines = [(x_range[0], 0.0, x_range[1], 0.0), (0.0, y_range[0], 0.0, y_range[1])]  # the zero lines
    lines += [(box[0], box[2], box[1], box[2]), (box[0], box[3], box[1], box[3])]  # the box's edges
    lines += [(box[0], box[2], box[0], box[3]), (box[1], box[2], box[1], box[3])]
    if "qk_positivity_composed" in data:  # the arrows
        lines += [
            (getattr(r, qk_column), r.copying_score, r.qk_positivity_composed, r.copying_score)
            for r in data[data["qk_positivity_composed"].notna()].itertuples()
        ]
    # the plot area of a 560 px figure at full width (measured on the page: 780 x 420 px)
    placed = place_labels(labels, x_range, y_range, size_px=(FULL_PX - 160, 420), lines=lines)
    fig.add_trace(
        go.Scatter(
            x=[p[0] for p in placed],
            y=[p[1] for p in placed],
            text=[p[2] for p in placed],
            textposition=[p[3] for p in placed],
            mode="markers+text",
            name="labels",
            marker=dict(size=14, opacity=0),  # invisible: sets the text's distance from its point
            textfont=dict(size=11),
            showlegend=False,
            hoverinfo="skip",
        )
    )
    fig.add_hline(y=0, line=dict(color="grey", width=1))
    fig.add_vline(x=0, line=dict(color="grey", width=1))
    fig.add_shape(
        type="rect",
        x0=box[0],
        x1=box[1],
        y0=box[2],
        y1=box[3],
        line=dict(color="grey", dash="dot"),
        fillcolor="rgba(0,0,0,0)",
    )
    fig.add_trace(  # the region's key in the legend
        go.Scatter(
            x=[None],
            y=[None],
            mode="lines",
            line=dict(color="grey", dash="dot"),
            name="both > 0.5: attends to and copies the same token",
        )
    )
    fig.update_layout(
        title="Eigenvalue positivity: QK circuit vs OV circuit (copying score)",
        xaxis=dict(title="QK positivity Σλ/Σ|λ|", range=list(x_range)),
        yaxis=dict(title="OV copying score Σλ/Σ|λ|", range=list(y_range)),
        legend=dict(orientation="h", y=-0.2, yanchor="top", x=0),
        height=560,
    )
    return Plot("positivity", fig, data, meta=dict(qk_column=qk_column), width=FULL_PX)


# --- composition --------------------------------------------------------------------------------


def composition_frame(comp: Composition) -> pd.DataFrame:
    """Tidy: kind, source, target, score, baseline, corrected, for every writer -> reader pair."""
    rows = []
    n = len(comp.order)
    for k in KINDS:
        s, b = comp.scores[k], comp.baseline[k]
        for i in range(n):
            for j in range(n):
                if not math.isnan(float(s[i, j])):
                    rows.append(
                        dict(
                            kind=k,
                            source=comp.order[i],
                            target=comp.order[j],
                            score=float(s[i, j]),
                            baseline=float(b[i, j]),
                            corrected=float(s[i, j] - b[i, j]),
                        )
                    )
    return pd.DataFrame(rows, columns=["kind", "source", "target", "score", "baseline", "corrected"])


def composition_plot(comp: Composition, corrected: bool = False, width: int = FULL_PX) -> Plot:
    """Q-, K- and V-composition heatmaps side by side: rows the writer (earlier head), columns
    the reader (later head); raw scores in [0, 1] or baseline-corrected (diverging at 0).
    Only pairs from an earlier layer into a later one have a value. ``width``: the chart's width
    on its page; the writers are named once (the panels share them), and each cell writes its
    value only where the cell is wide enough for it (half a row on the Dynamics page is not)."""
    spacing = 0.04
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=[KIND_NAME[k] for k in KINDS], horizontal_spacing=spacing, shared_yaxes=True
    )
    values = {k: comp.values(k, corrected) for k in KINDS}
    finite = [abs(v) for t in values.values() for v in t.flatten().tolist() if not math.isnan(v)]
    top = max(finite, default=1.0) or 1.0
    heat = (
        dict(colorscale="RdBu", zmid=0.0, zmin=-top, zmax=top)
        if corrected
        else dict(colorscale="Viridis", zmin=0.0, zmax=top)
    )
    # rows: heads that can write (not in the last layer); columns: heads that can read (not in the first)
    last, first = max(comp.layers, default=0), min(comp.layers, default=0)
    rows = [i for i, l in enumerate(comp.layers) if l < last] or list(range(len(comp.order)))
    cols = [j for j, l in enumerate(comp.layers) if l > first] or list(range(len(comp.order)))
    names = [comp.order[i] for i in rows]
    left = max((len(n) for n in names), default=4) * CHAR_PX + TITLE_PX
    panel = (width - left - COLORBAR_PX) * (1 - 2 * spacing) / 3
    cell = panel / max(len(cols), 1)
    text = len(rows) * len(cols) <= MAX_CELL_TEXT and cell >= CELL_TEXT_PX
    upright = cell < CHAR_PX * max((len(comp.order[j]) for j in cols), default=4) + 6
    if panel < TITLE_CHAR_PX * len(KIND_NAME["k"]) + 16:  # half a row: "K-composition" ran into its neighbours
        for note, k in zip(fig.layout.annotations, KINDS):
            note.text = f"{k.upper()}-comp."
    for c, k in enumerate(KINDS, start=1):
        z = [[None if math.isnan(v) else v for v in row] for row in values[k][rows][:, cols].tolist()]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[comp.order[j] for j in cols],
                y=names,
                showscale=c == 3,
                texttemplate="%{z:.2f}" if text else None,
                textfont=dict(size=10),
                hovertemplate=f"{k.upper()}: %{{y}} → %{{x}} = %{{z:.3f}}<extra></extra>",
                **heat,
            ),
            row=1,
            col=c,
        )
        fig.update_xaxes(tickangle=-90 if upright else 0, row=1, col=c)
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title_text="reader (later head)", row=1, col=2)
    fig.update_yaxes(title_text="writer (earlier head)", row=1, col=1)
    what = "score − random-matrix baseline" if corrected else "||W_A W_B||_F / (||W_A||_F ||W_B||_F)"
    fig.update_layout(
        title=f"Composition between heads: {what}",
        height=max(420, 160 + 22 * len(rows)),
        margin=dict(l=left, r=COLORBAR_PX),
    )
    return Plot(
        "composition_corrected" if corrected else "composition",
        fig,
        composition_frame(comp),
        meta=dict(corrected=corrected, **comp.meta),
        width=width,
    )


def head_graph_plot(comp: Composition, kinds: tuple[str, ...] = KINDS, corrected: bool = True, top: int = 12) -> Plot:
    """Heads as nodes (x = layer, y = head) and the ``top`` strongest composition edges of the
    chosen kinds as lines whose width grows with the (baseline-corrected) score."""
    edges = sorted(
        (e for k in kinds for e in comp.edges(k, corrected, top)),
        key=lambda e: e["corrected" if corrected else "score"],
        reverse=True,
    )[:top]
    pos = {lab: (comp.layers[i], int(lab.split("H")[1])) for i, lab in enumerate(comp.order)}
    colors = {"q": "#1f77b4", "k": "#d62728", "v": "#2ca02c"}
    key = "corrected" if corrected else "score"
    top_value = max((abs(e[key]) for e in edges), default=1.0) or 1.0
    fig = go.Figure()
    shown_kinds = set()
    for e in edges:
        (x0, y0), (x1, y1) = pos[e["source"]], pos[e["target"]]
        # K and Q edges bend apart so parallel edges between the same heads stay visible
        bend = {"q": 0.15, "k": -0.15, "v": 0.0}[e["kind"]]
        xm, ym = (x0 + x1) / 2, (y0 + y1) / 2 + bend
        fig.add_trace(
            go.Scatter(
                x=[x0, xm, x1],
                y=[y0, ym, y1],
                mode="lines",
                line=dict(color=colors[e["kind"]], width=1 + 7 * max(0.0, e[key]) / top_value),
                name=KIND_NAME[e["kind"]],
                legendgroup=e["kind"],
                showlegend=e["kind"] not in shown_kinds,
                hovertemplate=f"{e['kind'].upper()}: {e['source']} → {e['target']}<br>score {e['score']:.3f}, "
                f"baseline {e['baseline']:.3f}<extra></extra>",
            )
        )
        shown_kinds.add(e["kind"])
    fig.add_trace(
        go.Scatter(
            x=[p[0] for p in pos.values()],
            y=[p[1] for p in pos.values()],
            mode="markers+text",
            text=list(pos),
            textposition="top center",
            marker=dict(size=16, color="white", line=dict(color="black", width=2)),
            name="heads",
            hoverinfo="text",
        )
    )
    fig.update_layout(
        title=f"Strongest composition edges (top {len(edges)}, {'baseline-corrected' if corrected else 'raw'})",
        xaxis=dict(
            title="layer",
            tickmode="array",
            tickvals=sorted(set(comp.layers)),
            range=[-0.4, max(comp.layers, default=0) + 0.4],
        ),
        yaxis=dict(title="head", range=[max((p[1] for p in pos.values()), default=0) + 0.5, -0.8]),
        height=max(380, 160 + 60 * (len(comp.order) // max(1, len(set(comp.layers))))),
    )
    data = pd.DataFrame(edges, columns=["kind", "source", "target", "score", "baseline", "corrected"])
    return Plot("head_graph", fig, data, meta=dict(kinds=list(kinds), corrected=corrected, top=top), width=FULL_PX)
