"""Figures of retraining and runs (attn_core.training, attn_core.runs): training curves (loss,
accuracy, regularizer terms), per-head entropy over steps, a head's singular values over steps,
spectra before/after, the probe pattern of a head, and the accuracy/entropy trade-off of runs.

The curve builders read the metric log in its one format -- a DataFrame with columns step, name,
value -- as both ``Snapshot.metrics()`` (a live job) and ``RunStore.metrics(id)`` (a saved run)
return it; metric names are listed, built and parsed in attn_core/training/telemetry.py
(``MetricKey``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attn_core.figures.base import Plot
from attn_core.figures.layout import FULL_PX, UNIT_MEASURES, UNIT_RANGE
from attn_core.figures.scales import TEN_COLORS, colors
from attn_core.training.telemetry import TERM_PREFIX, MetricKey

VIEWS = ("data", "vocab")
COLORS = TEN_COLORS  # a few lines; more get colours of their own (scales.colors)


def per_head(metrics: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows of ``metric:L<l>H<h>[:i]`` as columns step, head, layer, index, value."""
    cols = ["step", "head", "layer", "index", "value"]
    if metrics.empty:
        return pd.DataFrame(columns=cols)
    sel = metrics[metrics["name"].str.startswith(metric + ":")]
    keys = {name: MetricKey.try_parse(name) for name in sel["name"].unique()}
    keys = {name: k for name, k in keys.items() if k is not None and k.metric == metric and k.per_head}
    sel = sel[sel["name"].isin(list(keys))]
    parsed = [keys[name] for name in sel["name"]]
    out = pd.DataFrame(
        {
            "step": sel["step"].to_numpy(),
            "head": [k.head_label for k in parsed],
            "layer": [k.layer for k in parsed],
            "index": pd.to_numeric(pd.Series([k.index for k in parsed], dtype=object)).to_numpy(),
            "value": sel["value"].to_numpy(),
        }
    )
    return out.reset_index(drop=True)[cols]


def _series(metrics: pd.DataFrame, name: str) -> pd.DataFrame:
    return metrics[metrics["name"] == name][["step", "value"]]


def curves_plot(metrics: pd.DataFrame, title: str = "Training") -> Plot:
    """Three stacked panels over steps: task loss and total loss (log scale); accuracy on the
    training batch and on held-out samples; each regularizer's weighted term lambda * R."""
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=("loss", "accuracy", "regularizer terms λ·R"),
    )
    names = ["task_loss", "loss", "accuracy", "eval_accuracy", "eval_loss"]
    terms = sorted(n for n in metrics["name"].unique() if n.startswith(TERM_PREFIX)) if len(metrics) else []
    for row, name, label, mode in [
        (1, "task_loss", "task loss", "lines"),
        (1, "loss", "total loss", "lines"),
        (1, "eval_loss", "held-out loss", "markers"),
        (2, "accuracy", "training batch", "lines"),
        (2, "eval_accuracy", "held-out", "lines+markers"),
    ]:
        s = _series(metrics, name)
        if len(s):
            fig.add_trace(
                go.Scatter(x=s["step"], y=s["value"], name=label, mode=mode, legendgroup=str(row)), row=row, col=1
            )
    palette = colors(len(terms))
    for i, name in enumerate(terms):
        s = _series(metrics, name)
        fig.add_trace(
            go.Scatter(
                x=s["step"],
                y=s["value"],
                name=name.removeprefix(TERM_PREFIX),
                mode="lines",
                line=dict(color=palette[i]),
                legendgroup="3",
            ),
            row=3,
            col=1,
        )
    if not terms:
        fig.add_annotation(text="no regularizer", showarrow=False, xref="x3 domain", yref="y3 domain", x=0.5, y=0.5)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(range=UNIT_RANGE, row=2, col=1)
    fig.update_xaxes(title_text="step", row=3, col=1)
    fig.update_layout(title=title, height=720, legend=dict(tracegroupgap=160))
    data = metrics[metrics["name"].isin(names + terms)].reset_index(drop=True)
    return Plot("training_curves", fig, data, meta=dict(terms=[t.removeprefix(TERM_PREFIX) for t in terms]))


def waiting_plot(name: str, title: str, text: str, height: int = 420) -> Plot:
    """An empty chart with ``title`` that says ``text`` (what it will show, and when): a live
    page keeps the same charts in the same places while their data is still to come."""
    fig = go.Figure()
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(color="grey"))
    fig.update_layout(title=title, height=height, xaxis=dict(visible=False), yaxis=dict(visible=False))
    return Plot(name, fig, pd.DataFrame(), meta=dict(waiting=True))


def _mode(data: pd.DataFrame) -> str:
    """Lines over steps; markers while there is one step only (a line of one point is invisible),
    as before a run starts, when only step 0 is known."""
    return "lines" if data["step"].nunique() > 1 else "markers"


def head_entropy_plot(metrics: pd.DataFrame, view: str = "data", regularized: Sequence[str] | None = None) -> Plot:
    """Normalized attention entropy of every head over steps, on the probe batch (``data``) or
    the vocabulary view (``vocab``); regularized heads solid, the others dotted; their mean bold."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    data = per_head(metrics, f"entropy_{view}")
    regularized = set(regularized) if regularized is not None else set(data["head"])
    mode = _mode(data)
    fig = go.Figure()
    palette = colors(data["head"].nunique())
    for i, (head, part) in enumerate(data.groupby("head", sort=True)):
        fig.add_trace(
            go.Scatter(
                x=part["step"],
                y=part["value"],
                name=head,
                mode=mode,
                line=dict(color=palette[i], dash="solid" if head in regularized else "dot"),
            )
        )
    mean = _series(metrics, f"entropy_{view}")
    many = len(palette) > len(TEN_COLORS)  # a legend entry of many: the widest one sets every column's width
    if len(mean):
        fig.add_trace(
            go.Scatter(
                x=mean["step"],
                y=mean["value"],
                name="mean" if many else "mean (regularized heads)",
                mode=mode,
                line=dict(color="grey", width=4),
                marker=dict(color="grey", size=12),
            )
        )
    where = "held-out probe batch" if view == "data" else "vocabulary view (every token as query and key)"
    fig.update_layout(
        title=f"Normalized attention entropy per head, {where}"
        + (" (grey: the mean of the regularized heads)" if many and len(mean) else ""),
        xaxis_title="step",
        yaxis=dict(title="H / log n", range=UNIT_RANGE),
        height=420,
    )
    steps = pd.concat([data["step"], mean["step"]])
    if steps.nunique() > 1:  # the axis ends at the run's last measured step, never past it
        fig.update_xaxes(range=[float(steps.min()), float(steps.max())])
    return Plot(f"head_entropy_{view}", fig, data, meta=dict(view=view))


def spectrum_history_plot(metrics: pd.DataFrame, head: str, top: int | None = None) -> Plot:
    """Singular values sigma_i of one head's B (``head`` like "L1H2") over steps, one line per i
    (the first ``top`` only), with its stable rank on a second axis."""
    data = per_head(metrics, "sigma")
    data = data[data["head"] == head]
    if data.empty:
        raise ValueError(f"no spectra of head {head!r} in this log (heads look like L0H1)")
    if top is not None:
        data = data[data["index"] < top]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    n = int(data["index"].max()) + 1
    mode = _mode(data)
    for i, part in data.groupby("index"):
        shade = 0.15 + 0.85 * (1 - i / max(1, n - 1))
        fig.add_trace(
            go.Scatter(
                x=part["step"],
                y=part["value"],
                name=f"σ₁ … σ{n} (darker: larger)" if n > 1 else "σ₁",
                legendgroup="sigma",
                showlegend=i == 0,  # one legend entry for the whole fan (16 did not fit)
                mode=mode,
                line=dict(color=f"rgba(31,119,180,{shade:.2f})"),
                hovertemplate=f"σ{i + 1}, step %{{x}}: %{{y:.4g}}<extra></extra>",
            ),
            secondary_y=False,
        )
    sr = _series(metrics, str(MetricKey.of_head("stable_rank", head)))
    if len(sr):
        fig.add_trace(
            go.Scatter(
                x=sr["step"],
                y=sr["value"],
                name="stable rank (right axis)",
                showlegend=True,
                mode="lines+markers",
                line=dict(color="#d62728", dash="dash"),
            ),
            secondary_y=True,
        )
    fig.update_layout(
        title=f"Singular values of B over training, {head}",
        xaxis_title="step",
        height=420,
        legend=dict(orientation="h", y=-0.2, yanchor="top", x=0),
    )
    fig.update_yaxes(title_text="σ_i(B)", secondary_y=False)
    fig.update_yaxes(title_text="stable rank ‖B‖²_F / ‖B‖²₂", secondary_y=True)
    return Plot(f"spectrum_history_{head}", fig, data.reset_index(drop=True), meta=dict(head=head), width=FULL_PX)


def spectra_before_after_plot(
    before: Sequence[dict], after: Sequence[dict], heads: Sequence[str] | None = None
) -> Plot:
    """Singular values of B per head, before and after retraining (``per_head`` lists of
    :func:`attn_core.training.telemetry.measure_run`, as in a run's card), one small panel per head, log scale."""
    b = {r["head"]: r for r in before}
    a = {r["head"]: r for r in after}
    heads = [h for h in (heads or list(b)) if h in b and h in a]
    if not heads:
        raise ValueError("no head is measured both before and after")
    cols = min(2, len(heads))  # a half-page chart: two panels a row keep each readable
    rows = math.ceil(len(heads) / cols)
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=heads,
        shared_yaxes=True,
        horizontal_spacing=0.06,
        vertical_spacing=0.3 / rows,
    )
    recs = []
    for k, head in enumerate(heads):
        r, c = k // cols + 1, k % cols + 1
        for when, src, color in (("before", b, "#7f7f7f"), ("after", a, "#d62728")):
            sigma = src[head]["singular_values"]
            recs += [dict(head=head, when=when, index=i, singular_value=s) for i, s in enumerate(sigma)]
            fig.add_trace(
                go.Scatter(
                    x=list(range(1, len(sigma) + 1)),
                    y=sigma,
                    mode="lines+markers",
                    name=when,
                    line=dict(color=color),
                    showlegend=k == 0,
                    legendgroup=when,
                ),
                row=r,
                col=c,
            )
    fig.update_yaxes(type="log")
    fig.update_xaxes(nticks=4)
    fig.update_layout(
        title="Singular values of B, before and after retraining",
        height=170 * rows + 170,
        legend=dict(orientation="h", y=-0.08, yanchor="top", x=0),
    )
    return Plot("spectra_before_after", fig, pd.DataFrame(recs), meta=dict(heads=heads))


def probe_pattern_plot(pattern, tokens: Sequence[str], layer: int, head: int, step: int | None = None) -> Plot:
    """Heatmap of one head's attention on the job's fixed probe input: ``pattern`` that head's
    [T, T] (``TrainingJob.pattern``, ``Snapshot.pattern_of``) or every head's [n_layers, n_heads,
    T, T] (a preview's ``probe_pattern``), and ``probe_tokens``."""
    A = np.asarray(pattern)
    if A.ndim == 4 and not (0 <= layer < A.shape[0] and 0 <= head < A.shape[1]):
        raise ValueError(f"head L{layer}H{head} is outside this model's {A.shape[0]} layers x {A.shape[1]} heads")
    z = A[layer, head] if A.ndim == 4 else A
    T = z.shape[-1]
    z = np.where(np.tril(np.ones((T, T), dtype=bool)), z, np.nan)
    labels = [f"{p}:{t}" for p, t in enumerate(tokens[:T])]
    fig = go.Figure(
        go.Heatmap(
            z=z.tolist(),
            x=labels,
            y=labels,
            colorscale="Viridis",
            zmin=0,
            zmax=1,
            colorbar=dict(title="A"),
            hovertemplate="%{y} → %{x}<br>%{z:.3f}<extra></extra>",
        )
    )
    at = f" at step {step}" if step is not None else ""
    fig.update_layout(
        title=f"Attention of L{layer}H{head} on the probe input{at}",
        xaxis_title="key",
        yaxis=dict(title="query", autorange="reversed"),
        height=520,
    )
    q, k = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    data = pd.DataFrame(
        dict(
            query=q.ravel(),
            key=k.ravel(),
            query_label=[labels[i] for i in q.ravel()],
            key_label=[labels[i] for i in k.ravel()],
            weight=z.ravel(),
        )
    )
    return Plot(
        f"probe_pattern_L{layer}H{head}",
        fig,
        data.dropna().reset_index(drop=True),
        meta=dict(layer=layer, head=head, step=step),
    )


# Axis titles of the run measures (the card's keys): words, not column names
MEASURE_TITLES = {
    "accuracy": "held-out accuracy",
    "loss": "held-out loss (nats)",
    "perplexity": "held-out perplexity",
    "entropy_data": "mean normalized entropy on data (H / log n)",
    "entropy_vocab": "mean normalized entropy over the vocabulary",
    "top1_mass": "mean top-1 attention mass",
    "stable_rank": "stable rank of B",
}


def tradeoff_plot(
    table: pd.DataFrame,
    x: str = "entropy_data",
    y: str = "accuracy",
    color: str = "regularizer",
    title: str | None = None,
) -> Plot:
    """Runs as points: ``x`` (default mean normalized entropy on data) against ``y`` (accuracy),
    one colour per ``color`` value, lines joining increasing lambda when there is a ``lambda``
    column -- where concentration is bought and what it costs. With a ``when`` column ("before",
    "after") each group is drawn as an arrow from its open before-marker to its filled
    after-marker, the legend saying which is which. Measures bounded by 0 and 1 keep that
    whole range (``base.UNIT_MEASURES``)."""
    for c in (x, y, color):
        if c not in table.columns:
            raise ValueError(f"the table has no column {c!r}; it has {', '.join(table.columns)}")
    change = "when" in table.columns
    order = {"before": 0, "after": 1}
    fig = go.Figure()
    palette = colors(table[color].nunique())
    for i, (name, part) in enumerate(table.groupby(color, sort=False)):
        col = palette[i]
        if change:
            part = part.sort_values("when", key=lambda w: w.map(order))
        elif "lambda" in part.columns:
            part = part.sort_values("lambda")
        text = (
            [f"λ={v:g}" for v in part["lambda"]]
            if "lambda" in part.columns
            else list(part.get("when", [""] * len(part)))
        )
        symbols = ["circle-open" if w == "before" else "circle" for w in part["when"]] if change else "circle"
        fig.add_trace(
            go.Scatter(
                x=part[x],
                y=part[y],
                name=str(name),
                mode="lines+markers",
                text=text,
                line=dict(color=col, width=1, dash="dot" if change else "solid"),
                marker=dict(size=10, color=col, symbol=symbols, line=dict(width=2, color=col)),
                hovertemplate="%{text}<br>" + f"{x} %{{x:.4f}}<br>{y} %{{y:.4f}}<extra>{name}</extra>",
            )
        )
        if change:
            for (x0, y0), (x1, y1) in zip(part[[x, y]].to_numpy()[:-1], part[[x, y]].to_numpy()[1:]):
                fig.add_annotation(
                    x=x1,
                    y=y1,
                    ax=x0,
                    ay=y0,
                    xref="x",
                    yref="y",
                    axref="x",
                    ayref="y",
                    showarrow=True,
                    arrowhead=2,
                    arrowsize=1.3,
                    arrowwidth=1.5,
                    arrowcolor=col,
                    standoff=6,
                    text="",
                )
    if change:  # the legend's key to the markers
        for symbol, label in (("circle-open", "before (the parent)"), ("circle", "after (the run)")):
            fig.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="markers",
                    name=label,
                    legendgroup="key",
                    marker=dict(size=10, color="grey", symbol=symbol, line=dict(width=2, color="grey")),
                )
            )
    fig.update_layout(
        title=title or f"{y} against {x}" + (": each arrow goes from before to after" if change else ""),
        xaxis_title=MEASURE_TITLES.get(x, x),
        yaxis_title=MEASURE_TITLES.get(y, y),
        height=460,
    )
    if x in UNIT_MEASURES:
        fig.update_xaxes(range=UNIT_RANGE)
    if y in UNIT_MEASURES:
        fig.update_yaxes(range=UNIT_RANGE)
    return Plot(f"tradeoff_{x}_{y}", fig, table.reset_index(drop=True), meta=dict(x=x, y=y, color=color), width=FULL_PX)
