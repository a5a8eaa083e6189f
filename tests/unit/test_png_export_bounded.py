"""PNG export when the headless browser cannot start (issue 37, item 17): a browser that exits at
once, or one that starts and never answers (as Chromium did under a memory cap), ends
``attn-lab export --out F.png`` in one line, exit 2, within the export's bound, with no file
written and nothing of the browser left running. Kaleido's own persistent server waited for ever
there. ``BROWSER_PATH`` (read by kaleido's choreographer) points at a stand-in script."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attn_core.cli import app
from attn_core.figures import browser

STAND_INS = {
    "exits": "import sys\nsys.stderr.write('cannot start\\n')\nsys.exit(1)\n",
    "never-answers": "import time\nwhile True:\n    time.sleep(60)\n",
}


def _running(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker``."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def _ended(marker: str, seconds: float = 30.0) -> bool:
    """No live process holds ``marker`` once the kills have landed: SIGKILL is delivered when the
    killed process next runs, and on a loaded machine a grandchild (the browser under
    choreographer's wrapper, which is reaped at once) may still show as running for a moment."""
    deadline = time.monotonic() + seconds
    while _running(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", list(STAND_INS))
def test_png_export_ends_in_one_line_when_the_browser_cannot_start(tmp_path, monkeypatch, how):
    stand_in = tmp_path / f"chromium-{how}"
    stand_in.write_text(f"#!{sys.executable}\n{STAND_INS[how]}")
    stand_in.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(stand_in))
    # the bound only a browser that never answers reaches (one that exits is told at once, however loaded)
    monkeypatch.setenv(browser.EXPORT_ENV, "3" if how == "never-answers" else "600")
    monkeypatch.setattr(browser, "_browser", None)  # a browser another test opened is not this one
    out = tmp_path / "scores.png"
    res = CliRunner().invoke(app, ["export", "induction-2l", "--figure", "scores", "--out", str(out)])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    why = (
        "the headless browser (Chromium) could not start"
        if how == "exits"
        else "the headless browser (Chromium) did not start within 3 s"
    )
    assert lines[0].startswith(f"error: PNG export failed: {why}"), lines[0]
    assert lines[0].endswith("HTML and CSV exports work without a browser (--out FILE.html or FILE.csv)")
    assert not out.exists() and browser._browser is None
    assert _ended(str(stand_in))  # the stand-in (and choreographer's wrapper) were ended


def test_a_browser_started_after_its_open_was_given_up_on_is_ended_too(tmp_path, monkeypatch):
    """Choreographer starts the browser in a thread and keeps the process once the start returns:
    an open cancelled by the bound in between (a loaded machine) left a browser no one kept. Here
    that start runs through the real Kaleido's executor and its process is never kept; ending the
    browser ends it."""
    import kaleido

    stand_in = tmp_path / "chromium-late"
    stand_in.write_text(f"#!{sys.executable}\n{STAND_INS['never-answers']}")
    stand_in.chmod(0o755)
    b = browser.Browser()

    async def made():
        b.kaleido = kaleido.Kaleido(n=1, timeout=5)
        browser._record_spawns(b.kaleido)

    b._run(made(), 30)
    start = b.kaleido._process_executor.submit(subprocess.Popen, [str(stand_in)], start_new_session=True)
    late = start.result(timeout=30)
    assert getattr(b.kaleido, "subprocess", None) is None and late.poll() is None  # started, never kept
    b.end()
    assert late.poll() is not None and _ended(str(stand_in))  # killed and reaped


def test_the_bound_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv(browser.EXPORT_ENV, "2.5")
    assert browser.bound() == 2.5
    for bad in ("0", "-1", "inf", "nan", "soon"):
        monkeypatch.setenv(browser.EXPORT_ENV, bad)
        assert browser.bound() == browser.EXPORT_S
    monkeypatch.delenv(browser.EXPORT_ENV)
    assert browser.bound() == browser.EXPORT_S
    assert os.environ.get(browser.EXPORT_ENV) is None
