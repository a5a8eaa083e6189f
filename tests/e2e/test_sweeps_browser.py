"""The Sweeps page in headless Chromium: Enter in a field of the setup form launches nothing
(only the button does), and a second sweep launched while the first runs waits in line and then
runs; both end ``completed`` with every trial recorded (the second used to end ``interrupted``
after 8-10 s with "RuntimeError: dictionary changed size during iteration"). Screenshot:
tests/artifacts/sweeps_two.png."""

import time
from pathlib import Path

import pytest

from attn_core.runs import RunStore
from benchmarks.dashboard import CHROMIUM, VIEWPORT, launch, new_page, screenshot, serve, settle

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
MODEL = "reverse-1l"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]
pytest.importorskip("ray")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("sweeps-dashboard")


@pytest.fixture(scope="module")
def page(runs):
    from playwright.sync_api import sync_playwright

    with serve(runs) as url, sync_playwright() as p:
        browser = launch(p)
        context = browser.new_context(viewport=VIEWPORT)
        context.set_default_timeout(120_000)
        page = new_page(context)
        page.goto(f"{url}/Sweeps?model={MODEL}")
        settle(page)
        yield page
        browser.close()


def sweeps(runs: Path) -> list[dict]:
    return RunStore(runs).list_sweeps()


def wait_for_sweeps_to_end(runs: Path, count: int, timeout: float = 400.0) -> list[dict]:
    """The store's sweeps once ``count`` of them have ended (status no longer running), however
    loaded the machine: the page can show one sweep ended while the other is still writing."""
    deadline = time.monotonic() + timeout
    while True:
        found = sweeps(runs)
        if len(found) >= count and all(s["status"] != "running" for s in found):
            return found
        if time.monotonic() > deadline:
            return found  # the assertions below say which sweep did not end
        time.sleep(0.5)


def test_enter_does_not_launch_and_a_second_sweep_waits_then_runs(page, runs):
    form = page.get_by_test_id("stForm")
    form.get_by_role("button", name="Remove hoyer").click()  # one regularizer: 2 trials a sweep
    for label, value in (("λ values (log-spaced)", "1"), ("Steps per trial", "2"), ("λ from", "0.1")):
        field = form.get_by_label(label, exact=True)
        field.fill(value)
        field.press("Enter")  # a form that submits on Enter would launch a sweep here
    launch_button = form.get_by_role("button", name=f"Sweep {MODEL} on ")
    launch_button.click()
    page.get_by_text("launched: 2 trials").wait_for()
    assert len(sweeps(runs)) == 1  # the three Enters launched nothing; the click launched one
    settle(page, script_done=False)
    launch_button.click()  # while the first runs (Ray is still starting, or its trials train)
    page.get_by_text("waits in line").wait_for()
    assert len(sweeps(runs)) == 2
    page.wait_for_function(
        "() => document.querySelector('[data-testid=\"stProgress\"]')?.innerText.startsWith('completed')",
        timeout=400_000,
    )
    settle(page)
    done = wait_for_sweeps_to_end(runs, count=2)  # the page's 'completed' may be drawn before the store says so
    for sweep in done:
        assert sweep["status"] == "completed" and sweep["counts"] == {"completed": 2}, sweep
    assert "dictionary changed size" not in page.inner_text("body")
    screenshot(page, ARTIFACTS / "sweeps_two.png")
