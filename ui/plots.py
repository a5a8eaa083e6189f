"""Figures on a page: the chart with its Download menu, a table's CSV button, and one zip of every
figure of a page."""

from __future__ import annotations

import functools
from typing import Any

import streamlit as st

from attn_core.figures import EXPORT_FORMATS, ExportError, Plot, bundle_zip, export_bytes
from attn_core.figures.tables import NUMBER_FORMAT, readable

MIME = {"png": "image/png", "svg": "image/svg+xml", "html": "text/html", "csv": "text/csv"}


def show_table(frame: Any, column_config: dict | None = None, **kwargs: Any) -> None:
    """``st.dataframe`` of ``frame`` as every table of the dashboard writes it
    (``attn_core.figures.tables``): numbers with four significant digits, a dash for a missing
    value (Streamlit writes "None", and 0.00000000000006 in full). ``column_config`` (help texts,
    labels) is kept; a number column's format is added where it has none."""
    shown, numeric = readable(frame)
    config = dict(column_config or {})
    for col in shown.columns:
        given = config.get(col)
        kind = (given or {}).get("type_config", {}).get("type") if isinstance(given, dict) else None
        if col in numeric and (given is None or (kind == "number" and not given["type_config"].get("format"))):
            config[col] = st.column_config.NumberColumn(
                help=(given or {}).get("help"), label=(given or {}).get("label"), format=NUMBER_FORMAT
            )
        elif col not in numeric and kind == "number" and shown[col].dtype == object:  # made text: a dash where missing
            config[col] = st.column_config.TextColumn(help=given.get("help"), label=given.get("label"))
    st.dataframe(shown, column_config=config or None, **kwargs)


def download_table(frame: Any, file_stem: str, key: str, help: str) -> None:
    """A "Table as CSV" button for a table the page shows (made only when clicked)."""
    st.download_button(
        "Table as CSV",
        functools.partial(frame.to_csv, index=False),
        file_name=f"{file_stem}.csv",
        mime=MIME["csv"],
        key=key,
        on_click="ignore",
        help=help,
    )


def show_plot(plot: Plot, key: str, help: str | None = None, downloads: bool = True, **chart: Any) -> Any:
    """The chart and, under it, a Download menu with one button per format; files are made only
    when clicked. The menu's buttons are drawn only when it is opened, so a rerun that redraws
    the page's charts does not also redraw four buttons per chart. ``chart``: more arguments of
    ``st.plotly_chart`` (``on_select``...), whose result is returned."""
    event = st.plotly_chart(plot.fig, key=f"chart_{key}", config={"displaylogo": False}, **chart)
    if not downloads:
        return event
    menu = st.popover("Download", icon=":material/download:", help=f"{plot.name}: PNG, SVG, HTML or CSV")
    with menu, st.container(horizontal=True, gap="small"):
        for fmt in EXPORT_FORMATS:
            st.download_button(
                fmt.upper(),
                data=functools.partial(_export_or_message, plot, fmt),
                file_name=f"{plot.name}.{fmt}",
                mime=MIME[fmt],
                key=f"dl_{key}_{fmt}",
                on_click="ignore",
                help=help or _FORMAT_HELP[fmt],
            )
    return event


_FORMAT_HELP = {
    "png": "This figure as a PNG image",
    "svg": "This figure as an SVG vector image",
    "html": "This figure as an interactive HTML page",
    "csv": "The data drawn in this figure, as CSV",
}


def _export_or_message(plot: Plot, fmt: str) -> bytes:
    try:
        return export_bytes(plot, fmt)
    except ExportError as e:  # no browser: the download carries the reason instead of failing silently
        return f"{e}\n".encode()


def export_all(plots: list[Plot], manifest: dict, key: str) -> None:
    """One zip with every figure of the page in every format and a JSON manifest."""
    st.download_button(
        "Download all figures (zip)",
        data=functools.partial(bundle_zip, plots, manifest),
        file_name=f"{key}.zip",
        mime="application/zip",
        key=f"zip_{key}",
        on_click="ignore",
        icon=":material/download:",
        help="PNG, SVG, HTML and CSV of every figure on this page, plus manifest.json (model, layer/head, "
        "settings). The HTML files share one plotly.min.js in the zip: unpack them together.",
    )
