"""Figures of retraining on text (attn_core.text): perplexity over steps, and one head before
and after retraining on the same sentence, side by side on one colour scale (the heatmap is
``figures.bilinear.view_plot``'s)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attn_core.bilinear.views import View
from attn_core.figures.base import Plot
from attn_core.figures.bilinear import view_plot
from attn_core.figures.layout import TITLE_CHAR_PX, wrap_title
from attn_core.regularizers import head_label


def perplexity_plot(metrics: pd.DataFrame, title: str = "Perplexity", before: float | None = None) -> Plot:
    """exp(loss) over steps from the metric log: held-out perplexity (``eval_loss``, markers;
    ``before``, the held-out perplexity measured before training, at step 0) and the training
    batch's (``task_loss``), log scale."""
    fig = go.Figure()
    rows = []
    empty = pd.DataFrame(columns=["step", "value"])
    for name, label, mode in (("task_loss", "training batch", "lines"), ("eval_loss", "held-out", "lines+markers")):
        s = metrics[metrics["name"] == name][["step", "value"]] if len(metrics) else empty
        if name == "eval_loss" and before is not None and math.isfinite(before) and before > 0:
            s = pd.concat([pd.DataFrame({"step": [0], "value": [math.log(before)]}), s], ignore_index=True)
        ppl = np.exp(np.minimum(s["value"].to_numpy(dtype=float), 700.0))
        if len(s):
            fig.add_trace(go.Scatter(x=s["step"].to_numpy(), y=ppl, name=label, mode=mode))
        rows.append(pd.DataFrame({"step": s["step"].to_numpy(), "name": f"perplexity ({label})", "value": ppl}))
    if not fig.data:
        fig.add_annotation(text="no step yet", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_yaxes(type="log", title_text="perplexity exp(loss)")
    fig.update_xaxes(title_text="step")
    fig.update_layout(title=title, height=360)
    return Plot("perplexity", fig, pd.concat(rows, ignore_index=True))


def before_after_plots(
    before: View, after: View, head: int, query: int | None, value: str, titles=("before", "after")
) -> list[Plot]:
    """The same head of two models on the same tokens (``before``, ``after``: sequence views),
    as two heatmaps with one colour scale (scores: symmetric around 0 over both), their titles
    starting with ``titles``."""
    plots = [view_plot(v, head, query, value) for v in (before, after)]
    if value == "scores":
        tops = [float(np.nanmax(np.abs(p.fig.data[0].z))) for p in plots]
        top = max([t for t in tops if math.isfinite(t)] or [1.0])
        for p in plots:
            p.fig.data[0].update(zmin=-top, zmax=top)
    # "before (model): pattern A, layer 1 head 0", wrapped evenly, and both titles as many lines
    # long (a short one padded): the two heatmaps start at one height, side by side
    texts = []
    for p, label in zip(plots, titles):
        what = p.fig.layout.title.text.replace("<br>", " ").split(": ", 1)[-1]  # without the view's name
        texts.append(wrap_title(f"{label}: {what}", int(p.width / TITLE_CHAR_PX)))
    lines = max(t.count("<br>") for t in texts) + 1
    out = []
    for p, stem, text in zip(plots, ("before", "after"), texts):
        p.fig.update_layout(title=text + "<br> " * (lines - 1 - text.count("<br>")))
        out.append(p.renamed(f"{stem}_{value}_{head_label(after.layer, head)}"))
    return out
