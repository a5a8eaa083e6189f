"""Figures of the merged vs factored QK comparison (attn_core.qk): learning
curves with their spread over seeds, final loss and accuracy, stable rank of B by layer, the
normalized spectrum of B, accuracy when B is cut to rank r, and the cost (parameters, time per
step). Each takes a :class:`~attn_core.qk.result.Comparison`; one colour per variant throughout,
dashed lines for merged heads."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.colors import hex_to_rgb, qualitative
from plotly.subplots import make_subplots

from attn_core.figures.base import Plot
from attn_core.figures.layout import FULL_PX, UNIT_RANGE
from attn_core.qk.config import VARIANT_KINDS
from attn_core.qk.result import Comparison

CURVE_METRICS = {
    "eval_loss": "held-out loss",
    "eval_accuracy": "held-out accuracy",
    "loss": "training loss (mean over the last eval_every steps)",
    "accuracy": "training accuracy (mean over the last eval_every steps)",
}


# Every variant a comparison can have, in one fixed order: a variant's colour is its place here,
# so "merged + wd" has the same colour in the saved comparison and in a fresh one with fewer
# variants (colours by position in each comparison's own list differed between the two).
D_QK_ORDER = (1, 2, 4, 8, 16, 32, 64)
ORDER = [f"factored d_qk={w}" for w in D_QK_ORDER] + list(VARIANT_KINDS[1:])


def variant_colors(names: list[str]) -> dict[str, str]:
    """The colour of each variant name: by its place in :data:`ORDER` (other widths after it)."""
    palette = qualitative.Plotly

    def place(name: str) -> int:
        if name in ORDER:
            return ORDER.index(name)
        return len(ORDER) + sorted(n for n in names if n not in ORDER).index(name)

    return {n: palette[place(n) % len(palette)] for n in names}


def _rgba(color: str, alpha: float) -> str:
    r, g, b = hex_to_rgb(color)
    return f"rgba({r}, {g}, {b}, {alpha})"


def _dash(comparison: Comparison, name: str) -> str:
    return "dash" if any(r["variant"] == name and r["qk"] == "merged" for r in comparison.runs) else "solid"


def _seed_stats(df: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """Mean, sample std (0 for one seed), min, max and count over seeds of ``value``."""
    g = df.groupby(keys, sort=False)[value]
    out = g.agg(["mean", "std", "min", "max", "count"]).reset_index()
    out["std"] = out["std"].fillna(0.0)
    return out


def curves_plot(comparison: Comparison, metric: str = "eval_loss") -> Plot:
    """``metric`` against the training step, one line per variant (mean over seeds) with a band of
    +-1 standard deviation over seeds; loss on a log axis."""
    if metric not in CURVE_METRICS:
        raise ValueError(f"metric must be one of {', '.join(CURVE_METRICS)}, got {metric!r}")
    curves = comparison.curves()
    stats = _seed_stats(curves[curves["metric"] == metric], ["variant", "step"], "value")
    colors = variant_colors(comparison.variant_names())
    fig = go.Figure()
    for name in comparison.variant_names():
        part = stats[stats["variant"] == name]
        if part.empty:
            continue
        upper, lower = part["mean"] + part["std"], part["mean"] - part["std"]
        if "loss" in metric:
            lower = lower.clip(lower=part["mean"].min() * 1e-3)  # a log axis cannot show <= 0
        fig.add_trace(
            go.Scatter(
                x=list(part["step"]) + list(part["step"])[::-1],
                y=list(upper) + list(lower)[::-1],
                fill="toself",
                fillcolor=_rgba(colors[name], 0.18),
                line=dict(width=0),
                hoverinfo="skip",
                showlegend=False,
                legendgroup=name,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=part["step"],
                y=part["mean"],
                name=name,
                legendgroup=name,
                mode="lines",
                line=dict(color=colors[name], dash=_dash(comparison, name)),
                customdata=part[["std", "count"]].to_numpy(),
                hovertemplate=f"{name}<br>step %{{x}}<br>mean %{{y:.4g}} ± %{{customdata[0]:.3g}} "
                f"(%{{customdata[1]}} seeds)<extra></extra>",
            )
        )
    seeds = comparison.config.seeds
    fig.update_layout(
        title=f"{CURVE_METRICS[metric].capitalize()} on {comparison.config.task}: mean over "
        f"{seeds} seed{'s' * (seeds != 1)}, band ±1 std",
        xaxis_title="step",
        yaxis_title=CURVE_METRICS[metric],
        legend_title="variant",
    )
    if "loss" in metric:
        fig.update_yaxes(type="log")
    else:
        fig.update_yaxes(range=UNIT_RANGE)
    return Plot(
        f"qk_curves_{metric}", fig, stats.rename(columns={"count": "seeds"}), meta={"metric": metric}, width=FULL_PX
    )


def final_plot(comparison: Comparison) -> Plot:
    """Final held-out loss and accuracy per variant. Loss spans decades, so it is a dot per
    variant (mean, whiskers +-1 std) on a log axis, where bars could not start at zero;
    accuracy is a bar from 0 on its whole range 0..1. Open grey circles: each seed."""
    per_seed = comparison.per_seed()
    colors = variant_colors(comparison.variant_names())
    fig = make_subplots(rows=1, cols=2, subplot_titles=("final held-out loss (log)", "final held-out accuracy"))
    rows = []
    for col, key in ((1, "final_loss"), (2, "accuracy")):
        stats = _seed_stats(per_seed, ["variant"], key)
        shape = dict(
            x=stats["variant"],
            y=stats["mean"],
            error_y=dict(type="data", array=stats["std"], visible=True),
            showlegend=False,
            hovertemplate="%{x}<br>mean %{y:.4g}<extra></extra>",
        )
        if key == "final_loss":
            trace = go.Scatter(
                mode="markers",
                marker=dict(size=13, symbol="diamond", color=[colors[v] for v in stats["variant"]]),
                **shape,
            )
        else:
            trace = go.Bar(marker_color=[colors[v] for v in stats["variant"]], **shape)
        fig.add_trace(trace, row=1, col=col)
        fig.add_trace(
            go.Scatter(
                x=per_seed["variant"],
                y=per_seed[key],
                mode="markers",
                showlegend=False,
                marker=dict(size=6, symbol="circle-open", color="gray"),
                customdata=per_seed["seed"],
                hovertemplate="%{x}<br>seed %{customdata}: %{y:.4g}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        rows.append(stats.assign(metric=key))
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(range=UNIT_RANGE, row=1, col=2)
    fig.update_layout(
        title=f"Final loss and accuracy, {comparison.config.measure_samples} held-out sequences "
        "(mean ± std, dots: seeds)"
    )
    return Plot("qk_final", fig, pd.concat(rows, ignore_index=True).rename(columns={"count": "seeds"}), width=FULL_PX)


def rank_plot(comparison: Comparison) -> Plot:
    """Stable rank ||B||_F^2 / ||B||_2^2 of the learned B, by variant and layer (mean over heads
    and seeds, whiskers +-1 std over seeds of the per-seed head means)."""
    rows = [
        {
            "variant": r["variant"],
            "seed": r["seed"],
            "layer": h["layer"],
            "head": h["head"],
            "stable_rank": h["stable_rank"],
            "rank_cap": h["rank_cap"],
        }
        for r in comparison.runs
        for h in r["spectrum"]
    ]
    heads = pd.DataFrame(rows, columns=["variant", "seed", "layer", "head", "stable_rank", "rank_cap"])
    per_seed = (
        heads.groupby(["variant", "layer", "seed"], sort=False)
        .agg(stable_rank=("stable_rank", "mean"), rank_cap=("rank_cap", "max"))
        .reset_index()
    )
    stats = _seed_stats(per_seed, ["variant", "layer"], "stable_rank")
    stats["rank_cap"] = per_seed.groupby(["variant", "layer"], sort=False)["rank_cap"].max().to_numpy()
    fig = go.Figure()
    for layer in sorted(stats["layer"].unique()):
        part = stats[stats["layer"] == layer]
        fig.add_trace(
            go.Bar(
                x=part["variant"],
                y=part["mean"],
                name=f"layer {layer}",
                error_y=dict(type="data", array=part["std"], visible=True),
                customdata=part[["std", "rank_cap"]].to_numpy(),
                hovertemplate="%{x}, layer " + str(layer) + "<br>stable rank %{y:.3g} ± %{customdata[0]:.2g}"
                "<br>rank cap %{customdata[1]}<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="group",
        title="Stable rank of the learned B (mean over heads and seeds, ±1 std over seeds)",
        xaxis_title="variant",
        yaxis_title="‖B‖²_F / ‖B‖²₂",
        legend_title="layer",
    )
    return Plot("qk_stable_rank", fig, stats.rename(columns={"count": "seeds"}), width=FULL_PX)


def spectrum_plot(comparison: Comparison) -> Plot:
    """Singular values of B normalized by the largest, sigma_i / sigma_1, against i (log scale),
    one panel per layer, mean over heads and seeds per variant. A factored head has at most d_qk
    non-zero values; a merged one up to d_model."""
    spectra = comparison.spectra()
    spectra = spectra.assign(i=spectra["index"] + 1)
    stats = _seed_stats(spectra, ["variant", "layer", "i"], "normalized")
    layers = sorted(stats["layer"].unique())
    colors = variant_colors(comparison.variant_names())
    fig = make_subplots(rows=1, cols=len(layers), subplot_titles=[f"layer {l}" for l in layers], shared_yaxes=True)
    for col, layer in enumerate(layers, start=1):
        for name in comparison.variant_names():
            part = stats[(stats["variant"] == name) & (stats["layer"] == layer)]
            fig.add_trace(
                go.Scatter(
                    x=part["i"],
                    y=part["mean"],
                    name=name,
                    legendgroup=name,
                    showlegend=col == 1,
                    mode="lines+markers",
                    marker=dict(size=4),
                    line=dict(color=colors[name], dash=_dash(comparison, name)),
                    hovertemplate=f"{name}<br>σ_%{{x}} / σ_1 = %{{y:.3g}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(title_text="i", row=1, col=col)
    fig.update_yaxes(type="log", title_text="σ_i / σ_1", row=1, col=1)
    fig.update_layout(title="Spectrum of the learned B (σ_i / σ_1, mean over heads and seeds)", legend_title="variant")
    return Plot("qk_spectrum", fig, stats.rename(columns={"count": "samples"}), width=FULL_PX)


def truncation_plot(comparison: Comparison) -> Plot:
    """Held-out accuracy when every head's B is replaced by its best rank-r approximation, against
    r (mean over seeds, whiskers +-1 std): how much of its rank each variant uses."""
    stats = _seed_stats(comparison.truncation(), ["variant", "rank"], "accuracy")
    colors = variant_colors(comparison.variant_names())
    fig = go.Figure()
    for name in comparison.variant_names():
        part = stats[stats["variant"] == name]
        fig.add_trace(
            go.Scatter(
                x=part["rank"],
                y=part["mean"],
                name=name,
                mode="lines+markers",
                line=dict(color=colors[name], dash=_dash(comparison, name)),
                error_y=dict(type="data", array=part["std"], visible=True),
                hovertemplate=f"{name}<br>rank %{{x}}: accuracy %{{y:.3f}}<extra></extra>",
            )
        )
    ranks = sorted(stats["rank"].unique())
    fig.update_xaxes(type="log", tickvals=ranks, ticktext=[str(r) for r in ranks])
    fig.update_layout(
        title="Accuracy with every B cut to rank r (Eckart–Young truncation)",
        xaxis_title="rank r",
        yaxis_title="held-out accuracy",
        yaxis_range=UNIT_RANGE,
        legend_title="variant",
    )
    return Plot("qk_truncation", fig, stats.rename(columns={"count": "seeds"}), width=FULL_PX)


def cost_plot(comparison: Comparison) -> Plot:
    """Query/key parameters per head, parameters of the whole model, and the median wall time of a
    training step (measured in one process, held-out evaluations excluded)."""
    summary = pd.DataFrame(comparison.summary())
    data = summary[["name", "qk", "rank_cap", "params_qk_per_head", "params", "ms_per_step"]]
    colors = [variant_colors(comparison.variant_names())[n] for n in data["name"]]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("QK parameters per head", "model parameters", "ms per step"))
    for col, key, fmt in (
        (1, "params_qk_per_head", "%{y:,}"),
        (2, "params", "%{y:,}"),
        (3, "ms_per_step", "%{y:.2f} ms"),
    ):
        fig.add_trace(
            go.Bar(
                x=data["name"],
                y=data[key],
                marker_color=colors,
                showlegend=False,
                hovertemplate="%{x}<br>" + fmt + "<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.update_layout(
        title=f"Cost: QK parameters per head (2·d_model·d_qk or d_model² = {comparison.config.d_model**2}), "
        "model size, median step time"
    )
    return Plot("qk_cost", fig, data.reset_index(drop=True), meta={"machine": comparison.machine}, width=FULL_PX)


def all_plots(comparison: Comparison) -> list[Plot]:
    """Every figure of the comparison, in the page's order."""
    return [
        curves_plot(comparison, "eval_loss"),
        curves_plot(comparison, "eval_accuracy"),
        final_plot(comparison),
        cost_plot(comparison),
        rank_plot(comparison),
        spectrum_plot(comparison),
        truncation_plot(comparison),
    ]
