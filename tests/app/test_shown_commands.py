"""Every command the dashboard shows runs as shown. The commands are read from the pages
themselves (code blocks, and `attn-lab ...` in captions and notes), never copied into the test:
the Home page's zoo cards are run for real in a fresh folder until training has begun (every
check passed), then Ctrl-C, which saves nothing; the retrain, runs and compare-qk
commands of the other pages run too, and the sweep's is parsed by the CLI with its model
resolved (a sweep starts Ray). The old Home card said `attn-lab train ... --out
assets/models/copy-1l`, a folder that exists, so it failed as shown. The QK page says what its
saved results are: shipped files, whose runs are not in a fresh store."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attn_core import cli, sources
from attn_core.presets import PRESETS
from attn_core.runs import RunStore

ROOT = Path(__file__).resolve().parents[2]
INLINE = re.compile(r"`(attn-lab [^`]+)`")


def page(name: str, model: str = "reverse-1l") -> AppTest:
    at = AppTest.from_file(str(ROOT / "app_pages" / name), default_timeout=120)
    at.query_params["model"] = model
    at.run()
    assert not at.exception, at.exception
    return at


def shown(at: AppTest) -> tuple[list[str], list[str]]:
    """(code blocks, inline `attn-lab ...` commands) of a page as the user sees them."""
    blocks = [c.value for c in at.code]
    texts = [e.value for kind in ("markdown", "caption", "info", "warning", "success") for e in at.get(kind)]
    inline = [m.replace("\\_", "_") for t in texts for m in INLINE.findall(t)]
    return blocks, inline


def argv(command: str) -> list[str]:
    """A shown command as a process's argv (its `attn-lab` run as `python -m attn_core`)."""
    words = shlex.split(command, comments=True)
    assert words[0] == "attn-lab", command
    return [sys.executable, "-m", "attn_core", *words[1:]]


def start(command: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        argv(command),
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def until_training(proc: subprocess.Popen, timeout: float = 240) -> str:
    """Read stderr until the first progress line (training has begun: every check passed)."""
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        if re.match(r"[\w -]+: +\d+% \(", line):
            return seen
    out, err = proc.communicate(timeout=60)
    raise AssertionError(f"no progress line; exit {proc.returncode}: {seen + err}")


def parses(command: str) -> None:
    """The CLI accepts the command's options, and its model NAME (if it takes one) resolves."""
    words = shlex.split(command, comments=True)[1:]
    cmd = cli.LazyGroup.get_command(None, None, words[0])
    ctx = cmd.make_context(words[0], words[1:])  # a UsageError if an option or argument is wrong
    if "name" in ctx.params:
        sources.resolve(ctx.params["name"])


def test_the_home_cards_commands_run_as_shown(tmp_path):
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    assert not at.exception
    blocks, _ = shown(at)
    presets = {shlex.split(b, comments=True)[3]: b for b in blocks}
    assert set(presets) == {m for m in presets if m in PRESETS} and len(presets) >= 6  # one per zoo card
    here = tmp_path / "cwd"  # where the commands run (tmp_path/runs is the test's run store, which the app opens)
    here.mkdir()
    procs = {name: start(command, here) for name, command in presets.items()}
    try:
        for name, proc in procs.items():
            until_training(proc)  # its checks passed (the old --out folder existed: it failed here)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 130 and "nothing was saved" in err, (name, err[-500:])
    finally:
        for proc in procs.values():
            proc.kill()
    assert not any(here.iterdir())  # shown without --out: nothing is written where it runs


@pytest.mark.parametrize("name", ["4_Runs.py", "10_Sweeps.py"])
def test_the_empty_stores_commands_name_the_picked_model_and_run(name, tmp_path):
    at = page(name, model="reverse-1l")
    _, inline = shown(at)
    commands = [c for c in inline if c.split()[1] in ("retrain", "sweep")]
    assert commands, inline
    for command in commands:
        assert "MODEL" not in command and " reverse-1l " in command
        parses(command)
        if command.split()[1] == "retrain":  # runs as shown; Ctrl-C saves the run as stopped
            proc = start(command, tmp_path)
            try:
                until_training(proc)
                proc.send_signal(signal.SIGINT)
                proc.communicate(timeout=120)
            finally:
                proc.kill()
            assert proc.returncode == 130
            assert [r["status"] for r in RunStore().list_runs()] == ["stopped"]


def test_the_qk_page_says_what_its_saved_results_are_and_its_commands_run(tmp_path):
    at = AppTest.from_file(str(ROOT / "app_pages" / "8_Merged_vs_factored_QK.py"), default_timeout=120).run()
    assert not at.exception
    text = " ".join(c.value for c in at.caption)
    assert "saved results shipped with attn-lab in `experiments/results/merged_vs_factored.json`" in text
    assert "none of them is in your run store" in text  # a fresh store has none of them
    assert not re.search(r"\d+ runs are in the run store", text)  # the old claim
    _, inline = shown(at)
    assert "attn-lab compare-qk --task induction --steps 400 --seeds 5" in inline
    for command in dict.fromkeys(inline):
        parses(command)
        proc = start(command, tmp_path)
        try:
            if command.split()[1] == "compare-qk":
                until_training(proc)
                proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=240)
        finally:
            proc.kill()
        assert proc.returncode in (0, 130) and "Traceback" not in err, (command, err[-500:])
