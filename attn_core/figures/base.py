"""The Plot type and its exports: PNG/SVG through kaleido (one persistent headless browser,
so every export after the first is fast), HTML through plotly, the data as CSV.

A lone HTML file (one figure's download, ``attn-lab export``) carries plotly.js inside it
(4.8 MB) and opens anywhere. A bundle of several figures (a page's zip) carries plotly.js once,
as :data:`PLOTLY_JS` beside the HTML files, which load it with ``<script src="plotly.min.js">``
(plotly's ``include_plotlyjs="directory"``): keep the files together when unpacking."""

from __future__ import annotations

import io
import json
import re
import shutil
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

EXPORT_FORMATS = ("png", "svg", "html", "csv")
PLOTLY_JS = "plotly.min.js"  # the file name plotly's include_plotlyjs="directory" refers to
_IMAGE_FORMATS = ("png", "svg")
_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
MAX_TICKS = 64  # label every token on an axis up to this many; beyond, plotly picks the ticks


def token_ticks(labels: list[str], first: int = 0) -> dict:
    """Axis settings that label position ``first + i`` with ``labels[i]`` (none past
    :data:`MAX_TICKS`: plotly's numbers then)."""
    if len(labels) > MAX_TICKS:
        return {}
    return dict(tickmode="array", tickvals=list(range(first, first + len(labels))), ticktext=labels)


# Tick-label character width at plotly's 12 px font and the Streamlit theme's, rounded up; the
# height of one line of labels; the room an axis title and its gap take; the widest label margin
# before labels are clipped; an axis's labels are drawn upright when they would overlap at this
# width (a half-page chart).
CHAR_PX = 8
LINE_PX = 22
TITLE_PX = 50
MAX_LABEL_PX = 240
ROTATE_PX = 440
NUMBER_CHARS = 6  # an automatic numeric tick such as "−1.5k" or "1000"


def fixed_margins(fig: go.Figure, x_labels=None, y_labels=None, colorbar: bool = True) -> go.Figure:
    """Set the margins and tick angles from the tick labels instead of letting plotly measure
    them. The labels are the axes' own ``ticktext`` (:func:`token_ticks`) unless given (a
    category axis's names); none means plotly's numeric ticks. Measured margins and angles make plotly draw a
    figure, measure every label and the colour bar, then draw it again: twice the work of each
    redraw in the dashboard. Fixed ones draw it once. Labels wider than :data:`MAX_LABEL_PX` are
    clipped."""

    def extent(labels) -> int:
        chars = NUMBER_CHARS if not labels else max(len(str(s)) for s in labels)
        return min(CHAR_PX * chars, MAX_LABEL_PX)

    x_labels = fig.layout.xaxis.ticktext if x_labels is None else x_labels
    y_labels = fig.layout.yaxis.ticktext if y_labels is None else y_labels
    upright = bool(x_labels) and len(x_labels) * (extent(x_labels) + 8) > ROTATE_PX
    fig.update_layout(
        margin=dict(
            l=extent(y_labels) + TITLE_PX,
            b=(extent(x_labels) if upright else LINE_PX) + TITLE_PX,
            t=70,
            r=110 if colorbar else 30,
            autoexpand=False,
        ),
        xaxis_tickangle=-90 if upright else 0,
        yaxis_tickangle=0,
    )
    return fig


class ExportError(RuntimeError):
    """An export could not be made; the message says why and what to do."""


class Plot:
    """A figure, the data it shows (exported as CSV), a file-name stem and what it shows (meta).

    ``data`` is a table or a function that makes it: a function is called the first time the
    table is read (an export), so drawing a figure never builds the CSV of a large view."""

    def __init__(
        self, name: str, fig: go.Figure, data: pd.DataFrame | Callable[[], pd.DataFrame], meta: dict | None = None
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"plot name {name!r} must be a plain file-name stem")
        self.name, self.fig, self.meta = name, fig, dict(meta or {})
        self._data = data

    @property
    def data(self) -> pd.DataFrame:
        if callable(self._data):
            self._data = self._data()
        return self._data

    def renamed(self, name: str) -> Plot:
        """The same figure, data and meta under another file-name stem."""
        return Plot(name, self.fig, self._data, self.meta)

    def __repr__(self) -> str:
        return f"Plot({self.name!r})"


_server_lock = threading.Lock()
_server_started = False


def _image_bytes(fig: go.Figure, fmt: str, width: int | None, height: int | None) -> bytes:
    global _server_started
    import kaleido

    if shutil.which("chromium") is None and not any(shutil.which(b) for b in _BROWSERS):
        import os

        if not os.environ.get("BROWSER_PATH"):
            raise ExportError(
                "PNG/SVG export needs a Chromium browser and none was found: install Debian's "
                "`chromium` (apt-get install chromium) or set BROWSER_PATH. HTML and CSV exports work without it."
            )
    opts = {"format": fmt}
    if width:
        opts["width"] = width
    if height:
        opts["height"] = height
    with _server_lock:
        if not _server_started:
            kaleido.start_sync_server(silence_warnings=True)
            _server_started = True
        try:
            return kaleido.calc_fig_sync(fig, opts=opts)
        except Exception as e:  # kaleido raises a variety of browser errors
            raise ExportError(f"{fmt.upper()} export failed: {e}") from e


def export_bytes(
    plot: Plot, fmt: str, width: int | None = None, height: int | None = None, shared_js: bool = False
) -> bytes:
    """The plot as ``fmt`` in {png, svg, html, csv}. HTML is self-contained unless ``shared_js``:
    then it loads :data:`PLOTLY_JS` from its own folder (see :func:`plotly_js`)."""
    if fmt not in EXPORT_FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    if fmt == "csv":
        return plot.data.to_csv(index=False).encode()
    if fmt == "html":
        return plot.fig.to_html(include_plotlyjs="directory" if shared_js else True, full_html=True).encode()
    return _image_bytes(plot.fig, fmt, width, height)


def plotly_js() -> bytes:
    """plotly.js as bundled with the plotly package (what ``shared_js`` HTML loads)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode()


def write_plot(plot: Plot, path: str | Path, fmt: str | None = None, overwrite: bool = False) -> Path:
    """Write one export to ``path`` (format from the suffix unless given). Refuses to replace an
    existing file unless ``overwrite``; writes through a temporary file so a failure leaves none."""
    path = Path(path)
    fmt = fmt or path.suffix.lstrip(".").lower()
    if path.exists() and not overwrite:
        raise ExportError(f"{path} already exists; choose another path or pass overwrite")
    if not path.parent.exists():
        raise ExportError(f"folder {path.parent} does not exist")
    data = export_bytes(plot, fmt)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def bundle_zip(plots: list[Plot], manifest: dict, formats: tuple[str, ...] = EXPORT_FORMATS) -> bytes:
    """One zip of every plot in every format plus ``manifest.json`` (model, head, settings).
    The HTML files share one :data:`PLOTLY_JS` at the top of the zip. A format that cannot be
    made (no browser) is listed under ``skipped`` instead of failing."""
    buf = io.BytesIO()
    skipped: list[str] = []
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for plot in plots:
            for fmt in formats:
                try:
                    zf.writestr(f"{plot.name}.{fmt}", export_bytes(plot, fmt, shared_js=True))
                except ExportError as e:
                    skipped.append(f"{plot.name}.{fmt}: {e}")
        shared = bool(plots) and "html" in formats
        if shared:
            zf.writestr(PLOTLY_JS, plotly_js())
        full = dict(manifest, figures=[p.name for p in plots], formats=list(formats), skipped=skipped)
        if shared:
            full["plotly_js"] = PLOTLY_JS  # what every HTML file of the zip loads
        zf.writestr("manifest.json", json.dumps(full, indent=2, default=str))
    return buf.getvalue()
