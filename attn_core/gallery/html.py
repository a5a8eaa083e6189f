"""The gallery's folder: ``index.html`` drawing every figure with plotly.js at the width its page
gives it (with the export template, so what is drawn is what an export looks like), the
figures' JSON inside it, ``plotly.min.js`` beside it, and the CLI exports as PNG files."""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

from attn_core.figures.base import PLOTLY_JS, ExportError, export_bytes, export_figure, plotly_js
from attn_core.gallery.pages import Entry

INDEX = "index.html"
STYLE = """
body { font-family: "Source Sans Pro", Arial, sans-serif; margin: 24px; color: #31333f; }
nav a { margin-right: 12px; }
section { margin-top: 32px; }
.fig { margin: 20px 0; padding-top: 8px; border-top: 1px solid #e6eaf1; }
.fig figcaption { font-size: 13px; color: #555; margin-bottom: 4px; }
.plot { border: 1px dashed #d5dae5; }
.export { border: 1px solid #e6eaf1; margin-top: 6px; }
"""
DRAW = """
const figures = Array.from(document.querySelectorAll('.plot'));
Promise.all(figures.map(div => {
  const fig = JSON.parse(document.getElementById('data-' + div.id).textContent);
  const layout = Object.assign({}, fig.layout, {width: +div.dataset.width, height: +div.dataset.height});
  return Plotly.newPlot(div, fig.data, layout, {displaylogo: false, responsive: false});
})).then(() => { document.body.dataset.ready = 'yes'; },
         e => { document.body.dataset.ready = 'error'; document.body.dataset.error = String(e); });
"""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def write(out: Path, entries: list[Entry], note: str, png: bool) -> Path:
    """Write the gallery of ``entries`` into ``out`` (which must be new or empty); returns the
    index page. With ``png`` the CLI exports are also written as PNG files (kaleido)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / PLOTLY_JS).write_bytes(plotly_js())
    pages: dict[str, list[tuple[int, Entry]]] = {}
    for i, e in enumerate(entries):
        pages.setdefault(e.page, []).append((i, e))
    body, data = [], []
    nav = " ".join(f'<a href="#{_slug(p)}">{html.escape(p)}</a>' for p in pages)
    for page, items in pages.items():
        body.append(f'<section id="{_slug(page)}"><h2>{html.escape(page)}</h2>')
        for i, e in items:
            fig_json = export_figure(e.plot.fig).to_json().replace("</", "<\\/")
            data.append(f'<script type="application/json" id="data-fig-{i}">{fig_json}</script>')
            extra = ""
            if png and e.page.startswith("CLI export"):
                extra = _png(out, i, e)
            body.append(
                f'<figure class="fig" data-name="{html.escape(e.plot.name)}" data-page="{html.escape(page)}" '
                f'data-what="{html.escape(e.what)}"><figcaption>{html.escape(e.what)}: <code>{html.escape(e.plot.name)}'
                f"</code>, {e.width} × {e.height} px</figcaption>"
                f'<div class="plot" id="fig-{i}" data-width="{e.width}" data-height="{e.height}" '
                f'style="width:{e.width}px;height:{e.height}px"></div>{extra}</figure>'
            )
        body.append("</section>")
    index = out / INDEX
    index.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>attn-lab figure gallery</title>"
        f'<script src="{PLOTLY_JS}"></script><style>{STYLE}</style></head><body>'
        f"<h1>attn-lab figure gallery</h1><p>{html.escape(note)} Made {time.strftime('%Y-%m-%d %H:%M')}; "
        f"{len(entries)} figures.</p><nav>{nav}</nav>" + "".join(body) + "".join(data) + f"<script>{DRAW}</script>"
        "</body></html>",
        encoding="utf-8",
    )
    (out / "figures.json").write_text(
        json.dumps(
            [
                {"id": f"fig-{i}", "page": e.page, "what": e.what, "name": e.plot.name, "width": e.width}
                for i, e in enumerate(entries)
            ],
            indent=1,
        )
    )
    return index


def _png(out: Path, i: int, e: Entry) -> str:
    """The PNG export of a CLI figure (as `attn-lab export --format png` writes it), shown under it."""
    folder = out / "png"
    folder.mkdir(exist_ok=True)
    name = f"{i:03d}-{e.plot.name}.png"
    try:
        (folder / name).write_bytes(export_bytes(e.plot, "png"))
    except ExportError as err:
        return f"<p>PNG not made: {html.escape(str(err))}</p>"
    return (  # the file has PNG_SCALE times the pixels: shown at the size the page draws the chart
        f'<div>PNG export:</div><img class="export" src="png/{name}" width="{e.plot.width}" '
        f'alt="{html.escape(e.plot.name)}">'
    )
