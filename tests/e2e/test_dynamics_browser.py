"""The Dynamics page in headless Chromium against `streamlit run`: induction-2l's architecture
trained from scratch with log-spaced checkpoints, the page opened on that run, the step slider
moved and play pressed (the step label advances by itself); a screenshot goes to tests/artifacts/."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from attn_core.retraining.job import TrainingJob
from attn_core.runs import RunStore
from attn_core.training.config import JobConfig
from benchmarks.dashboard import CHROMIUM, VIEWPORT, launch, new_page, rerun, screenshot, serve, settle

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]


def step_label(page) -> str:
    """The text of the step slider's thumb (its current value)."""
    return page.get_by_test_id("stSliderThumbValue").first.inner_text()


def test_scrub_and_play_a_run_with_checkpoints(tmp_path):
    data = tmp_path / "data"
    cfg = JobConfig("scratch:induction-2l", steps=300, lr=3e-3, warmup_steps=30, device="cpu", checkpoint_log=24,
                    telemetry_every=100, spectrum_every=100, eval_every=100, measure_samples=64)  # fmt: skip
    run_id = TrainingJob.open(cfg, store=RunStore(data)).run()["run_id"]
    from playwright.sync_api import sync_playwright

    with serve(data) as url, sync_playwright() as p:
        browser = launch(p)
        page = new_page(browser.new_context(viewport=VIEWPORT))
        page.set_default_timeout(120_000)
        page.goto(f"{url}/Dynamics")
        settle(page, timeout_ms=180_000)
        assert page.locator("[data-testid='stException']").count() == 0
        picked = page.get_by_test_id("stSelectbox").first.evaluate(
            "e => e.querySelector('input')?.value || e.textContent"
        )
        assert run_id in picked or page.get_by_text(run_id).count() >= 1
        assert page.get_by_text(re.compile(r"\d+ checkpoints, steps 0\.\.300")).count() == 1
        assert step_label(page) == "300"
        slider = page.get_by_role("slider").first
        rerun(page, lambda: (slider.focus(), page.keyboard.press("Home")))
        assert step_label(page) == "0"
        assert page.get_by_text(re.compile(r"Step 0: L0H0 on a held-out input")).count() == 1
        rerun(page, lambda: page.get_by_text("▶ Play").click())
        page.wait_for_function(  # the fragment steps on by itself
            "() => document.querySelector('[data-testid=\"stSliderThumbValue\"]')?.innerText !== '0'", timeout=60_000
        )
        # pause: while playing, the fragment may rerun back to back on a busy machine (the page never
        # leaves "running", so no new run can be counted): wait for the switch to be off and the page idle
        page.get_by_text("▶ Play").click()
        expect(page.get_by_role("switch", name="▶ Play")).not_to_be_checked(timeout=120_000)
        settle(page, 180_000)
        # paused: a scrub moves the slider and every view together (right after the pause a tick queued
        # before it may still land, so the check is on a scrub made once the page is idle, not on the
        # step the play happened to stop at)
        key, target = ("End", "300") if step_label(page) != "300" else ("Home", "0")  # a move, wherever it stopped
        rerun(page, lambda: (slider.focus(), page.keyboard.press(key)), timeout_ms=120_000)
        expect(page.get_by_text(re.compile(rf"Step {target}: L0H0 on a held-out input"))).to_have_count(
            1, timeout=120_000
        )
        assert step_label(page) == target
        assert page.locator("[data-testid='stException']").count() == 0
        screenshot(page, ARTIFACTS / "11_Dynamics.png")
        browser.close()
