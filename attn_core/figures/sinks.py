"""Figures of attention sinks (attn_core.bilinear.sinks): every head's importance of each key
position with its sink keys marked, a sink head's pattern with its sink columns apart (or left
out and the rest renormalized), and sink rates across training or settings (experiments)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from attn_core import metrics
from attn_core.bilinear import View
from attn_core.bilinear.sinks import EPS, Sinks
from attn_core.figures.base import PALETTE, Plot
from attn_core.figures.layout import FULL_PX, HALF_PX, fixed_margins, token_ticks
from attn_core.regularizers import head_label

SINK_MARK = "#d62728"
MODES = ("apart", "renormalized")  # a sink head's pattern: sink columns beside the rest, or left out


def importance_plot(s: Sinks, width: int = FULL_PX) -> Plot:
    """Heatmap of every head (rows) by key position (columns): the importance of the key, the
    mean attention it receives over the queries that see it, on 0..1; sink keys (importance > eps
    among the keys enough queries see) outlined, sink heads named so on the axis; the keys too few
    queries see (beyond the dotted line) are shown but never sinks. With learned sinks, a first
    column ("sink", at x = -1) is each head's mean share of a row's mass on its sink logit."""
    L, H, T = s.importance.shape
    z = s.importance.reshape(L * H, T)
    sinks = s.sinks.reshape(L * H, T)
    is_sink = s.is_sink.reshape(-1).tolist()
    labels = [head_label(l, h) + (" ◆" if is_sink[l * H + h] else "") for l in range(L) for h in range(H)]
    keys = [str(k) for k in range(T)]
    x = np.arange(T)
    if s.learned is not None:  # the learned sink's share as a column of its own, left of key 0
        z = torch.cat([s.learned.reshape(L * H, 1).to(z), z], dim=1)
        keys, x = ["sink", *keys], np.arange(-1, T)
    fig = go.Figure(
        go.Heatmap(
            z=z.numpy(),
            x=x,
            y=np.arange(L * H),
            colorscale="Viridis",
            zmin=0.0,
            zmax=1.0,
            colorbar=dict(title=dict(text="importance", side="right"), thickness=18),  # on top, it was cut
            hovertemplate="%{customdata}, key %{x}<br>importance %{z:.3f}<extra></extra>",
            customdata=np.array([[labels[r]] * len(x) for r in range(L * H)], dtype=object),
        )
    )
    rows, cols = torch.nonzero(sinks, as_tuple=True)
    if len(rows):
        fig.add_trace(
            go.Scatter(
                x=cols.numpy(),
                y=rows.numpy(),
                mode="markers",
                marker=dict(symbol="square-open", size=max(6, min(16, 600 // max(T, L * H))), color=SINK_MARK),
                name=f"sink (> {s.eps:g})",
                hoverinfo="skip",
            )
        )
    last = int(torch.nonzero(s.eligible[0]).max()) if bool(s.eligible[0].any()) else -1
    if last < T - 1:
        fig.add_vline(x=last + 0.5, line=dict(color="grey", dash="dot", width=1))
    learned = "" if s.learned is None else f"; learned sink (column 'sink'): {s.learned_mean:.0%} of the mass"
    fig.update_layout(
        title=f"Key importance per head: sink rate {s.rate:.0%} ({int(s.is_sink.sum())} of {L * H} heads, "
        f"eps {s.eps:g}; first token: {s.rate_first:.0%}{learned}), {s.what}",
        xaxis=dict(title="key position", **token_ticks(keys, first=int(x[0]))),
        yaxis=dict(title="head (◆ sink head)", autorange="reversed", **token_ticks(labels)),
        height=max(320, min(900, 22 * L * H + 180)),
        showlegend=bool(len(rows)),
        legend=dict(orientation="h", y=-0.2),
    )
    fixed_margins(fig, width=width)

    def data() -> pd.DataFrame:
        return pd.DataFrame(
            [
                dict(
                    layer=r["layer"],
                    head=r["head"],
                    key=k,
                    importance=v,
                    eligible=bool(s.eligible[r["layer"], k]),
                    sink=k in r["sink_keys"],
                )
                for r in s.heads()
                for k, v in enumerate(r["importance"])
            ]
        )

    meta = dict(eps=s.eps, rate=s.rate, rate_first=s.rate_first, probes=s.n_probes, length=T, inputs=s.what)
    if s.learned is not None:
        meta["learned_mean"] = s.learned_mean
    return Plot("sinks", fig, data, meta=meta, width=width)


def sink_view_plot(
    view: View, head: int, mode: str = "apart", eps: float = EPS, value: str = "pattern", width: int = HALF_PX
) -> Plot:
    """A head's heatmap with its sink keys (on this input: ``View.sink_keys``) kept from
    swamping it: ``apart`` draws the sink columns in a narrow panel of their own, the other keys
    beside them on their own colour range; ``renormalized`` leaves the sink columns out and
    renormalizes each row of the pattern over the keys left (metrics.drop_keys). Without a sink
    the whole heatmap is drawn, with a note."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if value not in ("scores", "pattern"):
        raise ValueError(f"value must be scores or pattern, got {value!r}")
    if mode == "renormalized" and value != "pattern":
        raise ValueError("only the pattern is renormalized without its sinks (scores are not probabilities)")
    i = view.head_index(head)
    sinks = view.sink_keys(eps)[i]
    where = torch.nonzero(sinks).flatten().tolist()
    rest = torch.nonzero(~sinks).flatten().tolist()
    mask = view.mask
    z = (view.pattern if value == "pattern" else view.scores)[i].masked_fill(~mask, math.nan)
    if mode == "renormalized":
        p, kept = metrics.drop_keys(view.pattern[i], mask, sinks)
        z = p.masked_fill(~kept, math.nan)
    colour = "Viridis" if value == "pattern" else "RdBu"
    label = "A" if value == "pattern" else "f_x(y)"
    nq = len(view.queries)
    sink_text = ", ".join(view.keys[k] for k in where) or "none"
    if mode == "apart" and where and rest:
        frac = max(0.12, min(0.4, len(where) / len(view.keys)))
        fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[frac, 1 - frac], horizontal_spacing=0.03)
        for col, keys in ((1, where), (2, rest)):
            part = z[:, keys]
            finite = part[torch.isfinite(part)]
            span = dict(zmin=float(finite.min()), zmax=float(finite.max())) if finite.numel() else {}
            if value == "scores" and finite.numel():
                span = dict(zmid=0.0)
            if col == 1:  # the sink columns: their own numbers, written in the cells
                span = dict(zmin=0.0, zmax=1.0) if value == "pattern" else span
                span |= dict(texttemplate="%{z:.2f}", textfont=dict(size=9))
            fig.add_trace(
                go.Heatmap(
                    z=part.numpy(),
                    x=[view.keys[k] for k in keys],
                    y=view.queries,
                    colorscale=colour,
                    showscale=col == 2,
                    colorbar=dict(title=label),
                    hovertemplate="%{y} → %{x}<br>%{z:.4g}<extra></extra>",
                    **span,
                ),
                row=1,
                col=col,
            )
            fig.update_xaxes(
                type="category",
                title_text="sinks (A written)" if col == 1 else "other keys (own colour range)",
                row=1,
                col=col,
            )
        fig.update_yaxes(autorange="reversed", type="category", title_text="query x", row=1, col=1)
        what = f"with its sinks ({sink_text}) apart"
        names = [view.keys[k] for k in rest]
    else:
        keys = rest if mode == "renormalized" else list(range(len(view.keys)))
        part = z[:, keys]
        fig = go.Figure(
            go.Heatmap(
                z=part.numpy(),
                x=np.array(keys),
                y=np.arange(nq),
                colorscale=colour,
                colorbar=dict(title=label),
                hovertemplate="q %{y}, k %{x}<br>%{z:.4g}<extra></extra>",
                **(dict(zmin=0.0, zmax=1.0) if value == "pattern" else dict(zmid=0.0)),
            )
        )
        ticks = token_ticks(view.keys)
        if ticks and mode == "renormalized":
            ticks = dict(tickmode="array", tickvals=keys, ticktext=[view.keys[k] for k in keys])
        fig.update_layout(
            xaxis=dict(title="key y", **ticks),
            yaxis=dict(title="query x", autorange="reversed", **token_ticks(view.queries)),
        )
        what = (
            f"without its sink keys ({sink_text}), rows renormalized"
            if where
            else f"(no sink key on this input: importance ≤ {eps:g})"
        )
        names = None
    fig.update_layout(
        title=f"{view.kind.capitalize()} view, layer {view.layer} head {head}: {label} {what}",
        height=max(420, min(900, 24 * nq + 160)),
    )
    fixed_margins(fig, x_labels=names, width=width)

    def data() -> pd.DataFrame:
        frame = view.frame(head)
        frame["sink_key"] = sinks.numpy()[frame["key"].to_numpy()]
        if mode == "renormalized":
            frame["prob_without_sinks"] = z.flatten().double().numpy()
        return frame

    return Plot(
        f"{view.kind}_{value}_sinks_{mode}_{head_label(view.layer, head)}",
        fig,
        data,
        meta=dict(view=view.kind, layer=view.layer, head=head, mode=mode, eps=eps, sink_keys=where, value=value),
        width=width,
    )


def sink_rate_plot(frame: pd.DataFrame, x: str = "step", group: str = "setting", width: int = HALF_PX) -> Plot:
    """Sink rate (0..1) against ``x`` (the training step), one line per ``group`` (a regularizer):
    ``frame`` has columns x, group and ``sink_rate`` (and optionally ``model``, a panel each)."""
    models = list(dict.fromkeys(frame["model"])) if "model" in frame else [None]
    fig = make_subplots(rows=1, cols=len(models), shared_yaxes=True, subplot_titles=[m or "" for m in models])
    palette = {}
    for c, m in enumerate(models, start=1):
        part = frame if m is None else frame[frame["model"] == m]
        for name, rows in part.groupby(group, sort=False):
            first = name not in palette
            colour = PALETTE[palette.setdefault(name, len(palette)) % len(PALETTE)]  # one per group, every panel
            fig.add_trace(
                go.Scatter(
                    x=rows[x],
                    y=rows["sink_rate"],
                    mode="lines+markers",
                    line=dict(color=colour),
                    marker=dict(color=colour),
                    name=str(name),
                    legendgroup=str(name),
                    showlegend=first,
                    hovertemplate=f"{name}: {x} %{{x}}, sink rate %{{y:.0%}}<extra></extra>",
                ),
                row=1,
                col=c,
            )
        fig.update_xaxes(title_text=x, row=1, col=c)
    fig.update_yaxes(title_text="sink rate (share of heads)", range=[0, 1], row=1, col=1)
    fig.update_layout(title="Sink rate across training", legend=dict(orientation="h", y=-0.25), height=420)
    return Plot("sink_rate", fig, frame.copy(), width=width)
