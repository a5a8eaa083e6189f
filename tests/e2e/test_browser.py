"""The real dashboard in headless Chromium (Debian's /usr/bin/chromium) against `streamlit run`:
retrain live (start, watch it refresh, stop, find the run), load every page of the page table
(navigation.py) and save a screenshot of each (light theme, and dark for the figure pages) under
tests/artifacts/, read the sidebar's navigation, move the query slider, change the head, download
exports.

One server and one browser serve the whole module; the data directory is a temporary folder."""

import io
import json
import re
import time
import zipfile
from pathlib import Path

import pytest
from playwright.sync_api import expect

import navigation
from benchmarks.dashboard import (
    CHROMIUM,
    VIEWPORT,
    choose,
    launch,
    new_page,
    rerun,
    runs_ended,
    screenshot,
    serve,
    settle,
    start_live_retrain,
    title_has,
)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
PAGES = {Path(p.file).stem: p.url_path for p in navigation.PAGES}  # screenshot name -> URL path
DARK = ["1_Heatmaps", "2_Spectrum", "4_Runs"]  # the figure-heavy pages, in the dark theme too

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]


def no_exception(page) -> None:
    errors = page.locator("[data-testid='stException']")
    assert errors.count() == 0, errors.first.inner_text()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("dashboard-data")) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(browser):
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    context.set_default_timeout(60_000)
    yield new_page(context)
    context.close()


def progress_text(page) -> str:
    return page.locator("[data-testid='stProgress']").inner_text()


def test_retrain_live_start_and_stop(page, server):
    main = start_live_retrain(page, server, steps=5000)
    page.wait_for_selector("[data-testid='stPlotlyChart'] .main-svg")

    # the live view redraws by itself (no user action) while the run trains
    texts, start = {progress_text(page)}, time.monotonic()
    while len(texts) < 3 and time.monotonic() - start < 90:  # a loaded machine redraws slowly, not never
        page.wait_for_timeout(100)
        texts.add(progress_text(page))
    assert len(texts) >= 3, texts
    assert main.get_by_role("button", name="Start").is_disabled()
    settle(page, script_done=False)
    screenshot(page, ARTIFACTS / "3_Retrain_running.png")

    main.get_by_role("button", name="Stop").click()
    done = page.get_by_text(re.compile(r"Run [\w-]+ stopped at step \d+ of 5000"))
    done.wait_for(timeout=90_000)
    run_id = re.search(r"Run ([\w-]+) stopped", done.inner_text()).group(1)
    settle(page)
    no_exception(page)
    expect(main.get_by_role("button", name="Start")).to_be_enabled(timeout=60_000)  # once the page reran
    assert main.get_by_test_id("stPopover").filter(has_text="Download").count() >= 3  # downloads once the run has ended
    screenshot(page, ARTIFACTS / "3_Retrain_stopped.png")

    page.goto(f"{server}/Runs")
    settle(page)
    assert page.get_by_text(re.compile(rf"run:{run_id} · .* · entropy=0\.1 · ")).count() >= 1  # parent, regs, status
    page.get_by_role("combobox", name="Model").click()
    assert page.get_by_role("option", name=re.compile(rf"^run:{run_id} · ")).count() == 1
    page.keyboard.press("Escape")


@pytest.mark.parametrize("name", PAGES)
def test_every_page_loads(page, server, name):
    page.goto(f"{server}/{PAGES[name]}")
    settle(page)
    no_exception(page)
    assert page.locator("h1").count() >= 1
    screenshot(page, ARTIFACTS / f"{name}.png")


def test_the_sidebar_navigation_lists_every_page_once(page, server):
    page.goto(server)
    settle(page)
    links = page.locator("[data-testid='stSidebarNav'] a")
    labels = [t.strip().splitlines()[-1] for t in links.all_inner_texts()]  # after the icon's ligature name
    assert labels == [p.title for p in navigation.PAGES]
    assert links.first.get_attribute("href").rstrip("/") == server


def test_dark_theme(browser, server):
    context = browser.new_context(viewport=VIEWPORT, color_scheme="dark")
    dark = new_page(context)
    for name in DARK:
        dark.goto(f"{server}/{PAGES[name]}")
        settle(dark)
        no_exception(dark)
        background = dark.evaluate(
            "() => getComputedStyle(document.querySelector('[data-testid=\"stApp\"]')).backgroundColor"
        )
        assert sum(map(int, re.findall(r"\d+", background)[:3])) < 150, background  # a dark page
        screenshot(dark, ARTIFACTS / f"dark_{name}.png")
    context.close()


def test_heatmaps_slider_and_head(page, server):
    page.goto(f"{server}/Heatmaps?model=induction-2l&layer=1&head=0")
    title_has(page, 0, "layer 1 head 0")
    settle(page)
    slider = page.get_by_role("slider", name="Query position i")
    rerun(page, lambda: slider.press("Home"))  # query 0
    page.get_by_role("heading", name=re.compile(r"^Query 0:")).wait_for()
    for _ in range(3):
        rerun(page, lambda: slider.press("ArrowRight"))
    page.get_by_role("heading", name=re.compile(r"^Query 3:")).wait_for()
    scores = page.locator("[data-testid='stPlotlyChart']").first
    assert scores.locator("path[style*='rgb(214, 39, 40)']").count() >= 1  # the query's row is outlined
    choose(page, "Head", "2")
    title_has(page, 0, "layer 1 head 2")
    settle(page)
    no_exception(page)
    assert "query=3" in page.url and "head=2" in page.url


_WATCH_STALE = """(label) => { window.__attnStale = [];
    const el = Array.from(document.querySelectorAll('[data-testid=stElementContainer]'))
        .find(e => e.innerText.includes(label));
    new MutationObserver(ms => ms.forEach(m => window.__attnStale.push(m.target.getAttribute('data-stale'))))
        .observe(el, {attributes: true, subtree: true, attributeFilter: ['data-stale']});
    return !!el; }"""


def test_a_head_change_reruns_only_the_head_views(page, server):
    """The Heatmaps page's head-dependent views are a fragment: picking a head redraws them while
    the input above is never marked stale (a full rerun, such as a new input, marks it)."""
    page.goto(f"{server}/Heatmaps?model=induction-2l&layer=1&head=0")
    settle(page)
    assert page.evaluate(_WATCH_STALE, "Input")
    rerun(page, lambda: choose(page, "Head", "2"))
    title_has(page, 0, "layer 1 head 2")
    assert page.evaluate("() => window.__attnStale") == []
    assert "head=2" in page.url
    # the control: a full rerun (a new input) marks the input stale, so the watch above can see it.
    # A fast full rerun can re-send the input before the browser draws it stale (React batches the
    # two), so the control gets a few full reruns: at least one must be seen.
    seen = []
    for choice in ("random tokens", "task sample") * 3:
        assert page.evaluate(_WATCH_STALE, "Input")
        rerun(page, lambda choice=choice: page.get_by_text(choice).click())
        seen += page.evaluate("() => window.__attnStale")
        if "true" in seen:
            break
    assert "true" in seen, seen
    title_has(page, 0, "layer 1 head 2")
    no_exception(page)


def test_the_run_counter_counts_the_runs_the_server_ends(page, server):
    """``rerun`` waits for the server's ``script_finished`` messages, not the page's run state
    (under load the page can draw "running" and "not running" in one render: a head change then
    waited 60 s for a run that had ended). One head change is one fragment run ended."""
    page.goto(f"{server}/Heatmaps?model=induction-2l&layer=0&head=0")
    settle(page)
    before = runs_ended(page)
    assert before >= 1  # the page's first run
    # a first visit sends the page's rest in a second run, whose end can reach the counter after
    # the page has drawn it (under load): count from a moment when no run has ended for a while
    page.wait_for_timeout(500)
    while runs_ended(page) != before:
        before = runs_ended(page)
        page.wait_for_timeout(500)
    rerun(page, lambda: choose(page, "Head", "1"))
    title_has(page, 0, "layer 0 head 1")
    page.wait_for_timeout(500)  # nothing else runs after it
    assert runs_ended(page) == before + 1


def test_downloads(page, server):
    page.goto(f"{server}/Heatmaps?model=induction-2l&layer=0&head=1&query=5")
    settle(page)
    menu = page.get_by_test_id("stPopover").filter(has_text="Download").first  # the first figure's menu
    menu.get_by_role("button").click()
    body = page.get_by_test_id("stPopoverBody")
    with page.expect_download() as d:
        body.get_by_role("button", name="CSV").click()
    csv = Path(d.value.path()).read_text()
    assert d.value.suggested_filename == "sequence_scores_L0H1.csv"
    assert csv.splitlines()[0].startswith("layer,head,query,key")

    with page.expect_download(timeout=90_000) as d:
        body.get_by_role("button", name="PNG").click()
    assert d.value.suggested_filename == "sequence_scores_L0H1.png"
    assert Path(d.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page.keyboard.press("Escape")

    start = time.monotonic()
    with page.expect_download(timeout=120_000) as d:
        page.get_by_role("button", name="Download all figures (zip)").click()
    print(f"zip of the Heatmaps page after the first export: {time.monotonic() - start:.1f} s")
    with zipfile.ZipFile(io.BytesIO(Path(d.value.path()).read_bytes())) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        names = set(zf.namelist())
    assert (manifest["model"], manifest["layer"], manifest["head"], manifest["query"]) == ("induction-2l", 0, 1, 5)
    assert not manifest["skipped"]
    assert {f"sequence_scores_L0H1.{fmt}" for fmt in ("png", "svg", "html", "csv")} <= names


def test_sweeps_launch_watch_and_open_a_trial(page, server):
    """Launch a small sweep from the page on local Ray, watch it finish without touching the page,
    and open one trial as the model of every page."""
    page.goto(f"{server}/Sweeps?model=copy-1l")
    settle(page)
    form = page.locator("[data-testid='stForm']")
    form.get_by_role("spinbutton", name="λ values (log-spaced)").fill("1")
    form.get_by_role("spinbutton", name="Steps per trial").fill("5")
    form.get_by_role("button", name=re.compile(r"^Sweep copy-1l on")).click()  # the sidebar's model (?model=)
    page.get_by_text(re.compile(r"Sweep [\w-]+ of copy-1l launched: 3 trials")).wait_for(timeout=60_000)
    # the live fragment refreshes by itself until every trial is recorded (Ray starts inside the server)
    page.get_by_text(re.compile(r"3 of 3 trials recorded")).first.wait_for(timeout=240_000)
    settle(page)
    no_exception(page)
    assert page.get_by_test_id("stPopover").filter(has_text="Download").count() >= 1  # the Pareto scatter exports
    screenshot(page, ARTIFACTS / "10_Sweeps_done.png")
    page.get_by_role("button", name="Open as the model of every page").click()
    page.get_by_text(re.compile(r"run:[\w-]+ is now the model on every page")).wait_for()
