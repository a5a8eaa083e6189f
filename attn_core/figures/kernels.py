"""Figures of kernelized attention: error against the number of random features,
exact against approximate patterns, and speed against sequence length."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from attn_core.figures.base import Plot
from attn_core.figures.layout import FULL_PX
from attn_core.kernels import METHODS, error_summary

_METRIC_TITLES = {
    "rel_error": "relative output error",
    "tv": "total variation of rows",
    "kl": "KL(exact || approx) of rows",
}


def method_color(method: str) -> str:
    """One colour per kernel method, the same in every figure (by its place in ``METHODS``; a
    method named nowhere there gets a colour after theirs, and exact attention, sdpa, grey)."""
    if method == "sdpa":
        return "grey"
    i = METHODS.index(method) if method in METHODS else len(METHODS) + sum(map(ord, method))
    return qualitative.Plotly[i % len(qualitative.Plotly)]


def error_curves(errors: pd.DataFrame, metric: str = "rel_error", title: str | None = None) -> Plot:
    """Mean over seeds of ``metric`` against the number of features, log-log, one line per
    method; the bars span the smallest to the largest seed (a +-std bar would cross zero on a log
    axis), and a dashed 1/sqrt(m) guide runs through the first method's first point.
    ``errors`` is :func:`attn_core.kernels.error_curve`'s table (one row per run)."""
    if metric not in _METRIC_TITLES:
        raise ValueError(f"metric must be one of {', '.join(_METRIC_TITLES)}, got {metric!r}")
    summary = error_summary(errors)
    spread = errors.groupby(["method", "features"], sort=False)[metric].agg(["min", "max"]).reset_index()
    summary = summary.merge(
        spread.rename(columns={"min": f"{metric}_min", "max": f"{metric}_max"}), on=["method", "features"]
    )
    mean, std, low, high = (summary[f"{metric}_{s}"] for s in ("mean", "std", "min", "max"))
    summary = summary.assign(_plus=high - mean, _minus=mean - low)
    fig = go.Figure()
    for method, part in summary.groupby("method", sort=False):
        fig.add_trace(
            go.Scatter(
                x=part["features"],
                y=part[f"{metric}_mean"],
                name=method,
                mode="lines+markers",
                line={"color": method_color(method)},
                error_y={"type": "data", "symmetric": False, "array": part["_plus"], "arrayminus": part["_minus"]},
                customdata=part[[f"{metric}_std", f"{metric}_min", f"{metric}_max"]].to_numpy(),
                hovertemplate=f"{method}<br>m=%{{x}}<br>mean %{{y:.3g}} ± %{{customdata[0]:.2g}}"
                "<br>seeds %{customdata[1]:.3g} .. %{customdata[2]:.3g}<extra></extra>",
            )
        )
    if len(summary):
        first = summary.iloc[0]
        m = sorted(summary["features"].unique())
        y0 = first[f"{metric}_mean"] * (first["features"] / m[0]) ** 0.5
        fig.add_trace(
            go.Scatter(
                x=m,
                y=[y0 * (m[0] / x) ** 0.5 for x in m],
                name="∝ 1/√m",
                mode="lines",
                line={"color": "grey", "dash": "dash"},
                hoverinfo="skip",
            )
        )
    fig.update_layout(
        title=title or f"{_METRIC_TITLES[metric]} against the number of features",
        xaxis_title="features m",
        yaxis_title=_METRIC_TITLES[metric],
    )
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return Plot(f"kernels_{metric}_curve", fig, summary.drop(columns=["_plus", "_minus"]), meta={"metric": metric})


def pattern_comparison(
    exact, approx, labels: Sequence[str] | None = None, approx_label: str = "approximation", title: str | None = None
) -> Plot:
    """Exact and approximate attention patterns side by side on one colour scale, [n, n] each
    (one batch element of :func:`exact_pattern` / :func:`approx_pattern`); ``labels`` name the
    positions (token names), ``approx_label`` the method. The title carries the mean row TV."""
    exact, approx = (t.detach().double().cpu() for t in (exact, approx))
    if exact.dim() != 2 or exact.shape != approx.shape:
        raise ValueError(
            f"need two patterns of the same [n, n] shape, got {tuple(exact.shape)} and {tuple(approx.shape)}"
        )
    n = exact.shape[0]
    labels = list(labels) if labels is not None else [str(i) for i in range(n)]
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} positions")
    ticks = [f"{i}:{name}" for i, name in enumerate(labels)]
    tv = (0.5 * (approx - exact).abs().sum(-1)).mean().item()
    top = max(exact.max().item(), approx.max().item())
    fig = make_subplots(rows=1, cols=2, subplot_titles=("exact softmax", approx_label), shared_yaxes=True)
    for col, mat in ((1, exact), (2, approx)):
        fig.add_trace(
            go.Heatmap(
                z=mat.numpy(),
                x=ticks,
                y=ticks,
                zmin=0.0,
                zmax=top,
                colorscale="Viridis",
                showscale=col == 2,
                hovertemplate="query %{y}<br>key %{x}<br>%{z:.3f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.update_yaxes(autorange="reversed", title_text="query", row=1, col=1)
    fig.update_xaxes(title_text="key")
    fig.update_layout(title=title or f"attention pattern, exact vs approximate (mean row TV {tv:.3f})")
    idx = pd.MultiIndex.from_product([range(n), range(n)], names=["query", "key"]).to_frame(index=False)
    data = idx.assign(
        query_token=[labels[i] for i in idx["query"]],
        key_token=[labels[j] for j in idx["key"]],
        exact=exact.reshape(-1).numpy(),
        approx=approx.reshape(-1).numpy(),
    )
    return Plot("kernels_patterns", fig, data, meta={"mean_row_tv": tv}, width=FULL_PX)


def speed_chart(result: dict, title: str | None = None) -> Plot:
    """Milliseconds against sequence length, log-log, one line per method, from
    the result of `benchmarks/kernel_methods.py`'s `run`; hover gives the speed-up over sdpa and peak memory."""
    rows = pd.DataFrame(result["rows"])
    fig = go.Figure()
    for method, part in rows.groupby("method", sort=False):
        fig.add_trace(
            go.Scatter(
                x=part["n"],
                y=part["ms"],
                name=method,
                mode="lines+markers",
                line={"color": method_color(method), "dash": "dash" if method == "sdpa" else None},
                customdata=part[["ratio", "peak_mb"]].to_numpy(),
                hovertemplate=f"{method}<br>n=%{{x}}<br>%{{y:.1f}} ms<br>sdpa/this %{{customdata[0]:.2f}}x"
                f"<br>peak %{{customdata[1]:.0f}} MB<extra></extra>",
            )
        )
    cfg = result.get("config", {})
    mode = "causal" if cfg.get("causal") else "non-causal"
    fig.update_layout(
        title=title
        or f"time per call ({mode}, {cfg.get('heads', '?')} heads, d_head {cfg.get('d_head', '?')}, "
        f"m={cfg.get('features', '?')})",
        xaxis_title="sequence length n",
        yaxis_title="ms (median)",
    )
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return Plot(
        "kernels_speed", fig, rows, meta={"crossover": result.get("crossover", {}), "config": cfg}, width=FULL_PX
    )
