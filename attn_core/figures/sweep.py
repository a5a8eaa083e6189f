"""Figures of a sweep (:func:`attn_core.sweep.sweep_result`): the trade-off of every trial,
accuracy against attention entropy, with its Pareto frontier."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from attn_core.figures.base import PALETTE, Plot
from attn_core.figures.layout import FULL_PX, UNIT_RANGE
from attn_core.sweep.plan import pareto

ENTROPY_VIEWS = {"data": "entropy_data", "vocab": "entropy_vocab"}


def trials_frame(result: dict) -> pd.DataFrame:
    """One row per trial that has an ``after`` measurement: run_id, key, reg, lambda, seed,
    status and the measured metrics."""
    rows = []
    for t in result.get("trials", ()):
        if t.get("after"):
            rows.append(
                {
                    "run_id": t["run_id"],
                    "key": t["key"],
                    "reg": t["reg"],
                    "lambda": t["lambda"],
                    "seed": t["seed"],
                    "status": t["status"],
                    **t["after"],
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "run_id",
            "key",
            "reg",
            "lambda",
            "seed",
            "status",
            "accuracy",
            "loss",
            "entropy_data",
            "entropy_vocab",
            "top1_mass",
            "stable_rank",
        ],
    )


def _size(lam, top: float):
    """A marker's diameter in px for lambda (``top`` the sweep's largest): 8 for 0 .. 30 for ``top``."""
    return 8 + 22 * (lam / top if top > 0 else 0)


def pareto_plot(result: dict, view: str = "data") -> Plot:
    """Accuracy (up is better) against mean normalized entropy on data or on the vocabulary view
    (left is more concentrated) of every measured trial: colour = regularizer, marker size grows
    with lambda (the legend shows the sizes), hover = run id; the frontier (no other trial is
    both more accurate and more concentrated) is ringed and joined. Both axes keep their whole
    range 0..1, before any trial is measured too."""
    if view not in ENTROPY_VIEWS:
        raise ValueError(f"view must be one of {', '.join(ENTROPY_VIEWS)}, got {view!r}")
    col = ENTROPY_VIEWS[view]
    df = trials_frame(result)
    done = df[df["status"] == "completed"]
    front = pareto(zip(done["run_id"], done["accuracy"], done[col]))
    df["pareto"] = df["run_id"].isin(front)
    top = float(df["lambda"].max()) if len(df) else 0.0
    fig = go.Figure()
    for i, (reg, part) in enumerate(df.groupby("reg", sort=False)):
        fig.add_trace(
            go.Scatter(
                x=part[col],
                y=part["accuracy"],
                mode="markers",
                name=str(reg),
                legendgroup="regularizer",
                legendgrouptitle_text="regularizer",
                hovertext=list(part["run_id"]),
                customdata=part[["key", "lambda", "seed", "status"]].to_numpy(),
                marker=dict(size=[_size(v, top) for v in part["lambda"]], color=PALETTE[i % len(PALETTE)], opacity=0.8),
                hovertemplate="%{hovertext}<br>%{customdata[0]} (seed %{customdata[2]}, %{customdata[3]})"
                f"<br>{col} %{{x:.4f}}<br>accuracy %{{y:.4f}}<extra></extra>",
            )
        )
    if front:
        pts = df.set_index("run_id").loc[front]
        fig.add_trace(
            go.Scatter(
                x=pts[col],
                y=pts["accuracy"],
                mode="lines+markers",
                name="Pareto frontier",
                legendgroup="frontier",
                line=dict(color="black", dash="dot"),
                marker=dict(
                    size=[_size(v, top) + 8 for v in pts["lambda"]],
                    symbol="circle-open",
                    color="black",
                    line=dict(width=2),
                ),
                hoverinfo="skip",
            )
        )
    lambdas = sorted({float(v) for v in df["lambda"]})
    for v in lambdas if len(lambdas) <= 4 else [lambdas[0], lambdas[len(lambdas) // 2], lambdas[-1]]:
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=f"λ = {v:g}",
                legendgroup="size",
                legendgrouptitle_text="marker size",
                marker=dict(size=_size(v, top), color="lightgrey", line=dict(color="grey", width=1)),
            )
        )
    fig.update_layout(
        title=f"Sweep {result.get('sweep_id', '')}: accuracy vs {view} entropy ({len(df)} trials measured)",
        xaxis=dict(title=f"mean normalized attention entropy ({view}); lower = more concentrated", range=UNIT_RANGE),
        yaxis=dict(title="held-out accuracy", range=UNIT_RANGE),
        legend=dict(itemsizing="trace", groupclick="toggleitem"),
        height=460,
    )
    return Plot(
        f"sweep_pareto_{view}",
        fig,
        df,
        meta=dict(sweep_id=result.get("sweep_id"), view=view, pareto=front),
        width=FULL_PX,
    )
