"""The dashboard in headless Chromium on an imported model retrained on text: the Retrain page
takes a text under $ATTN_LAB_DATA, trains and shows the held-out perplexity; the Heatmaps page
shows a head of the run and of its parent side by side on a typed sentence. Screenshots go to
tests/artifacts/ (text_retrain.png, text_before_after.png)."""

import os
import re
from pathlib import Path

import pytest

from benchmarks.dashboard import CHROMIUM, VIEWPORT, launch, new_page, rerun, screenshot, serve, settle
from tests.conftest import write_tiny_hf
from tests.text_corpus import make_text, write_word_tokenizer

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("text-dashboard")
    write_tiny_hf(root / "models" / "tiny-llama", "llama", num_key_value_heads=2)
    write_word_tokenizer(root / "models" / "tiny-llama")
    (root / "data").mkdir()
    (root / "data" / "story.txt").write_text(make_text(0, 300))
    old = os.environ.get("ATTN_LAB_DATA")
    os.environ["ATTN_LAB_DATA"] = str(root / "data")  # the server inherits it
    try:
        with serve(root / "runs", root / "models") as url:
            yield url
    finally:
        if old is None:
            os.environ.pop("ATTN_LAB_DATA", None)
        else:
            os.environ["ATTN_LAB_DATA"] = old


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        context = browser.new_context(viewport=VIEWPORT)
        context.set_default_timeout(90_000)
        yield new_page(context)
        browser.close()


def test_retrain_on_text_then_compare_before_and_after(page, server):
    page.goto(f"{server}/Retrain?model=tiny-llama")
    settle(page)
    text_from = page.get_by_test_id("stRadio").filter(has_text="Text from")  # not the held-out text's choice
    rerun(page, lambda: text_from.get_by_text("the data folder", exact=True).click())
    page.get_by_text(re.compile(r"tokens in 1 document\(s\)")).wait_for()
    steps = page.get_by_role("spinbutton", name="Steps")
    steps.fill("40")
    rerun(page, lambda: steps.press("Enter"))
    main = page.get_by_test_id("stMainBlockContainer")
    main.get_by_role("button", name="Start", exact=True).click()
    page.get_by_text(re.compile(r"saved as run:")).wait_for(timeout=120_000)
    settle(page)
    assert page.get_by_text("held-out perplexity").count() >= 1
    run = re.search(r"run:(\S+?)`?\s", page.get_by_text(re.compile(r"saved as run:")).inner_text() + " ").group(1)
    screenshot(page, ARTIFACTS / "text_retrain.png")

    page.goto(f"{server}/Heatmaps?model=run:{run.strip('`')}&layer=1&input=typed")
    settle(page)
    box = page.get_by_role("textbox", name="Text")
    box.fill("w5 w6 w7 w8 w5 w6 w7")
    rerun(page, lambda: box.press("Control+Enter"))  # a multi-line box: Enter is a line break
    rerun(page, lambda: page.get_by_text("Before and after retraining", exact=True).click())
    page.get_by_text(re.compile(r"^before \(tiny-llama\)")).first.wait_for()
    page.get_by_text(re.compile(r"^after \(run:")).first.wait_for()
    assert page.locator("[data-testid='stException']").count() == 0
    screenshot(page, ARTIFACTS / "text_before_after.png")
