"""Signals and the text commands' manners, on real processes (issue 31): Ctrl-C at many moments of
start-up ends with exit 130 and the one line ``interrupted`` (never a traceback, a hang or a
swallowed interrupt); SIGTERM and SIGHUP stop and save a run as Ctrl-C does (``retrain``:
tests/unit/test_run_faults.py) and end ``train`` in one line; ``--json`` keeps progress and the
estimated duration on stderr; a tokenizer without its unknown token, a lone surrogate, whitespace
and a full disk are bad input (exit 2, one line, nothing left)."""

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attn_core import checkpoint
from attn_core.cli import app
from attn_core.model import ModelConfig
from attn_core.text.task import default_batch
from attn_core.training.estimate import CPU_STEP_FLOPS, run_seconds, step_flops
from tests.conftest import make_tiny_model, write_tiny_hf
from tests.text_corpus import make_text, write_word_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny(tmp_path):
    card = {"task": "reverse", "train": {"batch_size": 8}}
    return str(checkpoint.save(make_tiny_model(), tmp_path / "tiny", card))


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A tiny Llama folder with a word-level tokenizer.json, and text in its words."""
    root = tmp_path_factory.mktemp("imported")
    write_tiny_hf(root / "model", "llama")
    write_word_tokenizer(root / "model")
    (root / "text.txt").write_text(make_text(0, lines=150))
    return root


def start(*args, env=None, fsize=None) -> subprocess.Popen:
    """``python -m attn_core ARGS`` as a user starts it from a shell (SIGINT, SIGTERM and SIGHUP at
    their defaults, whatever the test runner ignores; a write past ``fsize`` bytes fails with EFBIG,
    as on a full disk)."""

    def child():
        for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(stop, signal.SIG_DFL)
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.Popen(
        [sys.executable, "-m", "attn_core", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        preexec_fn=child,
    )


def handles_sigterm(pid: int) -> bool:
    """Whether the process has installed its own SIGTERM handler (attn_core.__main__'s first lines)."""
    try:
        caught = next(
            line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigCgt")
        )
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


# --- start-up ---------------------------------------------------------------------------------------


@pytest.mark.timeout(3600)
def test_a_signal_at_any_moment_of_start_up_ends_in_one_line(tiny, tmp_path):
    """From the moment the entry point runs (its handlers installed) through typer, the command
    module, torch, the model and the first steps: SIGINT at each of these delays ends with 130,
    SIGTERM with 143 and SIGHUP with 129, one line (``interrupted``, or the run's stop), never a
    traceback, an "unexpected" error or a hang. The delays pick moments, and the claim holds at
    any moment, so a loaded machine only moves them: the test waits for the handlers (never
    signalling a process that has none yet) and for the end, with bounds a hang alone reaches."""
    env = {"ATTN_LAB_RUNS": str(tmp_path / "runs")}
    cases = [(signal.SIGINT, d) for d in (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 2.0, 3.0)]
    cases += [(signal.SIGTERM, 0.05), (signal.SIGHUP, 0.3)]
    for sig, delay in cases:
        proc = start("retrain", tiny, "--steps", 1_000_000, env=env)
        try:
            deadline = time.monotonic() + 600
            while not handles_sigterm(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            assert handles_sigterm(proc.pid), ("no handler installed", proc.poll(), proc.communicate()[1][-600:])
            time.sleep(delay)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=600)
        finally:
            proc.kill()
        said = (sig, delay, proc.returncode, err[-600:])
        assert proc.returncode == 128 + sig, said
        assert "Traceback" not in err and "unexpected" not in err and "KeyboardInterrupt" not in err, said
        last = err.strip().splitlines()[-1]
        # the run's stop: "interrupted ...", "... nothing was saved", or the stopped run's report (on stdout)
        assert last.startswith("interrupted") or "nothing was saved" in last or "stopped" in err + out, said


def test_the_status_a_signal_decided_holds_through_the_interpreters_end(tmp_path):
    """A process that a signal ended exits with 128 + the signal even when the interpreter's end
    would say otherwise: here a ``KeyboardInterrupt`` that left code run by ``PyRun_SimpleString``
    (as Ray's C extension runs code), which the interpreter notes as unhandled; a ``python -m``
    process (as ``attn-lab`` is) then ends by killing itself with SIGINT: -2, the one line
    ``interrupted`` printed and the exit status 130 lost."""
    (tmp_path / "ended_by_a_signal.py").write_text(
        "import ctypes, os, signal, sys\n"
        "from attn_core.training import interrupt\n"
        "guard = interrupt.CliSignals(process=True).install()\n"
        "interrupt.command_started()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    while True:\n"
        "        signal.pause()\n"
        "except KeyboardInterrupt:\n"
        "    pass\n"
        "ctypes.pythonapi.PyRun_SimpleString(b'raise KeyboardInterrupt')\n"
        "guard.line()\n"
        "guard.code, guard.phase = interrupt.exit_code(guard.signum), 'exit'\n"
        "sys.exit(guard.code)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "ended_by_a_signal"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.returncode == 130 and proc.stderr.endswith("interrupted\n"), (proc.returncode, proc.stderr)


@pytest.mark.parametrize("how", ["stops", "ends"])
def test_a_signal_lost_inside_a_callback_still_stops_the_command_without_a_traceback(how):
    """A signal whose KeyboardInterrupt is raised inside a callback (here a weakref's; in the
    report, importlib's module-lock callback while the command's modules loaded), where Python only
    reports it ("Exception ignored in ... Traceback ... KeyboardInterrupt") and goes on: the report
    is not printed, and the command's stop request, made next, is already set (the retrain used to
    start training and was ended by the grace period)."""
    code = (
        "import os, signal, sys, weakref\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from attn_core.training import interrupt\n"
        "guard = interrupt.CliSignals(process=True).install()\n"
        "interrupt.command_started()\n"
        "class Thing:\n"
        "    pass\n"
        "thing = Thing()\n"
        "ref = weakref.ref(thing, lambda r: os.kill(os.getpid(), signal.SIGINT) or [0 for _ in range(1000)])\n"
        "del thing\n"
        + (
            "with interrupt.sigint_stops(exiting=True) as request:\n"
            "    print('asked', request.is_set(), flush=True)\n"
            "guard.code, guard.phase = request.code, 'exit'\n"
            "sys.exit(guard.code)\n"
            if how == "stops"
            else "with interrupt.exit_on_ctrl_c('nothing was saved'):\n    print('asked', False, flush=True)\n"
        )
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.returncode == 130, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    if how == "stops":  # a command that stops and saves (retrain, sweep): its request starts set
        assert proc.stdout == "asked True\n" and "Ctrl-C: stopping after the current step" in proc.stderr
    else:  # one that cannot stop half-way (train, grow): it ends at once, in its one line
        assert proc.stdout == "" and proc.stderr.endswith("interrupted by Ctrl-C; nothing was saved\n")


@pytest.fixture
def sigint_heard():
    """SIGINT handled as an interactive shell leaves it: a suite started in the background (``cmd &``
    in a script) inherits SIGINT ignored, and ``sigint_stops`` rightly leaves an ignored signal alone."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_stop_signal_inside_a_write_to_stderr_still_stops_and_says_so(capfd, sigint_heard):
    """A stop signal whose handler runs inside a write to stderr (a write blocked on a full pipe
    runs handlers; printing again there is Python's "reentrant call" RuntimeError): the stop is
    asked, its line still written, and no exception reaches the interrupted code (it ended the
    command, and with it the run, instead of stopping it)."""
    from attn_core.training.interrupt import sigint_stops

    def inside_a_write(text: str) -> None:
        raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

    with sigint_stops(notice=inside_a_write) as request:
        signal.raise_signal(signal.SIGINT)
        assert request.is_set() and request.signum == signal.SIGINT
    assert "Ctrl-C: stopping after the current step and saving what was trained so far" in capfd.readouterr().err


def test_sigterm_ends_train_in_one_line_and_writes_nothing(tmp_path):
    out_dir = tmp_path / "out"
    proc = start("train", "--preset", "induction-2l", "--steps", 1_000_000, "--out", out_dir, "--json")
    try:
        seen = ""
        while "steps," not in seen:  # progress on stderr, with --json
            line = proc.stderr.readline()
            assert line, seen
            seen += line
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == f"interrupted by SIGTERM; nothing was saved ({out_dir} was not written)"
    assert not out_dir.exists() and out == ""


# --- --json keeps progress on stderr; the estimate ------------------------------------------------------


def test_json_keeps_progress_and_the_estimate_on_stderr(imported, tmp_path):
    proc = start(
        "retrain",
        imported / "model",
        "--text",
        imported / "text.txt",
        "--block",
        12,
        "--steps",
        3,
        "--json",
        env={"ATTN_LAB_RUNS": str(tmp_path / "runs")},
    )
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    doc = json.loads(out)  # stdout is one JSON document
    assert doc["status"] == "completed"
    assert "tokenizing: 100%" in err and "retrain " in err and "100% (3/3 steps" in err
    assert "estimated duration: " in err and f"3 steps of {doc['batch_size']} x 12 tokens" in err


def test_the_cpu_default_batch_fits_a_step_budget_and_the_estimate_adds_up():
    """A 1.3M-parameter model at block 256: on the CPU the default batch takes at most
    CPU_STEP_FLOPS a step (it was 64 blocks, about 30 s a step under load), on a GPU the memory
    rule alone; the estimate is steps x step + evaluations + measurement."""
    cfg = ModelConfig(d_model=128, n_layers=4, n_heads=4, d_head=32, d_mlp=512, d_vocab=1000, n_ctx=512)
    cpu, gpu = default_batch(cfg, 256, device="cpu"), default_batch(cfg, 256, device="cuda")
    assert gpu == 64 and 1 <= cpu < gpu and cpu & (cpu - 1) == 0
    assert cpu * step_flops(cfg, 256) <= CPU_STEP_FLOPS < 2 * cpu * step_flops(cfg, 256)
    e = run_seconds(cfg, steps=500, batch=cpu, block=256, eval_every=100)
    assert e["total_s"] == pytest.approx(e["train_s"] + e["measure_s"]) and e["train_s"] > 500 * e["step_s"] > 0


# --- bad input is exit 2 ------------------------------------------------------------------------------------


def _tokenizer(folder: Path, **changes) -> None:
    data = json.loads((folder / "tokenizer.json").read_text())
    for key, value in changes.items():
        data[key] = {**data[key], **value}
    (folder / "tokenizer.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda d: (_tokenizer(d / "model", model={"unk_token": "[UNK]"}), (d / "t.txt").write_text("w1 nope w2")),
            r"tokenizer.json: tokenizing .*t.txt failed \(WordLevel error: Missing \[UNK\] token",
        ),
        (lambda d: (d / "t.jsonl").write_text('{"text": "w1 \\ud800"}\n'), "holds a lone surrogate"),
        (lambda d: (d / "t.txt").write_text(" \n \t\n"), "holds only whitespace: there is no text to tokenize"),
    ],
    ids=["tokenizer-without-its-unknown-token", "lone-surrogate", "whitespace"],
)
def test_bad_text_is_exit_2_in_one_line(imported, tmp_path, monkeypatch, make, message):
    import shutil

    d = tmp_path / "d"
    shutil.copytree(imported / "model", d / "model")
    make(d)
    text = next(p for p in d.iterdir() if p.name.startswith("t."))
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    res = CliRunner().invoke(app, ["retrain", str(d / "model"), "--text", str(text), "--steps", "1", "--json"])
    assert res.exit_code == 2, res.output
    doc = json.loads(res.stdout)
    assert doc["kind"] == "invalid" and __import__("re").search(message, doc["error"]), doc
    assert res.stderr.strip().splitlines()[-1] == f"error: {doc['error']}"


@pytest.mark.parametrize("what", ["export-hf", "export"])
def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, what):
    """RLIMIT_FSIZE makes writes past 20 KB fail (EFBIG, as ENOSPC on a full disk)."""
    dest = tmp_path / ("hf" if what == "export-hf" else "scores.html")
    args = ["--out", dest] if what == "export-hf" else ["--figure", "scores", "--out", dest]
    proc = start(what, "induction-2l", *args, "--json", fsize=20_000)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert json.loads(out) == {"error": f"{dest}: File too large; nothing was written", "kind": "file"}
    assert sorted(os.listdir(tmp_path)) == []  # no partial file, no temporary one
