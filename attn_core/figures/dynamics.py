"""Figures of training dynamics (attn_core.dynamics): metrics against the training step with a
marker at the chosen step and the phase-change window shaded, and the animation of one head's
heatmap and spectrum across steps (plotly frames with a slider and play/pause), an HTML file of
its own. The views of a single step are the existing figures (``figures.bilinear.view_plot``,
``spectrum_plot``, ``heads_plot``, ``figures.circuits.composition_plot``); the animation takes its
frames from them, so a frame is exactly the figure the page shows at that step."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attn_core.bilinear import View
from attn_core.dynamics import Dynamics
from attn_core.figures.base import Plot
from attn_core.figures.bilinear import spectrum_plot, view_plot
from attn_core.figures.layout import fixed_margins
from attn_core.figures.scales import colors
from attn_core.figures.training import COLORS
from attn_core.regularizers import head_label
from attn_core.training.telemetry import MetricKey

MARKER = "#d62728"
WINDOW = "rgba(255, 165, 0, 0.18)"


def _decorate(fig: go.Figure, dyn: Dynamics, step: int | None) -> None:
    """The phase-change window (shaded) and the chosen step (a vertical line) on every x axis."""
    if dyn.phase_change is not None:
        a, b = dyn.phase_change["window"]
        fig.add_vrect(
            x0=a,
            x1=b,
            fillcolor=WINDOW,
            line_width=0,
            layer="below",
            annotation_text=f"phase change ~{dyn.phase_change['step']}",
            annotation_position="top left",
        )
    if step is not None:
        fig.add_vline(x=step, line=dict(color=MARKER, width=2, dash="dot"))


def _frame(dyn: Dynamics, columns: dict[str, Sequence]) -> pd.DataFrame:
    return pd.DataFrame({"step": dyn.steps, **{k: list(v) for k, v in columns.items()}})


def curves_plot(
    dyn: Dynamics,
    columns: dict[str, Sequence],
    title: str,
    y_title: str,
    step: int | None = None,
    name: str = "dynamics",
    log_y: bool = False,
) -> Plot:
    """Lines of ``columns`` ({label: one value per step, None where not measured}) against the
    step, the chosen ``step`` marked and the phase-change window shaded."""
    fig = go.Figure()
    palette = colors(len(columns))
    for i, (label, values) in enumerate(columns.items()):
        y = [math.nan if v is None else v for v in values]
        fig.add_trace(
            go.Scatter(
                x=dyn.steps,
                y=y,
                mode="lines+markers",
                name=label,
                marker=dict(size=4),
                line=dict(color=palette[i]),
                hovertemplate=f"{label}: %{{y:.4g}} at step %{{x}}<extra></extra>",
            )
        )
    _decorate(fig, dyn, step)
    fig.update_layout(title=title, xaxis_title="training step", yaxis_title=y_title, hovermode="x unified")
    if not columns:  # nothing to draw (no earlier layer writes into a layer-0 head): the axes still span the steps
        first, last = dyn.steps[0], dyn.steps[-1]
        fig.update_xaxes(range=[first, last] if last > first else [first - 1, last + 1])
        fig.update_yaxes(showticklabels=False)
    if log_y:
        fig.update_yaxes(type="log")
    return Plot(name, fig, _frame(dyn, columns), meta=dict(step=step, phase_change=dyn.phase_change))


def loss_plot(dyn: Dynamics, step: int | None = None) -> Plot:
    """Held-out loss and the in-context-learning score (nats)."""
    cols = {"loss": dyn.metrics["loss"], "ICL score (late − early)": dyn.metrics["icl_score"]}
    return curves_plot(dyn, cols, "Loss and in-context-learning score", "nats", step, "dynamics_loss")


def _per_head(dyn: Dynamics, metric: str, layers: Sequence[int] | None = None) -> dict[str, list]:
    out = {}
    for name, values in dyn.metrics.items():
        key = MetricKey.try_parse(name)
        if key is not None and key.metric == metric and key.per_head and (layers is None or key.layer in layers):
            out[f"{metric.replace('_', ' ')} {key.head_label}"] = values
    return out


def detectors_plot(dyn: Dynamics, step: int | None = None) -> Plot:
    """Prefix-matching and previous-token scores of every head."""
    cols = {**_per_head(dyn, "prefix_matching"), **_per_head(dyn, "previous_token")}
    return curves_plot(
        dyn, cols, "Prefix matching and previous token, every head", "attention mass (0..1)", step, "dynamics_heads"
    )


def composition_curves_plot(dyn: Dynamics, layer: int, head: int, step: int | None = None) -> Plot:
    """K-composition into head (layer, head) from every head of an earlier layer."""
    reader = head_label(layer, head)
    writers = [w for w, l in zip(dyn.order, dyn.layers) if l < layer]
    cols = {f"{w} → {reader}": dyn.k_from(w, reader) for w in writers}
    title = (
        f"K-composition into {reader}" if writers else f"K-composition into {reader}: no earlier layer writes into it"
    )
    return curves_plot(dyn, cols, title, "‖W_OV B̃ᵀ‖_F / (‖W_OV‖_F ‖B̃‖_F)", step, f"dynamics_kcomp_{reader}")


def spectrum_entropy_plot(dyn: Dynamics, layer: int, head: int, step: int | None = None) -> Plot:
    """sigma_1(B) of the head (left axis) and its data entropy with the entropy floor (right axis)."""
    label = head_label(layer, head)
    get = {m: dyn.metrics.get(str(MetricKey(m, layer, head))) for m in ("sigma_max", "entropy_data", "entropy_bound")}
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    nan = [math.nan] * len(dyn.steps)
    series = [
        ("σ₁(B)", get["sigma_max"], False, COLORS[0], None),
        ("entropy on data H/log n", get["entropy_data"], True, COLORS[1], None),
        ("entropy floor (Zhai et al.)", get["entropy_bound"], True, COLORS[1], "dash"),
    ]
    for name, values, right, color, dash in series:
        y = nan if values is None else [math.nan if v is None else v for v in values]
        fig.add_trace(
            go.Scatter(
                x=dyn.steps,
                y=y,
                name=name,
                mode="lines+markers",
                marker=dict(size=4),
                line=dict(color=color, dash=dash),
                hovertemplate=f"{name}: %{{y:.4g}}<extra></extra>",
            ),
            secondary_y=right,
        )
    _decorate(fig, dyn, step)
    fig.update_layout(
        title=f"σ₁(B) and attention entropy of {label}", xaxis_title="training step", hovermode="x unified"
    )
    fig.update_yaxes(title_text="σ₁(B)", secondary_y=False)
    fig.update_yaxes(title_text="normalized entropy (0..1)", range=[0, 1.05], dtick=0.2, secondary_y=True)
    data = _frame(dyn, {k: v if v is not None else nan for k, v in get.items()})
    return Plot(f"dynamics_spectrum_entropy_{label}", fig, data, meta=dict(step=step, head=label))


def sinks_plot(dyn: Dynamics, layer: int, head: int, step: int | None = None) -> Plot:
    """The share of sink heads and the head's largest key importance (Gu et al. 2024), 0..1."""
    label = head_label(layer, head)
    cols = {
        "sink rate (share of heads)": dyn.metrics["sink_rate"],
        f"sink importance {label}": dyn.metrics.get(str(MetricKey("sink_importance", layer, head))),
    }
    cols = {k: v for k, v in cols.items() if v is not None}
    plot = curves_plot(
        dyn,
        cols,
        f"Attention sinks: the rate, and {label}",
        "share / attention (0..1)",
        step,
        f"dynamics_sinks_{label}",
    )
    plot.fig.update_yaxes(range=[0, 1.05])
    return plot


def ranks_plot(dyn: Dynamics, layer: int, head: int, step: int | None = None) -> Plot:
    """The two ranks of the head: of B (90% of its variance) and of its centred scores on data."""
    label = head_label(layer, head)
    names = {
        "weight_rank": "rank of B (90%)",
        "data_rank": "rank of the scores (90%)",
        "data_stable_rank": "stable rank of the scores",
    }
    cols = {text: dyn.metrics.get(str(MetricKey(m, layer, head))) for m, text in names.items()}
    cols = {k: v for k, v in cols.items() if v is not None}
    return curves_plot(dyn, cols, f"The two ranks of {label}", "rank", step, f"dynamics_ranks_{label}")


def panels(dyn: Dynamics, layer: int, head: int, step: int | None = None) -> list[Plot]:
    """The page's curves: loss and ICL, detectors of every head, K-composition into the head,
    sigma_1 and entropy with the floor, and (when measured) sinks and the head's two ranks."""
    out = [
        loss_plot(dyn, step),
        detectors_plot(dyn, step),
        composition_curves_plot(dyn, layer, head, step),
        spectrum_entropy_plot(dyn, layer, head, step),
    ]
    if "sink_rate" in dyn.metrics:
        out.append(sinks_plot(dyn, layer, head, step))
    if str(MetricKey("weight_rank", layer, head)) in dyn.metrics:
        out.append(ranks_plot(dyn, layer, head, step))
    return out


# --- the animation -------------------------------------------------------------------------------


def animation_plot(
    steps: Sequence[int],
    views: Sequence[View],
    spectra: Sequence[pd.DataFrame],
    head: int,
    value: str = "scores",
    start: int | None = None,
) -> Plot:
    """One head's sequence heatmap (``view_plot``) beside its singular values (``spectrum_plot``),
    one frame per step, with a step slider and play/pause: ``views[i]`` and ``spectra[i]``
    (``bilinear.spectrum_frame`` rows of that head) are step ``steps[i]``. Colours and axes are
    fixed across frames, so frames compare. The figure opens at step ``start`` (default the last),
    which is also what a PNG or SVG export shows."""
    if not steps or not (len(steps) == len(views) == len(spectra)):
        raise ValueError("an animation needs one view and one spectrum per step, and at least one step")
    heat = [view_plot(v, head, value=value) for v in views]
    sigma = [spectrum_plot(f) for f in spectra]
    first = heat[0].fig
    layer = views[0].layer
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.6, 0.4],
        horizontal_spacing=0.2,
        subplot_titles=[f"{value} of L{layer}H{head}", "σᵢ(B)"],
    )
    z = np.concatenate([np.asarray(h.fig.data[0].z, dtype=float).ravel() for h in heat])
    z = z[np.isfinite(z)]
    top = float(np.abs(z).max()) if z.size else 1.0
    zrange = dict(zmin=-top, zmax=top) if value == "scores" else dict(zmin=0.0, zmax=1.0)
    positive = pd.concat(spectra)["singular_value"]
    positive = positive[positive > 0]
    y_range = [math.log10(positive.min()) - 0.1, math.log10(positive.max()) + 0.1] if len(positive) else None

    def traces(i: int) -> list:
        h = go.Heatmap(heat[i].fig.data[0]).update(colorbar=dict(x=0.5, xanchor="left", thickness=14), **zrange)
        s = sigma[i].fig.data
        line = go.Scatter(s[0]).update(showlegend=False) if s else go.Scatter(x=[], y=[])
        return [h, line]

    at = len(steps) - 1 if start is None else list(steps).index(start)
    for t, col in zip(traces(at), (1, 2)):
        fig.add_trace(t, row=1, col=col)
    fig.frames = [go.Frame(data=traces(i), traces=[0, 1], name=str(s)) for i, s in enumerate(steps)]
    fig.update_xaxes(first.layout.xaxis.to_plotly_json(), row=1, col=1)
    fig.update_yaxes(first.layout.yaxis.to_plotly_json(), row=1, col=1)
    fig.update_xaxes(title_text="index i", row=1, col=2)
    fig.update_yaxes(type="log", title_text="σᵢ", range=y_range, row=1, col=2)
    play = dict(frame=dict(duration=400, redraw=True), fromcurrent=True, transition=dict(duration=0))
    pause = dict(frame=dict(duration=0, redraw=False), mode="immediate")
    fig.update_layout(
        title=f"L{layer}H{head} across training: {value} on one input and the singular values of B",
        height=max(520, first.layout.height or 520),
        updatemenus=[
            dict(
                type="buttons",
                direction="left",
                x=0.0,
                y=-0.4,
                xanchor="left",
                yanchor="top",
                buttons=[
                    dict(label="▶ play", method="animate", args=[None, play]),
                    dict(label="❚❚ pause", method="animate", args=[[None], pause]),
                ],
            )
        ],
        sliders=[
            dict(
                active=at,
                x=0.0,
                y=-0.1,
                len=1.0,
                currentvalue=dict(prefix="step "),
                steps=[
                    dict(
                        label=str(s),
                        method="animate",
                        args=[[str(s)], {**pause, "frame": dict(duration=0, redraw=True)}],
                    )
                    for s in steps
                ],
            )
        ],
    )
    fixed_margins(fig, colorbar=False)
    fig.update_layout(margin=dict(b=200), width=None)

    def data() -> pd.DataFrame:
        parts = []
        for s, v in zip(steps, views):
            frame = v.frame(head)
            frame.insert(0, "step", s)
            parts.append(frame)
        return pd.concat(parts, ignore_index=True)

    return Plot(
        f"dynamics_animation_L{layer}H{head}",
        fig,
        data,
        meta=dict(steps=list(steps), layer=layer, head=head, value=value),
    )


# --- several runs ---------------------------------------------------------------------------------


def runs_plot(runs: Sequence[dict], panels: dict[str, str], title: str, log_x: bool = True) -> Plot:
    """Metrics of several runs against the step, one panel per metric (``panels``: key -> y
    title), one colour per ``group``; each run (``label``, ``group``, ``steps``, a list per panel
    key, ``phase`` or None) has its phase-change step marked with a diamond. With ``log_x`` step 0
    is left out (no logarithm)."""
    groups = list(dict.fromkeys(r["group"] for r in runs))
    color = dict(zip(groups, colors(len(groups))))
    keys = list(panels)
    fig = make_subplots(
        rows=len(keys), cols=1, shared_xaxes=True, vertical_spacing=0.05, subplot_titles=[panels[k] for k in keys]
    )
    rows = []
    for run in runs:
        keep = [i for i, s in enumerate(run["steps"]) if s > 0 or not log_x]
        x = [run["steps"][i] for i in keep]
        for r, key in enumerate(keys, start=1):
            y = [math.nan if run[key][i] is None else run[key][i] for i in keep]
            first = r == 1 and run is next(q for q in runs if q["group"] == run["group"])
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines",
                    name=run["group"],
                    legendgroup=run["group"],
                    showlegend=first,
                    line=dict(color=color[run["group"]], width=1.3),
                    opacity=0.8,
                    hovertemplate=f"{run['label']}: %{{y:.3g}} at step %{{x}}<extra></extra>",
                ),
                row=r,
                col=1,
            )
            phase = run.get("phase")
            if phase is not None:
                at = min(range(len(x)), key=lambda i: abs(x[i] - phase["step"]))
                fig.add_trace(
                    go.Scatter(
                        x=[x[at]],
                        y=[y[at]],
                        mode="markers",
                        showlegend=False,
                        legendgroup=run["group"],
                        marker=dict(symbol="diamond", size=9, color=color[run["group"]], line=dict(width=1)),
                        hovertemplate=f"{run['label']}: phase change at step {phase['step']}<extra></extra>",
                    ),
                    row=r,
                    col=1,
                )
        for i in keep:
            rows.append(
                {"run": run["label"], "group": run["group"], "step": run["steps"][i], **{k: run[k][i] for k in keys}}
            )
    if log_x:
        fig.update_xaxes(type="log")
    fig.update_xaxes(title_text="training step", row=len(keys), col=1)
    fig.update_layout(title=title, height=260 * len(keys) + 120, legend=dict(orientation="h", y=-0.08))
    return Plot("dynamics_runs", fig, pd.DataFrame(rows), meta=dict(groups=groups))
