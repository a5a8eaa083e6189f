"""The dashboard under load (benchmarks/dashboard_load.py): the time from a slider move to the
updated chart, and the server's memory per session, against the number of simultaneous users,
one line per measured checkout (before and after a change, measured in one run)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attn_core.figures.base import PALETTE, Plot
from attn_core.figures.layout import FULL_PX

COLUMNS = ["curve", "users", "median_s", "p95_s", "moves", "errors", "rss_per_session_mib"]


def load_frame(curves: dict[str, list[dict]]) -> pd.DataFrame:
    """One row per curve and number of users, from the benchmark's levels (its JSON's
    ``levels``: users, median_s, p95_s, moves, errors, rss_per_session_mib)."""
    if not isinstance(curves, dict) or not curves:
        raise ValueError("curves must map a curve's name to the benchmark's levels (a non-empty dict)")
    rows = []
    for name, levels in curves.items():
        for level in sorted(levels, key=lambda x: x.get("users", 0)):
            missing = [c for c in COLUMNS[1:] if c not in level]
            if missing:
                raise KeyError(f"a level of curve {name!r} lacks {', '.join(missing)}")
            rows.append({"curve": name, **{c: level[c] for c in COLUMNS[1:]}})
    return pd.DataFrame(rows, columns=COLUMNS)  # the curves in the order given, each by users


def load_curve_plot(curves: dict[str, list[dict]], title: str | None = None) -> Plot:
    """Left: median (solid) and p95 (dashed) seconds from a slider move to the updated chart
    against the number of users, one colour per curve; right: the server's memory per session
    (MiB). A hover names the moves and errors behind each point."""
    frame = load_frame(curves)
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.62, 0.38],
        horizontal_spacing=0.12,
        subplot_titles=("Slider move to updated chart", "Memory per session"),
    )
    for i, (name, part) in enumerate(frame.groupby("curve", sort=False)):
        color = PALETTE[(2 * i) % len(PALETTE)]
        hover = part[["moves", "errors"]].to_numpy()
        for stat, dash in (("median_s", None), ("p95_s", "dash")):
            fig.add_trace(
                go.Scatter(
                    x=part["users"],
                    y=part[stat],
                    name=f"{name}: {'median' if stat == 'median_s' else 'p95'}",
                    mode="lines+markers",
                    line={"color": color, "dash": dash},
                    customdata=hover,
                    hovertemplate=f"{name}<br>%{{x}} users: %{{y:.2f}} s ({stat[:-2]})"
                    "<br>%{customdata[0]} moves, %{customdata[1]} errors<extra></extra>",
                ),
                row=1,
                col=1,
            )
        fig.add_trace(
            go.Scatter(
                x=part["users"],
                y=part["rss_per_session_mib"],
                name=f"{name}: MiB per session",
                mode="lines+markers",
                line={"color": color},
                showlegend=False,
                hovertemplate=f"{name}<br>%{{x}} users: %{{y:.1f}} MiB per session<extra></extra>",
            ),
            row=1,
            col=2,
        )
    users = sorted(frame["users"].unique().tolist())
    fig.update_xaxes(title_text="simultaneous users N", tickvals=users)
    fig.update_yaxes(title_text="seconds", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="MiB per session", row=1, col=2)
    fig.update_layout(
        title=title or "The dashboard under load: N users moving sliders on Heatmaps and Edit and compare",
        height=440,
        legend={"orientation": "h", "y": -0.25},
    )
    return Plot("dashboard_load", fig, frame, meta={"curves": list(curves)}, width=FULL_PX)
