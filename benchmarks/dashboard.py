"""How fast the dashboard draws, in headless Chromium against a real `streamlit run`.

    python benchmarks/dashboard.py [--repeats 5] [--json] [--out benchmarks/results/dashboard.json]
    python benchmarks/dashboard.py --quick     # a smoke run: one sample of each figure
    python benchmarks/dashboard.py --model DIR [--length 1024]   # first heatmap and head change on DIR
    python benchmarks/dashboard.py --first --spinners 4   # only the first heatmap, the machine loaded by 4 busy processes
    python benchmarks/dashboard.py --first --against OLD  # the same, this checkout and OLD's alternated in one run


Two figures, medians of ``--repeats`` (>= 5) samples, both including the browser's drawing:

- first heatmap: from ``goto(/Heatmaps?model=M)`` in a new Streamlit session to the first plotly
  heatmap on screen, where M is a model the server has never loaded (a fresh copy of
  induction-2l per sample, so each sample reads, validates and caches the model and computes its
  views: the cost a user pays when picking a model). Measured in a browser that has opened the
  dashboard before (its HTTP cache holds the page's scripts) and, apart, in a fresh browser that
  also downloads and compiles them. Target <= 5 s.
- head change: from picking another head in the Head selectbox to the scores heatmap redrawn
  with that head's title, timed from Playwright's click call and, apart, from the pointer going
  down in the page (the page's own clock, without Playwright's pre-click checks). Target <= 0.25 s
  on the zoo, <= 0.5 s with ``--model`` at 1024 tokens.
- live refreshes: while reverse-1l retrains on the Retrain page, how often per second the live
  view shows a new step (sampled every 30 ms over 2 s windows). Target >= 4 per second on CPU.
- watched training (``--watched``, issue 21; results in benchmarks/results/watched.json): the
  same job trained by ``attn-lab retrain`` (its JSON's steps/s) and watched on the Retrain page in
  Chromium (the rate the page reports when it completes), alternated ``--repeats`` times in one
  run, with the live refreshes per second while it trains. Target: watched >= 0.9x the CLI's.
- first chart per page (``--pages`` alone, or with the rest): for every page of the page table,
  from goto in a new session to its first chart on screen (or, on a page with none until the
  user acts, to the end of its first run), induction-2l already loaded by the server, with the
  1-minute load average at each sample.

``--first`` also times the whole page (every chart drawn and the zip button there), and with
``--model DIR [--length N]`` measures that model; ``--against OLD`` serves an older checkout's
dashboard beside this one and alternates the two, sample by sample.

The server's very first page (Python imports, Streamlit start) is reported apart as ``cold_s``.

With ``--model DIR`` (a model folder: ours, or a Hugging Face GPT-2 folder, converted once into
ours so that the sidebar lists it), first heatmap and head change are measured on that model
with ``--length`` random tokens (default: its context; above 512 tokens the page shows the
long-input window, top keys and overview), and the zoo's live retraining is skipped.

The helpers here (a server on a free port, Chromium with the flags CI uses, waiting for a page to
settle, full-height screenshots) are shared with tests/e2e/test_browser.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import record  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HEATMAP = ".js-plotly-plot .heatmaplayer"
VIEWPORT = {"width": 1400, "height": 1000}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(runs_dir: Path, models_dir: Path | None = None, timeout: float = 90.0, root: Path = ROOT) -> Iterator[str]:
    """`streamlit run app.py` on 127.0.0.1 and a free port, data in ``runs_dir``; yields its URL.
    The server's output goes to ``runs_dir/server.log`` (shown if it does not come up). ``root``:
    the checkout whose dashboard is served (another one's, to compare with older code)."""
    port = free_port()
    env = dict(os.environ, ATTN_LAB_RUNS=str(runs_dir), PYTHONUNBUFFERED="1")
    env.pop("ATTN_LAB_MODELS", None)
    if models_dir is not None:
        env["ATTN_LAB_MODELS"] = str(models_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    log = open(runs_dir / "server.log", "wb")
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(root / "app.py"),
        "--server.headless",
        "true",
        "--server.address",
        "127.0.0.1",
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
    ]
    env["PYTHONPATH"] = str(root)
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise RuntimeError(
                    f"streamlit did not start on {url}:\n{(runs_dir / 'server.log').read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.read().strip() == b"ok":
                        break
            except OSError:
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def launch(playwright):
    """Debian's Chromium, headless, with the flags CI uses."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)


def settle(page, timeout_ms: float = 60_000, script_done: bool = True) -> None:
    """Wait until the script run has finished (unless ``script_done`` is False: a live fragment
    keeps rerunning), no element is a loading skeleton, no part of the page waits to be sent
    (the Heatmaps page's rest on a first visit, ``ui.heatmap_later``) and every plotly chart is
    drawn."""
    if script_done:
        page.wait_for_function(
            "() => document.querySelector('[data-testid=\"stApp\"]')"
            "?.getAttribute('data-test-script-state') === 'notRunning'",
            timeout=timeout_ms,
        )
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stSkeleton\"], .st-key-page_rest_pending')"
        " && Array.from(document.querySelectorAll('[data-testid=\"stPlotlyChart\"]'))"
        ".every(c => c.querySelector('.main-svg'))",
        timeout=timeout_ms,
    )


# the script runs the server has finished for a page (:func:`new_page`), by page
_FINISHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def new_page(context):
    """A new page of ``context`` whose script runs are counted as the server ends them: every
    ``script_finished`` message on its Streamlit websocket (full and fragment runs alike). The
    page's own run state can miss a short run: under load the browser's React may draw
    "running" and "not running" in one render, and a MutationObserver then sees no change (a
    head change on a loaded machine waited 60 s for a run that had ended)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    page = context.new_page()
    count = _FINISHED.setdefault(page, [0])

    def on_frame(payload) -> None:
        if isinstance(payload, (bytes, bytearray)):
            try:
                if ForwardMsg.FromString(bytes(payload)).WhichOneof("type") == "script_finished":
                    count[0] += 1
            except Exception:  # noqa: BLE001 -- another socket's frame: not ours to count
                pass

    page.on("websocket", lambda ws: ws.on("framereceived", on_frame))
    return page


def runs_ended(page) -> int | None:
    """How many script runs the server has ended for ``page`` (None: not a :func:`new_page`)."""
    count = _FINISHED.get(page)
    return None if count is None else count[0]


def rerun(page, action, timeout_ms: float = 60_000) -> None:
    """Do ``action()`` (a widget change) on a page from :func:`new_page` and wait until the server
    has ended one more script run, then until the page has settled."""
    count = _FINISHED.get(page)
    if count is None:
        raise ValueError("rerun counts the runs of pages made by new_page(context)")
    before = count[0]
    action()
    deadline = time.monotonic() + timeout_ms / 1000
    while count[0] <= before:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no script run ended within {timeout_ms / 1000:.0f} s of the action")
        page.wait_for_timeout(25)  # lets Playwright deliver the socket's frames
    settle(page, timeout_ms)


def screenshot(page, path: Path) -> None:
    """The whole page: the viewport is stretched to the main area's height (Streamlit scrolls
    inside its own container, so Playwright's full_page alone would stop at the fold)."""
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": VIEWPORT["width"], "height": min(int(height) + 40, 16_000)})
    page.wait_for_timeout(400)  # plotly re-lays out its charts on resize
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path))
    page.set_viewport_size(VIEWPORT)


def choose(page, label: str, option: str) -> None:
    """Pick ``option`` in the selectbox labelled ``label``."""
    page.get_by_role("combobox", name=label, exact=True).click()
    page.get_by_role("option", name=option, exact=True).click()


def title_has(page, index: int, text: str, timeout_ms: float = 30_000) -> None:
    """Wait until plotly chart ``index`` shows ``text`` in its title."""
    page.wait_for_function(
        "([i, t]) => { const g = document.querySelectorAll('.js-plotly-plot')[i];"
        " return !!g && !!g.querySelector('.heatmaplayer') && (g.querySelector('.gtitle') || {}).textContent?.includes(t); }",
        arg=[index, text],
        timeout=timeout_ms,
        polling="raf",
    )


# --- the benchmark ----------------------------------------------------------------------------------


# Every chart the page sent is drawn, and the page's last element (its zip button) is there.
_PAGE_DRAWN = """() => { const charts = document.querySelectorAll('[data-testid="stPlotlyChart"]');
    const zip = [...document.querySelectorAll('button')].some(b => b.textContent.includes('Download all figures'));
    return zip && charts.length > 0 && [...charts].every(c => c.querySelector('.main-svg')); }"""


def first_heatmap(browser, url: str, model: str, context=None, extra: str = "", whole: list | None = None) -> float:
    """Seconds from goto to the first heatmap, in a new session. With ``context`` (a browser that
    has seen the dashboard before) the page's scripts come from its HTTP cache; without one a
    fresh browser also downloads and compiles them (plotly.js alone is several MB). With ``whole``
    (a list), the seconds from goto until every chart of the page is drawn are appended to it."""
    own = context is None
    context = browser.new_context(viewport=VIEWPORT) if own else context
    page = new_page(context)
    start = time.perf_counter()
    page.goto(f"{url}/Heatmaps?model={model}{extra}")
    page.wait_for_selector(HEATMAP, timeout=120_000)
    elapsed = time.perf_counter() - start
    if whole is not None:
        page.wait_for_function(_PAGE_DRAWN, timeout=120_000, polling=50)
        whole.append(time.perf_counter() - start)
    page.close()
    if own:
        context.close()
    return elapsed


_ARM_CLICK = """() => { window.__attnPointer = null;
    document.addEventListener('pointerdown', () => { window.__attnPointer = performance.now(); },
                              {capture: true, once: true}); }"""
_TITLE_AT = """([i, t]) => { const g = document.querySelectorAll('.js-plotly-plot')[i];
    const ok = !!g && !!g.querySelector('.heatmaplayer') && (g.querySelector('.gtitle') || {}).textContent?.includes(t);
    return ok ? performance.now() : false; }"""


def head_changes(browser, url: str, model: str, repeats: int, extra: str = "") -> tuple[list[float], list[float]]:
    """Seconds from picking another head to the scores heatmap redrawn with its title, twice
    over: from Playwright's click call (which first waits ~40 ms for the option to be stable and
    hit-testable), and from the pointer going down on the option in the page to the animation
    frame that shows the new title, both read from the page's own clock."""
    context = browser.new_context(viewport=VIEWPORT)
    page = new_page(context)
    page.goto(f"{url}/Heatmaps?model={model}&layer=1&head=0{extra}")
    title_has(page, 0, "layer 1 head 0", timeout_ms=120_000)
    settle(page)
    calls, in_page = [], []
    for i in range(repeats):
        head = (i + 1) % 4
        page.get_by_role("combobox", name="Head", exact=True).click()
        option = page.get_by_role("option", name=str(head), exact=True)
        option.wait_for()
        page.evaluate(_ARM_CLICK)
        start = time.perf_counter()
        option.click()
        seen = page.wait_for_function(_TITLE_AT, arg=[0, f"layer 1 head {head}"], timeout=30_000, polling="raf")
        calls.append(time.perf_counter() - start)
        in_page.append((seen.json_value() - page.evaluate("() => window.__attnPointer")) / 1000)
        settle(page)
    context.close()
    return calls, in_page


# --- first chart of every page ---------------------------------------------------------------------
# In the page from its first moment: when a chart is first drawn, and when the first script run
# ended (idle for half a second: a rerun that follows at once is the same first visit), both in
# milliseconds since the navigation started (the page's own clock).
_WATCH_RUN = """(() => { window.__attnChart = null; window.__attnIdle = null; let seen = false, idleSince = null;
    const tick = () => { const now = performance.now();
        if (window.__attnChart === null && document.querySelector('.js-plotly-plot .main-svg')) window.__attnChart = now;
        const app = document.querySelector('[data-testid="stApp"]');
        const state = app && app.getAttribute('data-test-script-state');
        if (state === 'running') { seen = true; idleSince = null; }
        else if (seen && state === 'notRunning') {
            if (idleSince === null) idleSince = now;
            if (now - idleSince > 500 && window.__attnIdle === null) window.__attnIdle = idleSince;
        }
        requestAnimationFrame(tick); };
    requestAnimationFrame(tick); })()"""


# Pages that draw a chart on their first visit (induction-2l, an empty run store); the others
# (Home, Runs, Sweeps, Dynamics) wait for the user or a run, and their first run's end is what is
# timed. Grow d_k draws the head as it is before Grow is pressed. On a busy machine a chart reaches the page seconds after the run that sent
# it, so "no chart is coming" cannot be read from the page itself.
CHART_PAGES = {
    "Heatmaps",
    "Spectrum",
    "Retrain",
    "Kernelized attention",
    "Attention explorer",
    "Merged vs factored QK",
    "Circuits",
    "Grow d_k",
}


def first_chart(browser, url: str, path: str, model: str, context=None, chart: bool = True) -> tuple[float, bool]:
    """Seconds from goto(/path?model=M) in a new session to the page's first chart on screen
    (``chart``) or to the end of its first run (a page with no chart until the user acts), read
    from the page's own clock; and whether a chart was drawn by then."""
    context = context or browser.new_context(viewport=VIEWPORT)
    page = new_page(context)
    page.add_init_script(_WATCH_RUN)
    page.goto(f"{url}/{path}?model={model}")
    page.wait_for_function(
        "() => window.__attnChart !== null" if chart else "() => window.__attnIdle !== null",
        timeout=180_000,
        polling="raf",
    )
    drawn, idle = page.evaluate("() => [window.__attnChart, window.__attnIdle]")
    page.close()
    return (drawn if chart else idle) / 1000, drawn is not None


def first_charts(browser, url: str, model: str, repeats: int) -> list[dict]:
    """First chart of every page of the page table, ``repeats`` new sessions each (in a browser
    that has seen the dashboard, the model already loaded by the server), with the machine's
    1-minute load average at each sample."""
    import navigation

    context = browser.new_context(viewport=VIEWPORT)
    first_chart(browser, url, "", model, context, chart=False)  # the model loads once, as a returning user finds it
    rows = []
    for entry in navigation.PAGES:
        samples, loads, charted = [], [], True
        for _ in range(repeats):
            t, charted = first_chart(browser, url, entry.url_path, model, context, chart=entry.title in CHART_PAGES)
            samples.append(t)
            loads.append(os.getloadavg()[0])
        rows.append(
            {
                "page": entry.title,
                "median_s": statistics.median(samples),
                "samples_s": samples,
                "load_average": loads,
                "until": "first chart" if charted else "first run ends (no chart yet)",
            }
        )
    context.close()
    return rows


def start_live_retrain(page, url: str, steps: int, timeout_ms: float = 30_000):
    """Open Retrain on reverse-1l, set the number of steps, press Start and wait until the live
    view reports a training step; returns the page's main block."""
    page.goto(f"{url}/Retrain?model=reverse-1l")
    settle(page)
    box = page.get_by_role("spinbutton", name="Steps")
    box.wait_for(timeout=timeout_ms)  # the page measures the model before it shows the form's last widgets
    box.fill(str(steps), timeout=timeout_ms)
    rerun(page, lambda: box.press("Enter"))
    main = page.get_by_test_id("stMainBlockContainer")
    main.get_by_role("button", name="Start").click()
    page.get_by_text(re.compile(r"running: step [1-9]")).wait_for(timeout=timeout_ms)
    return main


def _refresh_rate(page, progress, window_s: float) -> tuple[float, str]:
    """New steps shown per second over one window (the progress text sampled every 30 ms)."""
    texts, start = [progress.inner_text()], time.perf_counter()
    while time.perf_counter() - start < window_s:
        page.wait_for_timeout(30)
        text = progress.inner_text()
        if text != texts[-1]:
            texts.append(text)
    return (len(texts) - 1) / window_s, texts[-1]


# The Retrain page's default job on reverse-1l (entropy, lambda 0.1, on the watched head L0H0), as a command
WATCHED_JOB = ["retrain", "reverse-1l", "--reg", "entropy=0.1", "--heads", "L0H0", "--device", "cpu"]


def cli_rate(steps: int, runs: Path) -> float:
    """Steps/s of ``attn-lab retrain`` on the page's default job (one torch thread, like the
    page's worker), as its JSON reports it (Snapshot.steps_per_s: the training loop alone)."""
    env = dict(os.environ, ATTN_LAB_RUNS=str(runs), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "attn_core", *WATCHED_JOB, "--steps", str(steps), "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if r.returncode != 0:
        raise RuntimeError(f"attn-lab retrain failed: {r.stderr[-2000:]}")
    return float(json.loads(r.stdout)["steps_per_s"])


def watched_rate(browser, url: str, steps: int, window_s: float = 2.0) -> tuple[float, list[float]]:
    """The page's reported steps/s of a ``steps``-step run of its default job, watched in
    Chromium to the end, and the live refreshes per second in each full window while it trained."""
    context = browser.new_context(viewport=VIEWPORT)
    page = new_page(context)
    start_live_retrain(page, url, steps=steps, timeout_ms=120_000)
    progress = page.locator("[data-testid='stProgress']")
    rates = []
    while True:
        rate, text = _refresh_rate(page, progress, window_s)
        if text.startswith("completed") or not text.startswith("running"):
            break
        rates.append(rate)
    page.get_by_text(re.compile(rf"completed: step {steps} / {steps}")).wait_for(timeout=600_000)
    speed = float(re.search(r"([\d.]+) steps/s", progress.inner_text()).group(1))
    context.close()
    return speed, rates


def watched_training(repeats: int, steps: int, against: Path | None = None) -> dict:
    """CLI and watched runs of the same job alternated ``repeats`` times (one server, one browser);
    with ``against`` (an older checkout), its dashboard watched too, in the same rounds."""
    from playwright.sync_api import sync_playwright

    cli, watched, refreshes, old, old_refreshes = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="attn-lab-watched-") as tmp:
        tmp = Path(tmp)
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(serve(tmp / "runs"))
            old_url = stack.enter_context(serve(tmp / "old-runs", root=against)) if against else None
            browser = launch(stack.enter_context(sync_playwright()))
            for i in range(repeats):
                cli.append(cli_rate(steps, tmp / "cli-runs"))
                speed, rates = watched_rate(browser, url, steps)
                watched.append(speed)
                refreshes += rates
                line = f"round {i + 1}: CLI {cli[-1]:.1f} steps/s, watched {speed:.1f} steps/s"
                line += f" (live refreshes {', '.join(f'{r:.1f}' for r in rates)} /s)"
                if old_url is not None:
                    speed, rates = watched_rate(browser, old_url, steps)
                    old.append(speed)
                    old_refreshes += rates
                    line += f"; watched on {against}'s dashboard {speed:.1f} steps/s"
                print(line, flush=True)
            browser.close()
    ratio = statistics.median(w / c for w, c in zip(watched, cli))
    return {
        "job": "attn-lab " + " ".join(WATCHED_JOB) + f" --steps {steps}",
        "steps": steps,
        "repeats": repeats,
        "cli_steps_per_s": statistics.median(cli),
        "watched_steps_per_s": statistics.median(watched),
        "ratio_watched_vs_cli": ratio,
        "ratio_of_medians": statistics.median(watched) / statistics.median(cli),
        "live_refreshes_per_s": statistics.median(refreshes) if refreshes else None,
        "cli_samples": cli,
        "watched_samples": watched,
        "live_refresh_samples": refreshes,
        "targets": {"ratio_watched_vs_cli": 0.9, "live_refreshes_per_s": 4.0},
        **(
            {
                "against": str(against),
                "old_watched_steps_per_s": statistics.median(old),
                "old_watched_samples": old,
                "old_live_refreshes_per_s": statistics.median(old_refreshes) if old_refreshes else None,
                "ratio_watched_new_vs_old": statistics.median(n / o for n, o in zip(watched, old)),
            }
            if against
            else {}
        ),
        **record.environment(),
    }


def live_refreshes(browser, url: str, windows: int, window_s: float = 2.0) -> tuple[list[float], float]:
    """Refreshes per second of the live view in ``windows`` windows, and the training steps/s
    the page reported at the end."""
    context = browser.new_context(viewport=VIEWPORT)
    page = new_page(context)
    block = start_live_retrain(page, url, steps=20000, timeout_ms=120_000)
    progress = page.locator("[data-testid='stProgress']")
    page.wait_for_timeout(3000)  # past the first draws of every chart
    rates, text = [], ""
    for _ in range(windows):
        rate, text = _refresh_rate(page, progress, window_s)
        rates.append(rate)
    speed = float(re.search(r"([\d.]+) steps/s", text).group(1))
    block.get_by_role("button", name="Stop").click()
    page.get_by_text(re.compile(r"stopped at step")).first.wait_for(timeout=120_000)
    context.close()
    return rates, speed


def prepare_models(models: Path, source: Path | None, copies: int) -> str:
    """``copies`` models named bench-0.. in ``models`` (each loads as a model the server has never
    seen): copies of induction-2l, or links to ``source``, converted once into our format when the
    sidebar does not list it as it is. Returns the model the head changes are measured on."""
    if source is None:
        for i in range(copies):
            shutil.copytree(ROOT / "assets" / "models" / "induction-2l", models / f"bench-{i}")
        return "induction-2l"
    from attn_core import checkpoint, sources, zoo

    models.mkdir(parents=True)
    target = source.resolve()
    (models / "probe").symlink_to(target, target_is_directory=True)
    saved = os.environ.get(zoo.ENV_DIRS)
    os.environ[zoo.ENV_DIRS] = str(models)
    try:
        listed = any(m["name"] == "probe" for m in zoo.list_models())
    finally:
        if saved is None:
            del os.environ[zoo.ENV_DIRS]
        else:
            os.environ[zoo.ENV_DIRS] = saved
    (models / "probe").unlink()
    if not listed:
        target = checkpoint.save(sources.resolve(source).model, models.parent / "source")
        try:
            checkpoint.load_path(target)
        except checkpoint.CheckpointError as e:
            sys.exit(f"{source} is not listed by the model picker and its converted copy does not load: {e}")
    for i in range(copies):
        (models / f"bench-{i}").symlink_to(target, target_is_directory=True)
    return "bench-0"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="samples per figure (>= 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--quick", action="store_true", help="smoke run: one sample of each figure")
    parser.add_argument("--model", type=Path, help="a model folder to measure instead of induction-2l")
    parser.add_argument(
        "--out", type=Path, help="also save the result as JSON here (e.g. benchmarks/results/dashboard.json)"
    )
    parser.add_argument("--length", type=int, help="with --model: random tokens of this length (default: its context)")
    parser.add_argument(
        "--pages", action="store_true", help="only the first chart of every page (new sessions, model loaded)"
    )
    parser.add_argument(
        "--watched", action="store_true", help="only the watched-training measure (CLI vs Retrain page, alternated)"
    )
    parser.add_argument(
        "--first",
        action="store_true",
        help="only the first heatmap (returning browser), with the load average at each sample",
    )
    parser.add_argument(
        "--spinners",
        type=int,
        default=0,
        help="with --first: busy processes that load the machine while it is measured",
    )
    parser.add_argument("--steps", type=int, default=8000, help="with --watched: steps of each run (quick: 250)")
    parser.add_argument(
        "--against",
        type=Path,
        help="with --watched or --first: an older checkout whose dashboard is measured too, alternated with this one",
    )
    args = parser.parse_args(argv)
    if args.watched:
        return watched_main(args)
    if args.quick:
        args.repeats = 1
    elif args.repeats < 5:
        parser.error("--repeats must be at least 5 (medians of >= 5)")
    if args.length is not None and args.model is None:
        parser.error("--length goes with --model")
    if args.model is not None and not args.model.is_dir():
        parser.error(f"--model {args.model} is not a folder")
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    extra = "" if args.model is None else "&input=random" + (f"&length={args.length}" if args.length else "")
    if args.against is not None and not (args.against / "app.py").is_file():
        parser.error(f"--against {args.against} is not a checkout (it has no app.py)")
    if args.pages:
        return _pages_only(args)
    if args.first:
        return _first_only(args, extra)
    with tempfile.TemporaryDirectory(prefix="attn-lab-bench-") as tmp:
        tmp = Path(tmp)
        models = tmp / "models"
        watched = prepare_models(models, args.model, 2 * args.repeats + 1)
        with serve(tmp / "runs", models) as url, sync_playwright() as p:
            browser = launch(p)
            cold = first_heatmap(browser, url, "bench-0", extra=extra)
            fresh = [first_heatmap(browser, url, f"bench-{i}", extra=extra) for i in range(1, args.repeats + 1)]
            returning = browser.new_context(viewport=VIEWPORT)
            firsts = [
                first_heatmap(browser, url, f"bench-{i}", returning, extra=extra)
                for i in range(args.repeats + 1, 2 * args.repeats + 1)
            ]
            returning.close()
            heads, heads_in_page = head_changes(browser, url, watched, args.repeats, extra=extra)
            pages = first_charts(browser, url, watched, 1 if args.quick else args.repeats) if args.model is None else []
            rates, speed = live_refreshes(browser, url, args.repeats) if args.model is None else ([], None)
            browser.close()
    result = {
        "model": str(args.model or "induction-2l"),
        "length": args.length,
        "first_heatmap_s": statistics.median(firsts),
        "first_heatmap_fresh_browser_s": statistics.median(fresh),
        "head_change_s": statistics.median(heads),
        "head_change_in_page_s": statistics.median(heads_in_page),
        "live_refreshes_per_s": statistics.median(rates) if rates else None,
        "cold_s": cold,
        "first_heatmap_samples": firsts,
        "first_heatmap_fresh_browser_samples": fresh,
        "head_change_samples": heads,
        "head_change_in_page_samples": heads_in_page,
        "live_refresh_samples": rates,
        "first_chart_per_page": pages,
        "training_steps_per_s_while_watched": speed,
        "targets": {
            "first_heatmap_s": 5.0,
            "head_change_s": 0.25 if args.model is None else 0.5,
            "live_refreshes_per_s": 4.0,
        },
        **record.environment(),
    }
    if args.out is not None:
        record.save(result, args.out)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if args.model is not None:
        print(f"model {args.model}, random tokens of length {args.length or 'its context'}")
    print(
        f"first heatmap (new session, model never loaded): median {result['first_heatmap_s']:.2f} s "
        f"of {args.repeats} (target <= 5 s); samples {', '.join(f'{t:.2f}' for t in firsts)}"
    )
    print(
        f"  the same in a fresh browser (downloads and compiles plotly.js too): median "
        f"{result['first_heatmap_fresh_browser_s']:.2f} s; samples {', '.join(f'{t:.2f}' for t in fresh)}"
    )
    print(
        f"head change -> redrawn heatmap: median {result['head_change_s']:.3f} s of {args.repeats} "
        f"(from Playwright's click call); samples {', '.join(f'{t:.3f}' for t in heads)}"
    )
    print(
        f"  the same from the pointer going down in the page to the frame that shows the new title: median "
        f"{result['head_change_in_page_s']:.3f} s; samples {', '.join(f'{t:.3f}' for t in heads_in_page)}"
    )
    if rates:
        print(
            f"live view while retraining: median {result['live_refreshes_per_s']:.2f} refreshes/s of {args.repeats} "
            f"windows (target >= 4); training ran at {speed:.1f} steps/s meanwhile"
        )
    _print_pages(pages)
    print(
        f"cold start (first page after the server started): {cold:.2f} s; "
        f"load average {', '.join(f'{x:.1f}' for x in result['load_average'])} on {os.cpu_count()} CPUs"
    )


def _print_pages(rows: list[dict]) -> None:
    for r in rows:
        print(
            f"first chart, {r['page']:<22} median {r['median_s']:.2f} s of {len(r['samples_s'])} ({r['until']}); "
            f"load average {', '.join(f'{x:.1f}' for x in r['load_average'])}"
        )


def _pages_only(args) -> None:
    """``--pages``: the first chart of every page, on induction-2l, nothing else."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="attn-lab-bench-") as tmp, serve(Path(tmp) / "runs") as url:
        with sync_playwright() as p:
            browser = launch(p)
            rows = first_charts(browser, url, "induction-2l", args.repeats)
            browser.close()
    result = {"first_chart_per_page": rows, **record.environment()}
    if args.out is not None:
        record.save(result, args.out)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    _print_pages(rows)
    print(f"load average {', '.join(f'{x:.1f}' for x in result['load_average'])} on {os.cpu_count()} CPUs")


def _first_only(args, extra: str = "") -> None:
    """``--first``: the first heatmap in a returning browser, ``--repeats`` samples, each with the
    1-minute load average at its start, and the time until every chart of the page is drawn;
    ``--spinners N`` busy processes load the machine from a minute and a half before the first
    sample (the average lags) to the last. ``--against OLD``: OLD's dashboard too, served beside
    this one and measured in the same rounds, the two alternated (which goes first alternates)."""
    from playwright.sync_api import sync_playwright

    if args.spinners < 0 or args.spinners > 64:
        sys.exit("--spinners takes 0..64 busy processes")
    checkouts = {"new": ROOT, **({"old": args.against.resolve()} if args.against else {})}
    samples = {name: [] for name in checkouts}
    spinners, cold = [], {}
    with tempfile.TemporaryDirectory(prefix="attn-lab-bench-") as tmp, contextlib.ExitStack() as stack:
        tmp = Path(tmp)
        prepare_models(tmp / "models", args.model, args.repeats + 2)
        urls = {
            name: stack.enter_context(serve(tmp / f"runs-{name}", tmp / "models", root=root))
            for name, root in checkouts.items()
        }
        browser = launch(stack.enter_context(sync_playwright()))
        returning = browser.new_context(viewport=VIEWPORT)
        for name, url in urls.items():
            cold[name] = first_heatmap(browser, url, "bench-0", extra=extra)
            first_heatmap(browser, url, "bench-1", returning, extra=extra)  # its HTTP cache now holds the scripts
        try:
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.spinners)]
            if spinners and not args.quick:
                time.sleep(90)
            for i in range(2, args.repeats + 2):
                order = list(urls) if i % 2 == 0 else list(reversed(urls))
                for name in order:
                    load, whole = os.getloadavg()[0], []
                    t = first_heatmap(browser, urls[name], f"bench-{i}", returning, extra=extra, whole=whole)
                    samples[name].append({"s": t, "page_s": whole[0], "load": load})
                    print(
                        f"  {name}: first heatmap {t:.2f} s, whole page {whole[0]:.2f} s, at load {load:.2f}",
                        flush=True,
                    )
        finally:
            for q in spinners:
                q.kill()
        browser.close()

    def summary(rows: list[dict]) -> dict:
        return {
            "first_heatmap_s": statistics.median(x["s"] for x in rows),
            "whole_page_s": statistics.median(x["page_s"] for x in rows),
            "load_average_median": statistics.median(x["load"] for x in rows),
            "samples": rows,
        }

    result = {
        **summary(samples["new"]),
        "model": str(args.model or "induction-2l copies"),
        "length": args.length,
        "spinners": args.spinners,
        "cold_s": cold["new"],
        "target_s": 5.0,
        **(
            {"against": str(checkouts["old"]), "old": {**summary(samples["old"]), "cold_s": cold["old"]}}
            if args.against
            else {}
        ),
        **record.environment(),
    }
    if args.out is not None:
        record.save(result, args.out)
    for name, label in (("new", "this checkout"), ("old", f"{args.against}")):
        if name in samples:
            r = summary(samples[name])
            print(
                f"{label}: first heatmap (returning browser) median {r['first_heatmap_s']:.2f} s, whole page "
                f"{r['whole_page_s']:.2f} s, over {len(samples[name])} samples at load {r['load_average_median']:.2f} "
                f"(median; {args.spinners} busy processes); target <= 5 s"
            )


def watched_main(args) -> None:
    """``--watched``: the CLI's and the watched page's steps/s of one job, alternated; saved with
    ``--out`` (default benchmarks/results/watched.json, not in quick mode)."""
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    repeats, steps = (1, 250) if args.quick else (args.repeats, args.steps)  # not 300, the page's default
    if not args.quick and repeats < 5:
        sys.exit("--repeats must be at least 5 (medians of >= 5)")
    result = watched_training(repeats, steps, args.against)
    out = args.out or (None if args.quick else ROOT / "benchmarks" / "results" / "watched.json")
    if out is not None:
        record.save(result, out)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{result['job']}: CLI {result['cli_steps_per_s']:.1f} steps/s, watched on the Retrain page "
        f"{result['watched_steps_per_s']:.1f} steps/s (medians of {repeats}); watched/CLI "
        f"{result['ratio_watched_vs_cli']:.3f} (median of the per-round ratios; target >= 0.9); live refreshes "
        f"{result['live_refreshes_per_s']} /s (target >= 4); load average "
        f"{', '.join(f'{x:.1f}' for x in result['load_average'])}" + (f"; saved {out}" if out else "")
    )
    if args.against:
        print(
            f"the same job watched on {args.against}'s dashboard: {result['old_watched_steps_per_s']:.1f} steps/s; "
            f"new/old {result['ratio_watched_new_vs_old']:.2f} (median of the per-round ratios)"
        )


if __name__ == "__main__":
    main()
