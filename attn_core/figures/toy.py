"""Figures of toy attention (attn_core.toy_attention): weights, the output c in the
plane of v_a and v_b, the histogram of alpha_a, and one head against two."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attn_core.figures.base import Plot
from attn_core.figures.layout import FULL_PX, UNIT_RANGE
from attn_core.toy_attention import Experiment, predicted_alpha_a

# Scatter plots draw at most this many samples (SVG/PNG stay light); the CSV keeps them all.
MAX_POINTS = 3000
# An odd bin count centres a bin on 1/2, where the average case piles up.
HIST_BINS = np.linspace(0.0, 1.0, 52)
COLORS = ("#1f77b4", "#d62728", "#2ca02c")


def _label(exp: Experiment) -> str:
    return "1 head" if exp.n_heads == 1 else f"{exp.n_heads} heads"


def _key_names(exp: Experiment) -> list[str]:
    role = {exp.a: " (a)", exp.b: " (b)"} if exp.settings["case"] == "average" else {exp.a: " (a)"}
    return [f"k{i}{role.get(i, '')}" for i in range(len(exp.means))]


def weights_plot(exp: Experiment) -> Plot:
    """Box per key of alpha_i over the samples, one colour per head; quartiles are computed
    here so every sample counts however many there are."""
    names = _key_names(exp)
    rows = []
    for h in range(exp.n_heads):
        w = exp.head_weights[:, h, :]  # [S, n]
        q = np.quantile(w, [0.0, 0.25, 0.5, 0.75, 1.0], axis=0)  # [5, n]
        for i, name in enumerate(names):
            rows.append(
                dict(
                    head=h + 1,
                    key=i,
                    key_name=name,
                    mean=w[:, i].mean(),
                    std=w[:, i].std(),
                    min=q[0, i],
                    q1=q[1, i],
                    median=q[2, i],
                    q3=q[3, i],
                    max=q[4, i],
                )
            )
    data = pd.DataFrame(rows)
    fig = go.Figure()
    for h, part in data.groupby("head"):
        color = COLORS[(h - 1) % len(COLORS)]
        fig.add_trace(
            go.Box(
                x=part["key_name"],
                q1=part["q1"],
                median=part["median"],
                q3=part["q3"],
                lowerfence=part["min"],
                upperfence=part["max"],
                mean=part["mean"],
                name=f"head {h}",
                marker_color=color,
                boxpoints=False,
            )
        )
    fig.update_layout(
        title=f"Attention weights α_i over {exp.settings['n_samples']} key samples",
        xaxis_title="key",
        yaxis_title="α_i",
        yaxis_range=UNIT_RANGE,
        boxmode="group",
    )
    return Plot("toy_weights", fig, data, meta=dict(exp.settings), width=FULL_PX)


def output_plot(exp: Experiment) -> Plot:
    """c in the coordinates of (v_a, v_b), coloured by gamma (the chosen key's scale along its
    mean); v_a = (1, 0), v_b = (0, 1), their average (1/2, 1/2)."""
    xy = exp.plane_coordinates()
    j = exp.settings["big_var_index"]
    data = pd.DataFrame(
        dict(
            sample=np.arange(len(xy)),
            x=xy[:, 0],
            y=xy[:, 1],
            gamma=exp.gamma,
            alpha_a=exp.alpha_a,
            alpha_b=exp.alpha_b,
            dist_a=exp.dist_a,
            dist_b=exp.dist_b,
            dist_average=exp.dist_average,
        )
    )
    shown = data.iloc[:MAX_POINTS]
    # Diverging around gamma = 1, where one head's alpha_a tips from v_b to v_a; clipped so a
    # few far samples do not wash the colours out.
    reach = max(float(np.quantile(np.abs(exp.gamma - 1.0), 0.98)), 1e-6)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=shown.x,
            y=shown.y,
            mode="markers",
            name="c (one per sample)",
            marker=dict(
                size=6,
                opacity=0.6,
                color=shown.gamma,
                colorscale="Bluered",
                cmin=1 - reach,
                cmax=1 + reach,
                colorbar=dict(title=f"γ (k{j})"),
            ),
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[1, 0, 0.5],
            y=[0, 1, 0.5],
            mode="markers+text",
            name="targets",
            text=["v_a", "v_b", "(v_a+v_b)/2"],
            textposition="top center",
            marker=dict(size=14, symbol="x", color="grey"),
        )
    )
    sub = "" if len(data) <= MAX_POINTS else f" (first {MAX_POINTS} of {len(data)} shown)"
    fig.update_layout(
        title=f"Output c in the plane of v_a, v_b{sub}",
        xaxis_title="coefficient of v_a",
        yaxis_title="coefficient of v_b",
        xaxis=dict(range=[-0.1, 1.15], constrain="domain"),
        yaxis=dict(range=[-0.1, 1.15], scaleanchor="x", scaleratio=1, constrain="domain"),
        height=520,
        legend=dict(orientation="h", y=-0.2),
    )
    return Plot("toy_output", fig, data, meta=dict(exp.settings))


def alpha_histogram(
    exps: list[Experiment], name: str = "toy_alpha_a_hist", title: str = "α_a (weight on v_a in c) over the samples"
) -> Plot:
    """Share of samples per alpha_a bin, one bar series per experiment (e.g. 1 and 2 heads)."""
    data = pd.DataFrame(dict(bin_left=HIST_BINS[:-1], bin_right=HIST_BINS[1:]))
    fig = go.Figure()
    for k, exp in enumerate(exps):
        counts, _ = np.histogram(np.clip(exp.alpha_a, 0.0, 1.0), bins=HIST_BINS)
        share = counts / counts.sum()
        data[f"share {_label(exp)}"] = share
        fig.add_trace(
            go.Bar(
                x=(HIST_BINS[:-1] + HIST_BINS[1:]) / 2,
                y=share,
                width=HIST_BINS[1] - HIST_BINS[0],
                name=_label(exp),
                marker_color=COLORS[k % len(COLORS)],
                opacity=0.65,
            )
        )
    fig.update_layout(
        title=title,
        barmode="overlay",
        xaxis_title="α_a",
        yaxis_title="share of samples",
        xaxis_range=UNIT_RANGE,
    )
    return Plot(name, fig, data, meta=dict(exps[0].settings, heads=[e.n_heads for e in exps]), width=FULL_PX)


def head_comparison_plot(exps: list[Experiment]) -> Plot:
    """alpha_a against gamma for each head count on the same keys, with the alpha -> 0 curve
    (``predicted_alpha_a``): one head follows a sigmoid centred at gamma = 1, two heads sit at
    1/2 for every gamma above ~log(n - 1) / beta."""
    j = exps[0].settings["big_var_index"]
    lo, hi = np.quantile(np.concatenate([e.gamma for e in exps]), [0.0, 1.0])
    pad = max(hi - lo, 0.2) * 0.05
    grid = np.linspace(lo - pad, hi + pad, 400)
    frames = []
    fig = go.Figure()
    for k, exp in enumerate(exps):
        color = COLORS[k % len(COLORS)]
        frames.append(
            pd.DataFrame(
                dict(
                    heads=exp.n_heads,
                    sample=np.arange(len(exp.gamma)),
                    gamma=exp.gamma,
                    alpha_a=exp.alpha_a,
                    dist_average=exp.dist_average,
                )
            )
        )
        fig.add_trace(
            go.Scatter(
                x=exp.gamma[:MAX_POINTS],
                y=exp.alpha_a[:MAX_POINTS],
                mode="markers",
                name=f"{_label(exp)}: samples",
                marker=dict(size=5, opacity=0.45, color=color),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=grid,
                y=predicted_alpha_a(exp, grid),
                mode="lines",
                name=f"{_label(exp)}: other keys at their means",
                line=dict(color=color, width=2),
            )
        )
    fig.add_hline(y=0.5, line_dash="dot", line_color="gray")
    fig.update_layout(
        title=f"α_a against γ = k{j}·μ{j} / |μ{j}|², one head vs two",
        xaxis_title=f"γ (scale of k{j} along its mean)",
        yaxis_title="α_a",
        yaxis_range=UNIT_RANGE,
        legend=dict(orientation="h", y=-0.2),
    )
    return Plot(
        "toy_heads",
        fig,
        pd.concat(frames, ignore_index=True),
        meta=dict(exps[0].settings, heads=[e.n_heads for e in exps]),
        width=FULL_PX,
    )


def summary_table(exps: list[Experiment]) -> pd.DataFrame:
    """One row per experiment: the spread of alpha_a and the distances of c to its targets."""
    return pd.DataFrame([e.summary() for e in exps]).set_index("heads")
