"""A page's zip of figures, unpacked, opens in headless Chromium (Debian's /usr/bin/chromium)
from file://: every HTML file loads the zip's one plotly.min.js and draws its figure. No server."""

import io
import zipfile

import pytest

from attn_core import bilinear
from attn_core.figures import bilinear as fb
from attn_core.figures import bundle_zip
from attn_core.figures.base import PLOTLY_JS
from attn_core.sources import resolve
from benchmarks.dashboard import CHROMIUM, launch

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]


def test_unpacked_zip_html_draws_from_file_urls(tmp_path):
    from playwright.sync_api import sync_playwright

    model = resolve("induction-2l").model
    plots = [fb.spectrum_plot(bilinear.spectrum_frame(model)), fb.eigen_plot(bilinear.eigen_frame(model))]
    with zipfile.ZipFile(io.BytesIO(bundle_zip(plots, {"page": "Spectrum"}, formats=("html",)))) as zf:
        zf.extractall(tmp_path)
    assert (tmp_path / PLOTLY_JS).is_file()
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            for plot in plots:
                page.goto((tmp_path / f"{plot.name}.html").as_uri())
                page.wait_for_selector(".plotly .main-svg", timeout=60_000)
                assert page.evaluate("typeof Plotly") == "object"  # loaded from the zip's plotly.min.js
                assert page.locator(".plotly .main-svg .trace, .plotly .main-svg .point").count() > 0
            assert errors == []
            # and without plotly.min.js beside it, the figure cannot draw: the test means something
            (tmp_path / PLOTLY_JS).unlink()
            page.goto((tmp_path / f"{plots[0].name}.html").as_uri())
            page.wait_for_load_state("load")
            assert page.evaluate("typeof Plotly") == "undefined" and page.locator(".main-svg").count() == 0
        finally:
            browser.close()
