"""The README and the manual (docs/, built by mkdocs) stay true by themselves: the site builds with
``--strict`` (a broken link, or an API reference to a name that no longer exists, fails it); the
README is a front page of at most 200 lines with a picture of the dashboard on its first screen;
every image a page names exists and every dashboard page has its screenshot in the tour; every
block marked ``<!-- runnable -->`` runs; no user-facing text speaks of issue numbers."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from navigation import PAGES

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES_MD = [README, *sorted(DOCS.glob("*.md"))]
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
RUNNABLE = re.compile(r"<!-- runnable -->\n```(python|bash)\n(.*?)```", re.S)


def env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1")


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
    reason="mkdocs and mkdocstrings are not installed (pip install -r requirements-dev.txt)",
)
def test_the_manual_builds_with_strict(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    cli = (tmp_path / "cli.html").read_text()
    assert "attn-lab retrain" in cli and "--json" in cli  # generated from the typer app
    api = (tmp_path / "api.html").read_text()
    assert "run_with_cache" in api and "retrain" in api  # generated from the docstrings
    assert "benchmarks/results/cli_startup.json" in (tmp_path / "results.html").read_text()  # the results index
    for page in ("getting-started", "dashboard", "python", "api", "cli", "models", "training", "ray", "gpu"):
        assert (tmp_path / f"{page}.html").exists(), page
    for page in ("limits", "results", "architecture", "maths"):
        assert (tmp_path / f"{page}.html").exists(), page
    assert "fonts.googleapis" not in (tmp_path / "index.html").read_text()  # offline: no web fonts


def test_the_readme_is_a_front_page_with_a_picture_on_its_first_screen():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"
    first = IMAGE.findall("\n".join(lines[:25]))
    assert first and (ROOT / first[0]).is_file(), "no picture of the dashboard in the README's first 25 lines"


@pytest.mark.parametrize("page", PAGES_MD, ids=lambda p: p.name)
def test_every_image_a_page_names_exists(page):
    missing = [src for src in IMAGE.findall(page.read_text()) if not (page.parent / src).is_file()]
    assert not missing, f"{page.name} names missing images {missing}"


def test_every_dashboard_page_has_its_screenshot_in_the_tour():
    tour = (DOCS / "dashboard.md").read_text()
    for entry in PAGES:
        name = entry.screenshot.name
        assert entry.screenshot.is_file(), f"{name} is missing: python scripts/screenshots.py"
        assert f"(images/{name})" in tour, f"docs/dashboard.md does not show {name}"
        assert f"{{#{entry.anchor}}}\n\n{entry.intro}\n" in tour, (
            f"the tour's {entry.title} section is not the page's intro"
        )


def runnable_blocks() -> list:
    """Per page: its runnable Python blocks as one program, in order (a page's later blocks use
    what its earlier ones made, as in a notebook), and each runnable shell block on its own."""
    blocks = []
    for page in PAGES_MD:
        found = RUNNABLE.findall(page.read_text())
        python = [code for lang, code in found if lang == "python"]
        if python:
            blocks.append(pytest.param("python", "\n".join(python), id=f"{page.name}-python"))
        for i, code in enumerate(code for lang, code in found if lang == "bash"):
            blocks.append(pytest.param("bash", code, id=f"{page.name}-bash-{i}"))
    return blocks


def test_there_are_runnable_blocks():
    langs = {p.values[0] for p in runnable_blocks()}
    assert langs == {"python", "bash"}


@pytest.mark.parametrize("lang,code", runnable_blocks())
def test_a_runnable_block_runs(lang, code, tmp_path):
    if lang == "python":
        cmd = [sys.executable, "-c", code]
    else:  # attn-lab is this checkout's, whatever the installed script points at
        cmd = ["bash", "-euo", "pipefail", "-c", code.replace("attn-lab ", f"{sys.executable} -m attn_core ")]
    r = subprocess.run(
        cmd, cwd=tmp_path, env=dict(env(), ATTN_LAB_RUNS=str(tmp_path / "runs")), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]


USER_FACING = [README, *DOCS.glob("*.md"), ROOT / "app.py", ROOT / "navigation.py"]
USER_FACING += [p for d in ("attn_core", "ui", "app_pages") for p in (ROOT / d).rglob("*.py")]
HISTORY = re.compile(
    r"\bissues? #?\d+|\bissue's\b|in (this|the) session'?s? ?(device )?time|not measured in this", re.I
)


def test_no_user_facing_text_speaks_of_issue_numbers_or_session_history():
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for p in USER_FACING
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, "\n".join(found)
