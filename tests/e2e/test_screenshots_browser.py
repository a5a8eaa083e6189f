"""scripts/screenshots.py, which makes the manual's and the home page's pictures of the dashboard,
runs in its quick mode: one page of the real dashboard in headless Chromium, written as a small PNG
under the name the manual uses."""

import subprocess
import sys
from pathlib import Path

import pytest

import navigation
from benchmarks.dashboard import CHROMIUM

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]


def test_the_screenshot_script_draws_a_page_in_its_quick_mode(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "screenshots.py"), "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    shot = tmp_path / navigation.page("Heatmaps").screenshot.name
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 5_000 < shot.stat().st_size < 400_000
    assert [p.name for p in tmp_path.iterdir()] == [shot.name]


def test_an_unknown_page_is_one_sentence_naming_the_option():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "screenshots.py"), "--page", "Nowhere"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--page 'Nowhere' is not a page title" in r.stderr
