"""A page's zip of figures carries plotly.js once (plotly.min.js, plotly's own bundle) and every
HTML file in it loads that file; a lone HTML export stays self-contained. The browser check
(the zip's HTML really draws from file://) is tests/e2e/test_export_zip_browser.py."""

import io
import json
import zipfile
import zlib

import pytest

from attn_core import bilinear
from attn_core.figures import bilinear as fb
from attn_core.figures import bundle_zip, export_bytes, write_plot
from attn_core.figures.base import PLOTLY_JS, plotly_js
from attn_core.sources import resolve

SCRIPT = b'src="plotly.min.js"></script>'  # the script tag plotly writes for include_plotlyjs="directory"


@pytest.fixture(scope="module")
def plots():
    """Three of the Spectrum page's figures of a zoo model."""
    model = resolve("induction-2l").model
    return [
        fb.spectrum_plot(bilinear.spectrum_frame(model)),
        fb.eigen_plot(bilinear.eigen_frame(model)),
        fb.heads_plot(bilinear.head_detectors(model, n_samples=2)),
    ]


def test_zip_carries_plotly_js_once_and_every_html_loads_it(plots):
    blob = bundle_zip(plots, {"page": "Spectrum"}, formats=("html", "csv"))
    js = plotly_js()
    assert len(js) > 3_000_000 and b"plotly.js" in js[:500]  # the real bundle, from the plotly package
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        names = zf.namelist()
        assert names.count(PLOTLY_JS) == 1 and zf.read(PLOTLY_JS) == js
        htmls = [n for n in names if n.endswith(".html")]
        assert sorted(htmls) == sorted(f"{p.name}.html" for p in plots)
        for n in htmls:
            html = zf.read(n)
            assert html.count(SCRIPT) == 1 and b"Plotly.newPlot" in html
            assert len(html) < 200_000  # the figure only, not another copy of plotly.js
        manifest = json.loads(zf.read("manifest.json"))
    assert manifest["plotly_js"] == PLOTLY_JS and manifest["skipped"] == []
    # the zip is one compressed plotly.js plus small files, not one plotly.js per figure
    assert len(blob) < len(zlib.compress(js)) + 300_000


def test_zip_without_html_has_no_plotly_js(plots):
    with zipfile.ZipFile(io.BytesIO(bundle_zip(plots, {}, formats=("csv",)))) as zf:
        assert PLOTLY_JS not in zf.namelist()
    with zipfile.ZipFile(io.BytesIO(bundle_zip([], {}, formats=("html",)))) as zf:
        assert zf.namelist() == ["manifest.json"]


def test_a_single_html_export_stays_self_contained(plots, tmp_path):
    js = plotly_js()
    for html in (export_bytes(plots[0], "html"), write_plot(plots[0], tmp_path / "one.html").read_bytes()):
        assert SCRIPT not in html and js[:2000] in html and len(html) > len(js)  # plotly.js inline
    assert [p.name for p in tmp_path.iterdir()] == ["one.html"]  # no plotly.min.js beside it
    shared = export_bytes(plots[0], "html", shared_js=True)
    assert SCRIPT in shared and len(shared) < 200_000
