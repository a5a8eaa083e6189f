"""The CLI's manners: help and root usage errors without torch or pandas (lazy command modules),
help wrapped by whole words at any terminal width, Ctrl-C while torch loads (a real process, a
real SIGINT) ends with exit 130 and one line, and progress as plain lines when stderr is not a
terminal. Timings live in benchmarks/cli_startup.py, not here."""

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attn_core import cli
from attn_core.progress import Progress
from attn_core.training.interrupt import SIGINT_EXIT

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def imported_by(*args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    """The modules ``python -m attn_core ARGS`` imports (from ``-X importtime``)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "attn_core", *args], capture_output=True, text=True, env=ENV
    )
    names = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return names, proc


@pytest.mark.parametrize("args", [["--help"], [], ["sepctrum"], ["--jsn"], ["spectrum", "--help"]])
def test_help_and_root_usage_errors_import_neither_torch_nor_pandas(args):
    names, proc = imported_by(*args)
    assert "torch" not in names and "pandas" not in names, proc.stderr[-500:]
    assert "Traceback" not in proc.stderr
    if args == ["sepctrum"]:
        assert proc.returncode == 2 and "error: No such command 'sepctrum'" in proc.stderr
    if args == ["--help"]:
        assert proc.returncode == 0 and "spectrum" in proc.stdout


_EVERY_HELP = """
import sys
from typer.testing import CliRunner
from attn_core import cli
runner = CliRunner()
for name in cli.command_table():
    words = name.split()
    for args, code in ((["--help"], 0), (["--no-such-option"], 2)):
        result = runner.invoke(cli.app, [*words, *args])
        assert result.exit_code == code, (name, args, result.exit_code, result.output[-300:])
        assert code == 2 or "Usage:" in result.output, (name, result.output[-300:])
heavy = sorted(m for m in ("torch", "pandas", "numpy") if m in sys.modules)
print("heavy:", ",".join(heavy) or "none")
"""


def test_every_commands_help_and_usage_errors_import_neither_torch_nor_pandas():
    """Each command's module reads its option defaults from the config dataclasses, which import no
    torch (attn_core.lazy): one process renders every command's --help and a mistyped option of each
    and has loaded neither torch nor pandas (benchmarks/cli_startup.py times them)."""
    proc = subprocess.run([sys.executable, "-c", _EVERY_HELP], capture_output=True, text=True, env=ENV, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "heavy: none", proc.stdout
    assert len(cli.command_table()) >= 20


def test_every_command_is_listed_with_its_whole_first_sentence():
    table = cli.command_table()
    out = CliRunner().invoke(cli.app, ["--help"], env={"COLUMNS": "200"}).output
    flat = " ".join(out.split())
    for name, (_, _, text) in table.items():
        assert re.search(rf"^  {re.escape(name)} ", out, re.M), name
        assert " ".join(cli._first_sentence(text).split()) in flat, name
    assert "..." not in out.split("\n", 1)[1]  # no description cut short (the usage line has its own)
    # the table is read from the source: it is what the real commands are
    loaded = {name for name in table if cli.LazyGroup.get_command(None, None, name) is not None}
    assert loaded == set(table) and {"zoo", "train", "retrain", "runs", "sweeps", "export-hf"} <= loaded


def _paragraphs(doc: str) -> list[str]:
    return [" ".join(p.split()) for p in doc.split("\n\n") if p.strip()]


def _chunks(line: str) -> list[str]:
    """A wrapped line's pieces as the word wrapper (textwrap's, which click uses) sees them."""
    return [c for c in textwrap.TextWrapper()._split(line.strip()) if c.strip()]


def filled_lines(lines: list[str], para: str, limit: int) -> bool:
    """Whether ``para`` is printed in consecutive ``lines``, broken only where the next piece
    would not have fitted in ``limit`` columns (a whole paragraph wrapped, never a line break
    copied from the docstring's source)."""
    target = re.sub(r"\s+", "", para)
    for start, line in enumerate(lines):
        if not target.startswith(re.sub(r"\s+", "", line)) or not line.strip():
            continue
        got, end = "", start
        while end < len(lines) and len(got) < len(target):
            got += re.sub(r"\s+", "", lines[end])
            end += 1
        if got != target:
            continue
        return all(len(lines[j]) + 1 + len(_chunks(lines[j + 1])[0]) > limit for j in range(start, end - 1))
    return False


@pytest.mark.parametrize("columns", [40, 60, 100])
def test_help_wraps_by_whole_words_at_the_terminal_width(columns):
    """Every help screen fits the terminal, and each paragraph of a command's docstring is
    wrapped as a whole (the old help broke lines where the docstring's source did)."""
    width = max(cli.MIN_WIDTH, min(cli.MAX_WIDTH, columns - 1))
    runner = CliRunner()
    screens = {"": runner.invoke(cli.app, ["--help"], env={"COLUMNS": str(columns)}).output}
    for name in cli.command_table():
        screens[name] = runner.invoke(cli.app, [name, "--help"], env={"COLUMNS": str(columns)}).output
    for name, out in screens.items():
        assert out.startswith("Usage: "), (name, out[:200])
        lines = out.splitlines()
        assert all(len(line) <= width for line in lines), (name, [line for line in lines if len(line) > width])
        if name:
            cmd = cli.LazyGroup.get_command(None, None, name)
            for para in _paragraphs(cmd.help or ""):
                assert filled_lines(lines, para, width - 2), (name, para, out)


def test_ctrl_c_while_torch_loads_exits_130_with_one_line():
    """A real SIGINT sent while the process is inside `import torch` (its shared library is
    mapped, the Python part of the import still running)."""
    for as_json in (False, True):
        proc = subprocess.Popen(
            [sys.executable, "-m", "attn_core", "spectrum", "induction-2l", *(["--json"] if as_json else [])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            maps = Path(f"/proc/{proc.pid}/maps")
            deadline = time.monotonic() + 120
            while proc.poll() is None and "libtorch" not in maps.read_text() and time.monotonic() < deadline:
                time.sleep(0.002)
            assert proc.poll() is None, "the command ended before torch was loaded"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == SIGINT_EXIT, err
        assert err == "interrupted\n", err
        assert out == ('{"error": "interrupted", "kind": "interrupted"}\n' if as_json else "")


# --- progress ---------------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_line_every_tenth_when_not_a_terminal():
    out = io.StringIO()
    with Progress(300, "retrain m", unit="step", stream=out) as bar:
        for n in range(1, 301):
            bar.set(n, note="loss=0.1" if n % 50 == 0 else None)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [re.match(r"retrain m: +(\d+)%", line).group(1) for line in lines] == [str(p) for p in range(0, 101, 10)]
    assert lines[-1].startswith("retrain m: 100% (300/300 steps") and lines[-1].endswith("loss=0.1")


def test_progress_stopped_early_says_where():
    out = io.StringIO()
    bar = Progress(1000, "train copy", stream=out)
    bar.set(123)
    bar.close()
    bar.close()
    assert out.getvalue().splitlines()[-1].startswith("train copy:  12% (123/1000 steps")


def test_progress_on_a_terminal_is_a_bar():
    out = _Terminal()
    with Progress(50, "train copy", stream=out) as bar:
        for _ in range(50):
            bar.update()
    assert "\r" in out.getvalue() and "50/50" in out.getvalue()


def test_training_progress_piped_to_a_log_is_a_few_lines(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "attn_core", "train", "--preset", "copy-1l", "--steps", "60", "--out", tmp_path / "m"],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("train copy:")]
    assert len(lines) == 11 and lines[-1].startswith("train copy: 100% (60/60 steps")
