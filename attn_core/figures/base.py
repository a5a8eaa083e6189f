"""The Plot type and its exports: PNG/SVG through kaleido (one persistent headless browser,
so every export after the first is fast, bounded in time: :mod:`attn_core.figures.browser`), HTML through plotly, the data as CSV.

A lone HTML file (one figure's download, ``attn-lab export``) carries plotly.js inside it
(4.8 MB) and opens anywhere. A bundle of several figures (a page's zip) carries plotly.js once,
as :data:`PLOTLY_JS` beside the HTML files, which load it with ``<script src="plotly.min.js">``
(plotly's ``include_plotlyjs="directory"``): keep the files together when unpacking."""

from __future__ import annotations

import io
import json
import re
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from attn_core.figures.browser import ExportError
from attn_core.figures.layout import DEFAULT_HEIGHT, HALF_PX, finish

EXPORT_FORMATS = ("png", "svg", "html", "csv")
PLOTLY_JS = "plotly.min.js"  # the file name plotly's include_plotlyjs="directory" refers to
_IMAGE_FORMATS = ("png", "svg")
PNG_SCALE = 2  # a PNG has twice the page's pixels each way (the page's layout, sharp in a paper)
_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
# --- the look every figure shares ---------------------------------------------------------------
# In the dashboard a chart is drawn with Streamlit's theme; Streamlit also makes its own template
# (with stand-in colours that only its page fills in) plotly's default in the server process, so a
# figure exported from the page came out with near-black stand-in lines (the zero line through
# row 0 of every heatmap). Every export (PNG, SVG, HTML, the gallery) is therefore drawn with this
# light template, Streamlit's light theme in plain plotly terms, whatever template the figure
# carried: an export looks like the page.
FONT = '"Source Sans Pro", "Source Sans 3", "Helvetica Neue", Arial, sans-serif'
PALETTE = ["#0068c9", "#83c9ff", "#ff2b2b", "#ffabab", "#29b09d", "#7defa1", "#ff8700", "#ffd16a", "#6d3fc0", "#d5dae5"]
_AXIS = dict(gridcolor="#e6eaf1", linecolor="#d5dae5", zerolinecolor="#d5dae5", ticks="")
LIGHT = go.layout.Template(
    layout=go.Layout(
        font=dict(family=FONT, size=12, color="#31333f"),
        title=dict(font=dict(size=16)),
        colorway=PALETTE,
        paper_bgcolor="white",
        plot_bgcolor="white",
        xaxis=_AXIS,
        yaxis=_AXIS,
        legend=dict(bgcolor="rgba(255,255,255,0)"),
        hoverlabel=dict(font_family=FONT),
    )
)


def export_figure(fig: go.Figure) -> go.Figure:
    """A copy of ``fig`` drawn with :data:`LIGHT` (what every export and the gallery render)."""
    return go.Figure(fig).update_layout(template=LIGHT)


class Plot:
    """A figure, the data it shows (exported as CSV), a file-name stem, what it shows (meta) and
    the width it is laid out for on its page (``width`` px: a half-page chart unless said).
    Jupyter draws it inline (``_repr_mimebundle_``); :meth:`save` writes it as the CLI does.

    ``data`` is a table or a function that makes it: a function is called the first time the
    table is read (an export), so drawing a figure never builds the CSV of a large view."""

    def __init__(
        self,
        name: str,
        fig: go.Figure,
        data: pd.DataFrame | Callable[[], pd.DataFrame],
        meta: dict | None = None,
        width: int = HALF_PX,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"plot name {name!r} must be a plain file-name stem")
        self.name, self.fig, self.meta = name, finish(fig, width), dict(meta or {})
        self._data = data
        self.width = width

    @property
    def data(self) -> pd.DataFrame:
        if callable(self._data):
            self._data = self._data()
        return self._data

    def renamed(self, name: str) -> Plot:
        """The same figure, data and meta under another file-name stem."""
        return Plot(name, self.fig, self._data, self.meta, width=self.width)

    def __repr__(self) -> str:
        return f"Plot({self.name!r})"

    # in a notebook: Jupyter draws the figure itself (plotly's renderers), not the repr
    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return self.fig._repr_mimebundle_(include, exclude)

    def _repr_html_(self) -> str:
        return self.fig._repr_html_()

    def show(self) -> None:
        """Draw the figure (plotly's ``fig.show()``: inline in a notebook, else a browser tab)."""
        self.fig.show()

    def save(self, path: str | Path, fmt: str | None = None, overwrite: bool = False) -> Path:
        """Write the figure as ``attn-lab export`` does (png, svg, html, or its data as csv;
        format from the suffix unless given; never over an existing file unless ``overwrite``)."""
        return write_plot(self, path, fmt, overwrite)


def _image_bytes(fig: go.Figure, fmt: str, width: int | None, height: int | None) -> bytes:
    from attn_core.figures.browser import image_bytes

    if shutil.which("chromium") is None and not any(shutil.which(b) for b in _BROWSERS):
        import os

        if not os.environ.get("BROWSER_PATH"):
            raise ExportError(
                "PNG/SVG export needs a Chromium browser and none was found: install Debian's "
                "`chromium` (apt-get install chromium) or set BROWSER_PATH. HTML and CSV exports work without it."
            )
    opts = {"format": fmt, "scale": PNG_SCALE if fmt == "png" else 1}
    if width:
        opts["width"] = width
    if height:
        opts["height"] = height
    return image_bytes(fig, opts)  # bounded in time (figures.browser)


def export_bytes(
    plot: Plot, fmt: str, width: int | None = None, height: int | None = None, shared_js: bool = False
) -> bytes:
    """The plot as ``fmt`` in {png, svg, html, csv}. HTML is self-contained unless ``shared_js``:
    then it loads :data:`PLOTLY_JS` from its own folder (see :func:`plotly_js`). PNG and SVG are
    drawn at the size the page draws the plot (``plot.width`` and the figure's height, unless
    ``width``/``height`` are given), so their ticks, wrapped titles and legends are the page's; a PNG
    at :data:`PNG_SCALE` times the pixels, sharp in print."""
    if fmt not in EXPORT_FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    if fmt == "csv":
        return plot.data.to_csv(index=False).encode()
    if fmt == "html":
        return (
            export_figure(plot.fig)
            # an animation waits for its play button: playing on load started from the first frame
            # while the slider and the page said the last (the Dynamics page, `dynamics --animate`)
            .to_html(include_plotlyjs="directory" if shared_js else True, full_html=True, auto_play=False)
            .encode()
        )
    width = width or plot.width
    height = height or plot.fig.layout.height or DEFAULT_HEIGHT
    return _image_bytes(export_figure(plot.fig), fmt, width, height)


def plotly_js() -> bytes:
    """plotly.js as bundled with the plotly package (what ``shared_js`` HTML loads)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode()


def write_plot(
    plot: Plot, path: str | Path, fmt: str | None = None, overwrite: bool = False, what: str = "path"
) -> Path:
    """Write one export to ``path`` (format from the suffix unless given) under the output rule of
    every command (``destinations.check_destination``: never inside the shipped ``assets/`` or a
    model folder, never through a link, a dangling one included). Refuses to replace an existing
    file unless ``overwrite``; writes through a temporary file so a failure leaves none. ``what``
    names the path in a refusal (``--out`` for the CLI)."""
    from attn_core.destinations import check_destination, write_file
    from attn_core.validate import check_bool

    fmt = check_format(fmt, path, what)
    check_bool("overwrite", overwrite)
    path = check_destination(path, what, overwrite=overwrite)
    if not path.parent.is_dir():
        raise ValueError(f"{what} {path}: folder {path.parent} does not exist")
    return write_file(path, export_bytes(plot, fmt))


def check_format(fmt: object, path: object, what: str = "path") -> str:
    """The export format ``fmt`` (else the suffix of ``path``) when it is one of :data:`EXPORT_FORMATS`."""
    if fmt is not None and not isinstance(fmt, str):
        raise TypeError(f"fmt must be one of {', '.join(EXPORT_FORMATS)} (a str), got {type(fmt).__name__}")
    if fmt is None:
        if not isinstance(path, (str, Path)):
            raise TypeError(f"{what} must be a path (a str or a pathlib.Path), got {type(path).__name__}")
        suffix = Path(path).suffix.lstrip(".").lower()
        if suffix not in EXPORT_FORMATS:
            raise ValueError(
                f"{what} {str(path)[:120]!r} ends in {suffix or 'no suffix'!r}, not one of "
                f"{', '.join(EXPORT_FORMATS)}; give such a suffix or fmt"
            )
        return suffix
    if fmt.lower() not in EXPORT_FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(EXPORT_FORMATS)}, got {fmt[:40]!r}")
    return fmt.lower()


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
