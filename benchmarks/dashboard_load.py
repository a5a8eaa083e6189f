"""The dashboard under load: N simulated users moving sliders while retrains run, against one
real `streamlit run app.py` on loopback, in headless Chromium (one browser, one context per user).

    nice python benchmarks/dashboard_load.py [--users 1 5 10 20] [--moves 6] [--retrains 2] [--out FILE]
    python benchmarks/dashboard_load.py --quick     # one user, a few moves, one retrain; saves nothing

For each N (a fresh server each time, data in a temporary folder, ``ATTN_LAB_RUNS``): the
retrains are started on the Retrain page (reverse-1l, its default job, many steps) and watched
live in their own browser session; then N users open the dashboard at once, each on the Heatmaps
page (induction-2l; the query slider moves one position) and then on the Edit and compare page
(induction-2l, head L0H3; the "Rank R kept" slider moves one mode), each user's moves a random
walk of its own (seeded), half of the users starting on
each page. A user's think time between moves is 0.3..1.2 s (seeded). Measured:

- latency: from the slider's key press to the chart that slider drives changed in the page (the
  scores heatmap's outlined row; the modes chart's bars), median and p95 over every move;
- errors: moves whose chart did not change within ``--move-timeout`` seconds, and pages that
  showed a Python exception;
- server CPU: the Streamlit process's CPU seconds while the users are on (/proc/pid/stat), in
  all and per move (the users' page visits included, and the retrains, which train in a thread
  of the server): the work a move costs the server, which other processes on the machine slow
  down but do not add to;
- memory per session: the Streamlit process's peak resident memory while the users are on (VmRSS
  of /proc, sampled every 0.25 s), less what it was before they came (the retrains running and the
  model loaded by one earlier visit of both pages), divided by N; the retrain workers' memory
  apart.

``--against OLD`` serves another checkout's dashboard (the same benchmark code) after or
before this one at each N, the order alternating, and saves its levels beside these.

``--profile DIR`` records the server with py-spy while the users move (``DIR/profile_N.txt``,
py-spy's collapsed stacks, one file per N).

Everything is bounded: each N has a deadline (``--budget`` s), every wait its own timeout, and the
server, its workers and the browser are stopped in ``finally``. The table is printed; a full run
saves JSON (default benchmarks/results/dashboard_load.json) and, with ``--png``, draws the curve
(:func:`attn_core.figures.load.load_curve_plot`) into that PNG. ``--draw A.json B.json --png P``
draws saved runs (before and after a change) as one figure, measuring nothing:

    python benchmarks/dashboard_load.py --draw benchmarks/results/dashboard_load_before.json \
        benchmarks/results/dashboard_load.json --png docs/images/dashboard-load.png
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import record  # noqa: E402
from benchmarks.dashboard import CHROMIUM, CHROMIUM_FLAGS, VIEWPORT, serve  # noqa: E402

MODEL = "induction-2l"
PAGES = {
    # page -> (URL, the slider's label, the key of the chart it drives)
    "Heatmaps": (f"Heatmaps?model={MODEL}&layer=1&head=0", "Query position i", "chart_scores"),
    "Edit and compare": (f"Edit_and_compare?model={MODEL}", "Rank R kept", "chart_edit_modes"),
}
# What a chart shows, as one string: its traces' data and its shapes (the outlined row) and title.
_SIGNATURE = """(key) => { const g = document.querySelector('.st-key-' + key + ' .js-plotly-plot');
    if (!g || !g.data || !g.querySelector('.main-svg')) return null;
    const part = (v) => (v && v.length !== undefined && typeof v !== 'string') ? Array.from(v) : v;
    return JSON.stringify([g.data.map(t => [part(t.z), part(t.x), part(t.y)]), (g.layout || {}).shapes,
                           ((g.layout || {}).title || {}).text]); }"""
_IDLE = """() => document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state') === 'notRunning'
    && !document.querySelector('[data-testid="stSkeleton"], .st-key-page_rest_pending')"""
_EXCEPTION = "[data-testid='stException']"


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``, linear between the closest ranks."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _processes() -> dict[int, tuple[int, str]]:
    """Every process now: pid -> (parent pid, command line), from /proc."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                out[int(d.name)] = (ppid, (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return out


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, their children...)."""
    table, found, todo = _processes(), [], [pid]
    while todo:
        parent = todo.pop()
        kids = [p for p, (pp, _) in table.items() if pp == parent]
        found += kids
        todo += kids
    return found


def server_process() -> int:
    """The pid of the `streamlit run` this process started (a child of this process)."""
    for pid, (ppid, cmd) in _processes().items():
        if ppid == os.getpid() and "streamlit" in cmd:
            return pid
    raise RuntimeError("the streamlit server is not a child of this process")


def rss_mib(pid: int) -> float:
    """Resident memory of one process in MiB (VmRSS of /proc/pid/status; 0 once it is gone)."""
    with contextlib.suppress(OSError, StopIteration):
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far (/proc/pid/stat; 0 once gone)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


async def _sample_peak(pid: int, peak: list[float]) -> None:
    """Keep ``peak[0]`` at the server's largest resident memory seen, sampled every 0.25 s."""
    while True:
        peak[0] = max(peak[0], rss_mib(pid))
        await asyncio.sleep(0.25)


def stop_tree(pid: int) -> None:
    """Kill the server's descendants (retrain workers) so none outlives it; the server itself is
    stopped by :func:`benchmarks.dashboard.serve`."""
    for p in descendants(pid):
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


async def open_page(context, url: str, page_name: str, timeout_ms: float):
    """A page of ``context`` on ``page_name``, its driven chart drawn and its script run ended."""
    path, _, key = PAGES[page_name]
    page = await context.new_page()
    page.set_default_timeout(timeout_ms)
    await page.goto(f"{url}/{path}")
    await page.wait_for_function(_SIGNATURE, arg=key, timeout=timeout_ms)
    await page.wait_for_function(_IDLE, timeout=timeout_ms)
    if page_name == "Edit and compare":  # the previous-token head L0H3, whose modes all matter
        await page.get_by_role("combobox", name="Head", exact=True).click()
        await page.get_by_role("option", name="3", exact=True).click()
        await page.wait_for_function(
            "(key) => !!document.querySelector('.st-key-' + key + ' .js-plotly-plot')", arg=key, timeout=timeout_ms
        )
        await page.wait_for_function(_IDLE, timeout=timeout_ms)
    return page


async def move(page, page_name: str, key_name: str, timeout_ms: float) -> float:
    """Press ``key_name`` on the page's slider; seconds until its chart changed (then waits for
    the script run to end, untimed, so that the next move starts from a settled page)."""
    _, label, chart = PAGES[page_name]
    slider = page.get_by_role("slider", name=label)
    await slider.focus()
    before = await page.evaluate(_SIGNATURE, chart)
    start = time.perf_counter()
    await slider.press(key_name)
    await page.wait_for_function(
        "([key, before]) => { const s = (" + _SIGNATURE + ")(key); return s !== null && s !== before; }",
        arg=[chart, before],
        timeout=timeout_ms,
        polling="raf",
    )
    elapsed = time.perf_counter() - start
    await page.wait_for_function(_IDLE, timeout=timeout_ms)
    return elapsed


async def step_key(page, page_name: str, rng: random.Random) -> str:
    """A random walk along the slider: left or right at random, inwards at either end."""
    slider = page.get_by_role("slider", name=PAGES[page_name][1])
    now, lo, hi = await slider.evaluate("e => [e.value, e.min, e.max].map(Number)")  # an <input type=range>
    if now >= hi:
        return "ArrowLeft"
    if now <= lo:
        return "ArrowRight"
    return rng.choice(["ArrowLeft", "ArrowRight"])


async def user(browser, url: str, index: int, moves: int, timeout_ms: float, samples: list, errors: list):
    """One simulated user: ``moves`` slider moves on each page (a random walk, seeded by the
    user's index), starting on Heatmaps (even index) or Edit and compare (odd), with a seeded think
    time between moves."""
    rng = random.Random(index)
    context = await browser.new_context(viewport=VIEWPORT)
    try:
        order = list(PAGES) if index % 2 == 0 else list(reversed(PAGES))
        for page_name in order:
            try:
                page = await open_page(context, url, page_name, timeout_ms)
            except Exception as e:  # noqa: BLE001 -- a page that did not come up is an error, counted
                errors.append({"user": index, "page": page_name, "what": f"open: {type(e).__name__}: {str(e)[:300]}"})
                continue
            for _ in range(moves):
                try:
                    key_name = await step_key(page, page_name, rng)
                    s = await move(page, page_name, key_name, timeout_ms)
                    samples.append({"user": index, "page": page_name, "s": s})
                except Exception as e:  # noqa: BLE001 -- a move whose chart never changed: an error
                    errors.append(
                        {"user": index, "page": page_name, "what": f"move: {type(e).__name__}: {str(e)[:300]}"}
                    )
                await asyncio.sleep(rng.uniform(0.3, 1.2))  # think time, not a synchronisation
            if await page.locator(_EXCEPTION).count():
                errors.append({"user": index, "page": page_name, "what": "exception shown"})
            await page.close()
    finally:
        await context.close()


async def start_retrain(browser, url: str, steps: int, timeout_ms: float):
    """A retrain of reverse-1l started on the Retrain page and left watched live in its own
    browser session; returns that context (closed by the caller)."""
    context = await browser.new_context(viewport=VIEWPORT)
    page = await context.new_page()
    page.set_default_timeout(timeout_ms)
    await page.goto(f"{url}/Retrain?model=reverse-1l")
    box = page.get_by_role("spinbutton", name="Steps")
    await box.wait_for()
    await page.get_by_text("Estimated duration").first.wait_for()  # the form's last part: the page has measured
    await page.wait_for_function(_IDLE)
    await box.fill(str(steps))
    await box.press("Enter")
    await page.get_by_text(f"({steps:,} steps of").first.wait_for()  # the page's estimate took the steps
    await page.wait_for_function(_IDLE)
    start = page.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Start")
    await start.click()
    await page.get_by_text(re.compile(rf"running: step \d+ / {steps}")).first.wait_for()
    return context


async def one_level(
    url: str,
    n: int,
    moves: int,
    retrains: int,
    steps: int,
    timeout_ms: float,
    budget: float,
    profile: Path | None = None,
) -> dict:
    """The figures at N = ``n`` users against the server at ``url``; users still moving
    ``budget`` seconds after the start are stopped and counted as errors."""
    started = time.perf_counter()
    from playwright.async_api import async_playwright

    proc = server_process()
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS)
        try:
            watchers = [await start_retrain(browser, url, steps, timeout_ms) for _ in range(retrains)]
            warm = await browser.new_context(viewport=VIEWPORT)  # the model loaded once, as users find it
            for name in PAGES:
                await (await open_page(warm, url, name, timeout_ms)).close()
            await warm.close()
            rss_before, peak = rss_mib(proc), [0.0]
            sampler = asyncio.create_task(_sample_peak(proc, peak))
            spy = None
            if profile is not None:
                profile.mkdir(parents=True, exist_ok=True)
                spy = subprocess.Popen(
                    [
                        "py-spy",
                        "record",
                        "--pid",
                        str(proc),
                        "--format",
                        "raw",
                        "--rate",
                        "50",
                        "--nonblocking",
                        "-o",
                        str(profile / f"profile_{n}.txt"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            samples, errors = [], []
            t0, cpu0 = time.perf_counter(), cpu_s(proc)
            users = [asyncio.create_task(user(browser, url, i, moves, timeout_ms, samples, errors)) for i in range(n)]
            _, late = await asyncio.wait(users, timeout=max(budget - (time.perf_counter() - started), 1.0))
            for task in late:  # over the budget: stopped, and said (the moves made so far are kept)
                task.cancel()
                errors.append({"user": users.index(task), "page": "-", "what": "stopped: over the --budget"})
            await asyncio.gather(*late, return_exceptions=True)
            wall, cpu = time.perf_counter() - t0, cpu_s(proc) - cpu0
            sampler.cancel()
            if spy is not None:  # py-spy writes its file on SIGINT
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
            workers = sum(rss_mib(p) for p in descendants(proc))
            running = 0  # the retrains still training when the users were done (else they ran for part of it)
            for w in watchers:
                running += await w.pages[0].get_by_text("running: step").count() > 0
                await w.close()
        finally:
            await browser.close()
    times = [x["s"] for x in samples]
    by_page = {
        name: {
            "median_s": statistics.median(ts) if ts else None,
            "p95_s": percentile(ts, 0.95) if ts else None,
            "moves": len(ts),
        }
        for name in PAGES
        for ts in [[x["s"] for x in samples if x["page"] == name]]
    }
    return {
        "users": n,
        "moves": len(times),
        "median_s": statistics.median(times) if times else None,
        "p95_s": percentile(times, 0.95) if times else None,
        "by_page": by_page,
        "errors": len(errors),
        "error_list": errors,
        "server_rss_before_mib": rss_before,
        "server_rss_peak_mib": peak[0],
        "rss_per_session_mib": (peak[0] - rss_before) / n,
        "workers_rss_mib": workers,
        "wall_s": wall,
        "server_cpu_s": cpu,
        "server_cpu_per_move_s": cpu / len(times) if times else None,
        "load_average_after": os.getloadavg(),
        "retrains": retrains,
        "retrains_running_at_end": running,
    }


def run_level(n: int, args, root: Path = ROOT) -> dict:
    """One N on a fresh server of checkout ``root``, bounded by ``args.budget`` seconds;
    everything it started stopped."""
    # Every retrain trains while the users move: the server's job queue lets that many run at once
    # (its default is one, and a second retrain would wait in line).
    os.environ["ATTN_LAB_MAX_JOBS"] = str(max(1, args.retrains))
    with tempfile.TemporaryDirectory(prefix="attn-lab-load-") as tmp, serve(Path(tmp) / "runs", root=root) as url:
        proc = server_process()
        try:
            level = one_level(
                url, n, args.moves, args.retrains, args.steps, args.move_timeout * 1000, args.budget, args.profile
            )
            return asyncio.run(asyncio.wait_for(level, timeout=args.budget + 300))  # the users' part stops first
        finally:
            stop_tree(proc)


def print_table(rows: list[dict]) -> None:
    print(
        f"{'N':>3} {'moves':>6} {'median s':>9} {'p95 s':>7} {'errors':>6} {'MiB/session':>11} {'CPU s/move':>10} "
        f"{'wall s':>7}  load"
    )
    for r in rows:
        med = "-" if r["median_s"] is None else f"{r['median_s']:.2f}"
        p95 = "-" if r["p95_s"] is None else f"{r['p95_s']:.2f}"
        print(
            f"{r['users']:>3} {r['moves']:>6} {med:>9} {p95:>7} {r['errors']:>6} {r['rss_per_session_mib']:>11.1f} "
            f"{r.get('server_cpu_per_move_s') or float('nan'):>10.3f} "
            f"{r['wall_s']:>7.1f}  {', '.join(f'{x:.1f}' for x in r['load_average_after'])}"
        )
        if r.get("retrains"):
            print(
                f"      retrains still training at the end: {r.get('retrains_running_at_end', '?')} of {r['retrains']}"
            )
        for e in r["error_list"][:3]:
            print(f"      error: user {e['user']} on {e['page']}: {e['what']}")
        for name, b in r["by_page"].items():
            if b["moves"]:
                print(f"      {name}: median {b['median_s']:.2f} s, p95 {b['p95_s']:.2f} s over {b['moves']} moves")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, nargs="+", default=[1, 5, 10, 20], help="the N to measure, in order")
    ap.add_argument("--moves", type=int, default=6, help="slider moves per user on each page")
    ap.add_argument("--retrains", type=int, default=2, help="retrains running while the users move (0..2)")
    ap.add_argument(
        "--steps",
        type=int,
        default=100_000,
        help="steps of each retrain, at most the page's 100000 (stopped at the end)",
    )
    ap.add_argument("--move-timeout", type=float, default=120.0, help="seconds a move may take before it is an error")
    ap.add_argument("--budget", type=float, default=900.0, help="seconds one N may take in all")
    ap.add_argument("--against", type=Path, default=None, help="another checkout, served and measured alternately")
    ap.add_argument("--against-label", default="", help="what --against is, saved with it")
    ap.add_argument("--label", default="", help="what this run measures (e.g. the checkout), saved with it")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dashboard_load.json")
    ap.add_argument("--profile", type=Path, default=None, help="py-spy the server into this folder")
    ap.add_argument("--png", type=Path, default=None, help="draw the curve into this PNG")
    ap.add_argument(
        "--draw", type=Path, nargs="+", default=None, help="draw saved results (one curve each) into --png; no run"
    )
    ap.add_argument("--quick", action="store_true", help="one user, two moves per page, one retrain; saves nothing")
    args = ap.parse_args(argv)
    if args.draw:
        return draw(args.draw, args.png or ap.error("--draw needs --png, the image to draw"))
    if args.quick:
        args.users, args.moves, args.retrains, args.steps, args.budget = [1], 2, 1, 20_000, 420.0
    bounds = (("--moves", args.moves, 1, 100), ("--retrains", args.retrains, 0, 2), ("--steps", args.steps, 1, 100_000))
    for name, value, lo, hi in bounds:
        if not lo <= value <= hi:
            ap.error(f"{name} takes {lo}..{hi}, not {value}")
    if any(n < 1 or n > 50 for n in args.users):
        ap.error(f"--users takes numbers of users in 1..50, not {args.users}")
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    load_before = os.getloadavg()
    rows, old = [], []
    for i, n in enumerate(args.users):
        order = ["new", "old"] if i % 2 == 0 else ["old", "new"]  # which goes first alternates
        for which in order if args.against else ["new"]:
            row = run_level(n, args, ROOT if which == "new" else args.against)
            (rows if which == "new" else old).append(row)
            if args.against:
                print(f"{which}:")
            print_table([row])
    print()
    print_table(rows)
    if args.against:
        print(f"{args.against}:")
        print_table(old)
    print(f"load average before the run {', '.join(f'{x:.1f}' for x in load_before)} on {os.cpu_count()} CPUs")
    if args.quick:
        return
    result = {"label": args.label, "levels": rows, "load_average_before": load_before, **record.environment()}
    result.update(moves_per_page=args.moves, retrains=args.retrains, model=MODEL)
    if args.against:
        result["against"] = {"label": args.against_label or str(args.against), "levels": old}
    record.save(result, args.out)
    print(f"saved {args.out}")
    if args.png is not None:
        draw([args.out], args.png)


def draw(results: list[Path], png: Path) -> None:
    """The curves of saved results (each file's label names its curve) in one PNG."""
    from attn_core.figures.load import load_curve_plot

    curves = {}
    for path in results:
        saved = json.loads(Path(path).read_text())
        curves[saved.get("label") or Path(path).stem] = saved["levels"]
        if "against" in saved:
            curves[saved["against"]["label"]] = saved["against"]["levels"]
    load_curve_plot(curves).save(png, overwrite=True)
    print(f"drew {png}")


if __name__ == "__main__":
    main()
