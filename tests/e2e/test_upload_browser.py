"""The sidebar's "Upload a model" in headless Chromium: a whole folder as transformers'
save_pretrained wrote it (a random tiny Llama with its tokenizer) is picked with the folder
chooser, kept, selected and drawn by the Heatmaps page; nothing is fetched from another host on
the way (the tab's icon is a file of the repository). Screenshot: tests/artifacts/upload_hf.png."""

from pathlib import Path

import pytest

from benchmarks.dashboard import CHROMIUM, VIEWPORT, launch, new_page, rerun, screenshot, serve, settle
from tests.conftest import write_tiny_hf

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]
transformers = pytest.importorskip("transformers")


def test_a_hugging_face_folder_uploads_and_draws(tmp_path):
    from playwright.sync_api import sync_playwright
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = tmp_path / "tiny-llama"
    write_tiny_hf(folder, "llama", num_key_value_heads=2)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(99)} | {"[UNK]": 99}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    (folder / "README.md").write_text("# a tiny llama\n")

    with serve(tmp_path / "runs") as url, sync_playwright() as p:
        browser = launch(p)
        page = new_page(browser.new_context(viewport=VIEWPORT))
        page.set_default_timeout(120_000)
        outside = []  # the dashboard runs offline: nothing is fetched from another host (the tab's icon was)
        # (a blob: URL of the dashboard's own origin is made in the page: a component's inline script)
        page.on("request", lambda r: None if r.url.startswith((url, "data:", f"blob:{url}")) else outside.append(r.url))
        page.goto(f"{url}/Heatmaps?model=induction-2l")
        settle(page)
        sidebar = page.get_by_test_id("stSidebar")
        sidebar.get_by_text("Upload a model").click()
        rerun(page, lambda: sidebar.get_by_text("Whole folder").click())
        chooser = sidebar.locator("input[type=file]")
        rerun(page, lambda: chooser.set_input_files(folder))
        message = sidebar.get_by_test_id("stAlertContentSuccess")
        message.wait_for()
        assert "Loaded and selected" in message.inner_text() and "upload: llama-" in message.inner_text()
        settle(page)
        assert page.get_by_test_id("stException").count() == 0
        assert "llama (imported, no task)" in sidebar.inner_text()
        page.wait_for_selector(".js-plotly-plot .heatmaplayer")  # the page draws the uploaded model
        screenshot(page, ARTIFACTS / "upload_hf.png")
        assert outside == [] and page.evaluate("() => document.querySelector('link[rel*=icon]').href").startswith(url)
        browser.close()
