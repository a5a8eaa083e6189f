"""The Heatmaps page on a 2048-token input in headless Chromium: the blocked view's map is drawn
with the sink column apart, a box drawn on it zooms (the sliders follow and the region is
recomputed at full resolution), and the query's top keys are listed."""

import re
from pathlib import Path

import pytest

from attn_core import checkpoint
from benchmarks.dashboard import CHROMIUM, VIEWPORT, launch, new_page, rerun, serve, settle
from tests.conftest import make_tiny_model

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    model = make_tiny_model(std=0.3, n_layers=2, n_heads=4, d_model=32, d_head=8, d_vocab=100, n_ctx=2048, d_mlp=64)
    checkpoint.save(model, Path(models) / "ctx-2k")
    with serve(tmp_path_factory.mktemp("data"), models_dir=models) as url:
        yield url


def map_title(page) -> str:
    return page.evaluate(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot .gtitle')).map(t => t.textContent)"
        ".find(t => t.includes('pattern A of 2048 tokens')) || ''"
    )


def test_box_on_the_map_zooms_to_full_resolution(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        page = new_page(browser.new_context(viewport=VIEWPORT))
        page.set_default_timeout(120_000)
        page.goto(f"{server}/Heatmaps?model=ctx-2k&length=2048&layer=1&head=2")
        page.wait_for_function("() => document.body.innerText.includes('blocked scores')", timeout=120_000)
        settle(page, 120_000)
        assert "sink (key 0) apart" in map_title(page) and "max over 3×3 tiles" in map_title(page)
        page.get_by_role("heading", name=re.compile(r"^Query 2047:0?.*top 8 keys")).wait_for()
        chart = page.locator(".js-plotly-plot").filter(has_text="pattern A of 2048 tokens").first
        assert chart.evaluate("g => g._fullLayout.dragmode") == "select"  # a drag draws a box
        chart.locator(".nsewdrag").nth(1).scroll_into_view_if_needed()
        page.wait_for_timeout(500)
        box = chart.locator(".nsewdrag").nth(1).bounding_box()  # the map's plot area (the sink column is the first)
        x0, y0 = box["x"] + box["width"] * 0.45, box["y"] + box["height"] * 0.50
        x1, y1 = box["x"] + box["width"] * 0.52, box["y"] + box["height"] * 0.56

        def drag():
            page.mouse.move(x0, y0)
            page.mouse.down()
            page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2, steps=5)
            page.mouse.move(x1, y1, steps=5)
            page.mouse.up()

        rerun(page, drag, 120_000)
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.js-plotly-plot .gtitle'))"
            ".some(t => t.textContent.includes('one cell per query × key'))",
            timeout=120_000,
        )
        title = map_title(page)
        rows = re.search(r"queries (\d+)\.\.(\d+) × keys (\d+)\.\.(\d+)", title)
        assert rows, title
        q0, q1, k0, k1 = map(int, rows.groups())
        assert 900 <= q0 < q1 <= 1250 and 800 <= k0 < k1 <= 1150, title  # about where the box was drawn
        assert page.locator("[data-testid='stException']").count() == 0
        browser.close()
