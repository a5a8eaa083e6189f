"""Figures of a sweep (:func:`attn_core.sweep.sweep_result`): the trade-off of every trial,
accuracy against attention entropy, with its Pareto frontier."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from attn_core.figures.base import Plot
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


def pareto_plot(result: dict, view: str = "data") -> Plot:
    """Accuracy (up is better) against mean normalized entropy on data or on the vocabulary view
    (left is more concentrated) of every measured trial: colour = regularizer, size = lambda,
    hover = run id; the frontier (maximise accuracy, minimise entropy) as a line."""
    if view not in ENTROPY_VIEWS:
        raise ValueError(f"view must be one of {', '.join(ENTROPY_VIEWS)}, got {view!r}")
    col = ENTROPY_VIEWS[view]
    df = trials_frame(result)
    done = df[df["status"] == "completed"]
    front = pareto(zip(done["run_id"], done["accuracy"], done[col]))
    df["pareto"] = df["run_id"].isin(front)
    df["size"] = 8 + 22 * (df["lambda"] / df["lambda"].max() if len(df) and df["lambda"].max() > 0 else 0)
    title = f"Sweep {result.get('sweep_id', '')}: accuracy vs {view} entropy ({len(df)} trials)"
    if len(df):
        fig = px.scatter(
            df,
            x=col,
            y="accuracy",
            color="reg",
            size="size",
            size_max=24,
            hover_name="run_id",
            hover_data={
                "key": True,
                "lambda": True,
                "seed": True,
                "status": True,
                "size": False,
                col: ":.4f",
                "accuracy": ":.4f",
            },
        )
    else:
        fig = go.Figure()
    if front:
        pts = df.set_index("run_id").loc[front]
        fig.add_trace(
            go.Scatter(
                x=pts[col],
                y=pts["accuracy"],
                mode="lines",
                name="Pareto frontier",
                line=dict(color="black", dash="dot"),
                hoverinfo="skip",
            )
        )
    fig.update_layout(
        title=title,
        xaxis_title=f"mean normalized attention entropy ({view}); lower = more concentrated",
        yaxis_title="held-out accuracy",
        legend_title="regularizer",
        height=460,
    )
    return Plot(
        f"sweep_pareto_{view}",
        fig,
        df.drop(columns=["size"]),
        meta=dict(sweep_id=result.get("sweep_id"), view=view, pareto=front),
    )
