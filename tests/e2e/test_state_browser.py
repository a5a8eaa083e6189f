"""State the user sees in the real dashboard (headless Chromium against `streamlit run`):

- quick arrow presses on the Heatmaps query slider fold into one script thread: the server's
  thread count is sampled while 23 presses land and the page settles (with Streamlit's fast
  reruns every press started a new script thread while the old ones ran on: a rerun storm);
- the Sweeps page follows a sweep to its end without a reload: its status is drawn fresh under
  the selector, whose labels hold only what never changes (the old selector said "running ·
  0/2 trials" until the page was reloaded);
- the Home page's links show their whole labels (in three columns one was cut mid-word)."""

import os
import re
import threading
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from attn_core.runs import RunStore
from attn_core.sweep import grid_plan, record_trial, run_trial, start_sweep
from benchmarks.dashboard import CHROMIUM, VIEWPORT, launch, new_page, rerun, serve, settle

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dashboard-data")


@pytest.fixture(scope="module")
def server(data):
    with serve(data) as url:
        yield url


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        context = browser.new_context(viewport=VIEWPORT)
        context.set_default_timeout(120_000)
        yield new_page(context)
        browser.close()


def server_pid() -> int:
    """The `streamlit run` process this test started (a child of this process)."""
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                if b"streamlit" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return int(pid)
            except OSError:
                continue
    raise AssertionError("no streamlit child process")


def threads(pid: int) -> int:
    return int(re.search(r"^Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M).group(1))


def test_quick_slider_presses_fold_into_one_script_thread(page, server):
    pid = server_pid()
    page.goto(f"{server}/Heatmaps?model=induction-2l&layer=1&head=0")
    settle(page, 120_000)
    slider = page.get_by_role("slider", name="Query position i")
    rerun(page, lambda: slider.press("Home"), 120_000)
    page.get_by_role("heading", name=re.compile(r"^Query 0:")).wait_for()
    base, seen, done = threads(pid), [], threading.Event()

    def sample():
        while not done.is_set():
            seen.append(threads(pid))
            time.sleep(0.005)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        for _ in range(23):
            slider.press("ArrowRight")  # as fast as the browser takes them
        settle(page, 300_000)
    finally:
        done.set()
        watcher.join()
    # one script thread at a time (fast reruns started one per press: +5 at once was measured). A
    # thread that comes to stay is no script thread: a pool that torch or OpenMP starts on its first
    # parallel operation is still there once the runs have ended (a script thread is not)
    stayed = min(threads(pid) for _ in range(40) if time.sleep(0.05) is None)
    assert max(seen) - max(base, stayed) <= 1, (base, stayed, max(seen))
    page.get_by_role("heading", name=re.compile(r"^Query 23:")).wait_for()
    assert "query=23" in page.url
    assert page.get_by_role("combobox", name="Layer", exact=True).is_enabled()
    assert page.locator("[data-testid='stException']").count() == 0


def test_sweep_status_follows_the_store_without_a_reload(page, server, data):
    store = RunStore(data)
    plan = grid_plan("reverse-1l", ["entropy=0.5"], steps=3, measure_samples=64)
    sweep_id, _ = start_sweep(plan, store)  # running, owned by this (live) process
    page.goto(f"{server}/Sweeps?model=reverse-1l")
    settle(page, 120_000, script_done=False)
    selector = page.get_by_role("combobox", name="Sweep", exact=True)  # its value: what never changes
    expect(selector).to_have_value(f"{sweep_id} · reverse-1l · 2 trials", timeout=240_000)
    page.get_by_text(re.compile(r"running \(live\): 0 of 2 trials recorded")).wait_for(timeout=120_000)
    for trial in plan.trials:  # the sweep's trials arrive and it ends, in another process's place
        record_trial(store, sweep_id, run_trial(trial.to_dict(), plan.job))
    store.update_sweep(sweep_id, "completed")
    page.get_by_text(re.compile(r"completed: 2 of 2 trials recorded")).wait_for(timeout=60_000)
    assert page.get_by_text(re.compile(r"running \(live\)")).count() == 0  # nothing on the page still says running
    settle(page, 60_000)  # the page reran once and stopped refreshing
    assert page.locator("[data-testid='stException']").count() == 0


_CUT = """() => Array.from(document.querySelectorAll('[data-testid="stPageLink"]')).flatMap(link =>
    Array.from(link.querySelectorAll('*')).filter(e => e.scrollWidth > e.clientWidth + 1 && e.innerText.trim())
        .map(e => e.innerText.trim()))"""


def test_the_home_pages_links_show_their_whole_labels(page, server):
    page.goto(server)
    settle(page, 120_000)
    links = page.locator("[data-testid='stPageLink']")
    assert links.count() >= 10
    assert page.evaluate(_CUT) == []
