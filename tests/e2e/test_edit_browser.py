"""The Edit and compare page in headless Chromium against `streamlit run`: on induction-2l, the
previous-token head L0H3 cut to rank 1 with the rank slider changes the loss the page shows (that
head needs two modes: issue 35's findings), and the compare tab opens on another model of its
d_model and draws its heads x heads matrix with the matching outlined and links the pair to
Heatmaps and Spectrum. Screenshots go to tests/artifacts/."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from benchmarks.dashboard import CHROMIUM, VIEWPORT, choose, launch, new_page, rerun, screenshot, serve, settle

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]

LOSS = "[data-testid='stMetric']:has-text('Loss (nats)') [data-testid='stMetricValue']"  # Playwright's selector
# the diff matrix drawn: its axis title, and one outlined cell per matched pair (plotly draws shapes as paths)
MATRIX = """() => Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"]'))
    .filter(c => c.checkVisibility() && c.textContent.includes('head of B'))
    .map(c => c.querySelectorAll('.shapelayer path').length)"""


def test_a_rank_slider_move_changes_the_loss_and_the_compare_tab_draws_the_matrix(tmp_path):
    from playwright.sync_api import sync_playwright

    with serve(tmp_path / "data") as url, sync_playwright() as p:
        browser = launch(p)
        page = new_page(browser.new_context(viewport=VIEWPORT))
        page.set_default_timeout(120_000)
        page.goto(f"{url}/Edit_and_compare?model=induction-2l")
        settle(page, 180_000)
        assert page.locator("[data-testid='stException']").count() == 0
        rerun(page, lambda: choose(page, "Head", "3"))
        shown = page.locator(LOSS).inner_text()
        full = float(shown)
        slider, rank = page.get_by_role("slider").first, page.get_by_test_id("stSliderThumbValue").first
        assert rank.inner_text() == "16"  # every mode kept: the model as it is
        rerun(page, lambda: (slider.focus(), page.keyboard.press("Home")))
        assert rank.inner_text() == "1"
        expect(page.locator(LOSS)).not_to_have_text(shown)
        assert float(page.locator(LOSS).inner_text()) > full + 0.1  # rank 1 breaks the previous-token head
        assert page.get_by_text(re.compile(r"L0H3: attention before and after the edit")).count() == 1
        assert page.get_by_role("button", name="Save the edited model as a run").count() == 1
        assert page.locator("[data-testid='stException']").count() == 0
        screenshot(page, ARTIFACTS / "12_Edit_and_compare.png")

        page.get_by_role("tab", name="Compare two models").click()
        page.wait_for_function(f"() => ({MATRIX})().length === 1")
        settle(page)
        # model B starts as another zoo model of induction-2l's d_model (not the model itself)
        assert page.get_by_role("combobox", name="Compare with", exact=True).input_value() == "modadd-1l-mlp"
        assert page.evaluate(MATRIX) == [4]  # 4 heads per layer each: 4 matched pairs
        # the first pair opened in each view, for A and for B
        assert page.locator("a[href='/Heatmaps?model=induction-2l&layer=0&head=0']").count() == 1
        assert page.locator("a[href^='/Spectrum?model=modadd-1l-mlp&layer=0&head=']").count() == 1
        assert page.locator("[data-testid='stException']").count() == 0
        screenshot(page, ARTIFACTS / "12_Edit_and_compare_diff.png")
        browser.close()
