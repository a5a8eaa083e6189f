"""Screenshots of every dashboard page for the manual and the home page, taken from the real
dashboard: `streamlit run app.py` on a free local port, driven by headless Chromium (Playwright),
the helpers of benchmarks/dashboard.py.

    python scripts/screenshots.py                  # every page of navigation.PAGES into docs/images/
    python scripts/screenshots.py --quick          # one page (Heatmaps) into a temporary folder
    python scripts/screenshots.py --page Spectrum --out /tmp/shots

Each page opens on induction-2l at a 1280 x 1400 viewport, except Retrain: it is shown after a
short run of reverse-1l, its live curves drawn. The PNG is reduced to 256 colours (Pillow) to keep
the repository small. A page's file is its ``PageEntry.screenshot`` name (docs/dashboard.md shows
them, the home page shows them small; tests/unit/test_docs.py checks that every image a page names
exists).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.dashboard import launch, new_page, serve, settle, start_live_retrain  # noqa: E402
from navigation import PAGES, PageEntry  # noqa: E402

IMAGES = ROOT / "docs" / "images"
VIEWPORT = {"width": 1280, "height": 1400}
MODEL = "induction-2l"
RETRAIN_STEPS = 150  # the Retrain page is shown after a short run, its curves and spectra drawn
RETRAIN_HEIGHT = 2400


def shrink(path: Path) -> None:
    """Rewrite the PNG at ``path`` with a palette of 256 colours."""
    from PIL import Image

    with Image.open(path) as img:
        small = img.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def shoot(browser, url: str, page_entry: PageEntry, out: Path) -> Path:
    """Open ``page_entry`` on the zoo model in a new session, wait until it has settled, and write
    its screenshot into ``out``."""
    context = browser.new_context(viewport=VIEWPORT)
    page = new_page(context)
    if page_entry.title == "Retrain":
        from playwright.sync_api import expect

        main = start_live_retrain(page, url, RETRAIN_STEPS, timeout_ms=120_000)  # on reverse-1l
        expect(main.get_by_role("button", name="Stop")).to_be_disabled(timeout=600_000)  # the run has ended
        page.set_viewport_size({"width": VIEWPORT["width"], "height": RETRAIN_HEIGHT})  # the curves below the form
        settle(page, timeout_ms=180_000, script_done=False)
    else:
        page.goto(f"{url}/{page_entry.url_path}?model={MODEL}")
        settle(page, timeout_ms=180_000)
    page.wait_for_timeout(500)  # plotly's last relayout
    path = out / page_entry.screenshot.name
    page.screenshot(path=str(path))
    context.close()
    shrink(path)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one page (Heatmaps) into a temporary folder")
    parser.add_argument("--page", action="append", help="a page title (repeatable); default every page")
    parser.add_argument("--out", type=Path, help=f"folder of the images (default {IMAGES.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    titles = {p.title: p for p in PAGES}
    wanted = args.page or (["Heatmaps"] if args.quick else list(titles))
    unknown = [t for t in wanted if t not in titles]
    if unknown:
        parser.error(f"--page {unknown[0]!r} is not a page title; the titles are {', '.join(titles)}")
    out = args.out or (Path(tempfile.mkdtemp(prefix="attn-lab-shots-")) if args.quick else IMAGES)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="attn-lab-shots-runs-") as runs:
        with serve(Path(runs)) as url, sync_playwright() as pw:
            browser = launch(pw)
            try:
                for title in wanted:
                    path = shoot(browser, url, titles[title], out)
                    print(f"{title}: {path} ({path.stat().st_size // 1024} KiB)", flush=True)
            finally:
                browser.close()


if __name__ == "__main__":
    main()
