"""Figures of d_k growth (attn_core.grow): the spectrum of the target form Z* with the
cut at d_k + p, the first-order predicted vs measured loss decrease along the line search, the
held-out loss of the three methods during fine-tuning, a summary of the losses, and the head's
heatmap before and after growth (the bilinear heatmap builder, renamed)."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attn_core.bilinear import View
from attn_core.figures import bilinear as fb
from attn_core.figures.base import Plot
from attn_core.grow import ARMIJO, METHODS, GrowResult

METHOD_COLORS = {"grown": "#d62728", "random": "#1f77b4", "zero": "#7f7f7f"}
METHOD_NAMES = {"grown": "grown (functional gradient)", "random": "random new dims", "zero": "zero new dims"}
SHORT_NAMES = {"grown": "grown<br>(functional gradient)", "random": "random<br>new dims", "zero": "zero<br>new dims"}
BASIS_NAMES = {"whitened": "whitened basis of the batch", "raw": "raw basis (the original recipe)"}


def _head(result: GrowResult) -> str:
    return f"L{result.config.layer}H{result.config.head}"


def spectrum_plot(result: GrowResult) -> Plot:
    """Singular values sigma_i of the target form Z*(eta*) on a log scale: the first d_k + p are
    kept (the grown head), the rest discarded; sum of the discarded sigma_i^2 = the Eckart-Young
    residual. Zeros (beyond the data's rank) have no logarithm and are only in the CSV."""
    step, k, d_k = result.step, result.kept, result.d_k
    sigma = step.singular_values.tolist()
    data = pd.DataFrame({"index": range(1, len(sigma) + 1), "singular_value": sigma})
    data["kept"] = data["index"] <= k
    data["old_width"] = data["index"] <= d_k
    shown = data[data["singular_value"] > 0]
    fig = go.Figure()
    for part, color, label in [
        (shown[shown["kept"]], METHOD_COLORS["grown"], f"kept (i ≤ d_k + p = {k})"),
        (shown[~shown["kept"]], METHOD_COLORS["zero"], "discarded"),
    ]:
        fig.add_trace(
            go.Scatter(
                x=part["index"],
                y=part["singular_value"],
                mode="markers+lines",
                name=label,
                marker=dict(color=color, size=8),
                line=dict(color=color, width=1),
                hovertemplate="σ_%{x} = %{y:.4g}<extra></extra>",
            )
        )
    # The cut and the old width are named in the legend, not by labels in the plot: a label at the
    # top of a line sat on the largest singular values, which start there.
    top, bottom = float(shown["singular_value"].max()), float(shown["singular_value"].min())
    for x, color, dash, label in [
        (k + 0.5, METHOD_COLORS["grown"], "dash", f"cut: d_k + p = {k}"),
        (d_k + 0.5, "grey", "dot", f"old d_k = {d_k}"),
    ]:
        fig.add_trace(
            go.Scatter(
                x=[x, x],
                y=[bottom, top],
                mode="lines",
                name=label,
                line=dict(color=color, dash=dash, width=2),
                hovertemplate=f"{label}<extra></extra>",
            )
        )
    share = step.discarded_energy / step.total_energy if step.total_energy > 0 else 0.0
    fig.update_yaxes(type="log", title_text="σ_i")
    fig.update_xaxes(title_text="index i")
    fig.update_layout(
        title=f"Spectrum of Z* at η*, {_head(result)} ({BASIS_NAMES[result.config.basis]})<br>"
        f"<sup>discarded energy Σ_(i>{k}) σ_i² = {step.discarded_energy:.3g} "
        f"({100 * share:.3g}% of Σ σ_i²); the {k - d_k} new directions hold "
        f"{step.captured_share(d_k):.1%} of the energy beyond the old d_k</sup>"
    )
    return Plot(
        f"grow_spectrum_{_head(result)}",
        fig,
        data,
        meta=dict(
            layer=result.config.layer,
            head=result.config.head,
            kept=k,
            d_k=d_k,
            eta=step.eta,
            basis=result.config.basis,
            discarded_energy=step.discarded_energy,
        ),
    )


def decrease_plot(result: GrowResult) -> Plot:
    """Along the line search (x: eta / eta_ref, log): the first-order predicted decrease -<G, dS>
    and the measured one on the fitting batch, the measured one on the line-search batch (top,
    log; steps that raise the loss are only in the CSV), and measured / predicted with Armijo's
    threshold (bottom). The chosen eta* is marked."""
    table = result.line_search.copy()
    table["val_decrease"] = table["val_loss"].iloc[0] - table["val_loss"]
    table["ratio"] = table["measured_decrease"] / table["predicted_decrease"].where(table["predicted_decrease"] > 0)
    steps = table[table["eta"] > 0]
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        row_heights=[0.65, 0.35],
        subplot_titles=("loss decrease", "measured / predicted (fitting batch)"),
    )
    for col, label, color, dash in [
        ("predicted_decrease", "predicted −⟨G, ΔS⟩", METHOD_COLORS["grown"], "dash"),
        ("measured_decrease", "measured, fitting batch", METHOD_COLORS["grown"], "solid"),
        ("val_decrease", "measured, line-search batch", METHOD_COLORS["random"], "solid"),
    ]:
        part = steps[steps[col] > 0]
        fig.add_trace(
            go.Scatter(
                x=part["eta_rel"],
                y=part[col],
                name=label,
                mode="lines+markers",
                line=dict(color=color, dash=dash),
                hovertemplate="η/η_ref %{x:.3g}: %{y:.4g}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    ratio = steps.dropna(subset=["ratio"])
    fig.add_trace(
        go.Scatter(
            x=ratio["eta_rel"],
            y=ratio["ratio"],
            name="measured / predicted",
            mode="lines+markers",
            line=dict(color="grey"),
            hovertemplate="η/η_ref %{x:.3g}: %{y:.3f}<extra></extra>",
        ),
        row=2,
        col=1,
    )
    fig.add_hline(y=1.0, line=dict(color="grey", dash="dot"), row=2, col=1)
    fig.add_hline(
        y=ARMIJO,
        line=dict(color=METHOD_COLORS["grown"], dash="dot"),
        row=2,
        col=1,
        annotation_text=f"Armijo {ARMIJO:g}",
        annotation_position="bottom left",
    )
    eta_rel = result.step.eta / result.eta_ref if result.eta_ref > 0 else 0.0
    if eta_rel > 0:
        # named in the legend, not by a label on the line (the line ran through it)
        fig.add_vline(x=eta_rel, line=dict(color=METHOD_COLORS["grown"], width=2))
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                line=dict(color=METHOD_COLORS["grown"], width=2),
                name=f"η* = {eta_rel:.3g} η_ref (the step taken)",
            ),
            row=2,
            col=1,
        )
    fig.update_xaxes(
        type="log", title_text="step size η / η_ref (η_ref moves the scores by their own norm)", row=2, col=1
    )
    fig.update_xaxes(type="log", row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_layout(
        title=f"Predicted vs measured loss decrease, {_head(result)} (η* = {eta_rel:.3g} η_ref)", height=620
    )
    return Plot(f"grow_decrease_{_head(result)}", fig, table, meta=dict(eta=result.step.eta, eta_ref=result.eta_ref))


def curves_plot(result: GrowResult) -> Plot:
    """Held-out loss of the three methods over the fine-tuning steps (markers at the evaluations),
    the training-batch loss faint; the dotted line is the loss before growth. The y axis is
    logarithmic when the losses span more than a decade."""
    curves = result.curves
    fig = go.Figure()
    for method in METHODS:
        part = curves[curves["method"] == method]
        color = METHOD_COLORS[method]
        train = part.dropna(subset=["train_loss"])
        fig.add_trace(
            go.Scatter(
                x=train["step"],
                y=train["train_loss"],
                mode="lines",
                opacity=0.3,
                line=dict(color=color, width=1),
                name=f"{method}: training batch",
                legendgroup=method,
                showlegend=False,
                hovertemplate=f"{method}, step %{{x}}: training loss %{{y:.4g}}<extra></extra>",
            )
        )
        evals = part.dropna(subset=["eval_loss"])
        fig.add_trace(
            go.Scatter(
                x=evals["step"],
                y=evals["eval_loss"],
                mode="lines+markers",
                name=METHOD_NAMES[method],
                line=dict(color=color, width=2),
                legendgroup=method,
                hovertemplate=f"{method}, step %{{x}}: held-out loss %{{y:.4g}}<extra></extra>",
            )
        )
    fig.add_hline(y=result.loss_before, line=dict(color="grey", dash="dot"), annotation_text="before growth")
    values = pd.concat([curves["eval_loss"], curves["train_loss"]]).dropna()
    values = values[values > 0]
    if len(values) and values.max() > 10 * values.min():
        fig.update_yaxes(type="log")
    fig.update_layout(
        title=f"Fine-tuning after growth, {_head(result)}: d_k {result.d_k} → {result.kept}<br>"
        f"<sup>held-out loss (markers), training batch (faint); {result.config.steps} steps, "
        f"the same data for every method</sup>",
        xaxis_title="fine-tuning step",
        yaxis_title="loss",
    )
    return Plot(f"grow_curves_{_head(result)}", fig, curves.copy(), meta=dict(steps=result.config.steps))


def summary_plot(result: GrowResult) -> Plot:
    """Held-out loss of each method right after growth (open marker) and after fine-tuning (filled),
    joined by a line, beside the loss before growth (dotted)."""
    rows = []
    for method in METHODS:
        m = result.methods[method]
        rows.append(dict(method=method, stage="after growth", step=0, loss=m["loss_after_init"]))
        rows.append(
            dict(method=method, stage="after fine-tuning", step=result.config.steps, loss=m["loss_after_finetune"])
        )
    data = pd.DataFrame(rows)
    fig = go.Figure()
    for method in METHODS:
        part = data[data["method"] == method]
        color = METHOD_COLORS[method]
        fig.add_trace(
            go.Scatter(
                x=[SHORT_NAMES[method]] * 2,
                y=part["loss"],
                mode="lines+markers+text",
                name=METHOD_NAMES[method],
                showlegend=False,  # named under its own column
                line=dict(color=color, width=3),
                marker=dict(color=color, size=14, symbol=["circle-open", "circle"]),
                text=[f"{v:.4g}" for v in part["loss"]],
                textposition="middle right",
                customdata=part["stage"],
                hovertemplate="%{x}, %{customdata}: %{y:.5g}<extra></extra>",
            )
        )
    fig.add_trace(  # the loss before growth, across the three: a line in the legend, not a label on the points
        go.Scatter(
            x=[SHORT_NAMES[m] for m in METHODS],
            y=[result.loss_before] * len(METHODS),
            mode="lines",
            line=dict(color="grey", dash="dot"),
            name=f"before growth: {result.loss_before:.4g}",
            hoverinfo="skip",
        )
    )
    finite = [v for v in data["loss"] if v > 0 and math.isfinite(v)] + [result.loss_before]
    if min(finite) > 0 and max(finite) > 10 * min(finite):
        fig.update_yaxes(type="log")
    fig.update_layout(
        title=f"Held-out loss of the three methods, {_head(result)}<br>"
        f"<sup>○ right after growth, ● after {result.config.steps} fine-tuning steps</sup>",
        yaxis_title="held-out loss",
        legend=dict(orientation="h", y=-0.2, yanchor="top", x=0),
        xaxis=dict(range=[-0.5, len(METHODS) - 0.1], tickangle=0),
    )
    return Plot(f"grow_summary_{_head(result)}", fig, data.assign(loss_before=result.loss_before))


def heatmap_pair(
    before: View, after: View, head: int, query=None, value: str = "scores", after_label: str = "after growth"
) -> tuple[Plot, Plot]:
    """The bilinear heatmap of one head before and after growth, on the same input."""
    plots = []
    for view, stem, label in ((before, "before", "before growth"), (after, "after", after_label)):
        plot = fb.view_plot(view, head, query, value)
        plot.fig.update_layout(title=f"{label.capitalize()}: {plot.fig.layout.title.text}")
        plots.append(Plot(f"grow_{stem}_{plot.name}", plot.fig, plot.data, meta=dict(plot.meta, stage=label)))
    return plots[0], plots[1]
