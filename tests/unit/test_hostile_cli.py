"""Hostile input through the real command line (``python -m attn_core`` subprocesses): sizes and
seeds beyond the limits, FIFOs and devices as models, broken cards and configs, a card that names
a file outside its folder, weights that overflow. Each ends with exit code 2, one line
``error: ...`` on stderr (its last line), no traceback, and with ``--json`` the error as a JSON
object on stdout."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attn_core import checkpoint
from attn_core.sources import resolve

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # a FIFO read by mistake would block for ever: the test fails instead of hanging
HUGE = str(2**70)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attn_core", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=TIMEOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    """A folder of hostile models (ATTN_LAB_MODELS points here) and a FIFO."""
    root = tmp_path_factory.mktemp("hostile")
    models = root / "models"
    good = resolve("reverse-1l")

    def save(name, card=None):
        return checkpoint.save(good.model, models / name, card={"task": "reverse"} if card is None else card)

    (root / "secret.json").write_text(json.dumps({"SECRET_KEY": 1}))
    card = save("vocab-out", card={}) / "card.json"
    card.write_text(json.dumps({"vocab_file": str(root / "secret.json")}))
    (save("deep-card") / "card.json").write_text("[" * 100_000 + "]" * 100_000)
    (save("task-list") / "card.json").write_text(json.dumps({"task": ["reverse"], "metrics": 3}))
    big = resolve("reverse-1l").model
    big.embed.W_E.data.fill_(1e30)
    checkpoint.save(big, models / "huge", card={"task": "reverse"})
    os.mkfifo(root / "fifo.safetensors")
    return root


CASES = [
    (["eval", "reverse-1l", "--samples", "1000000000"], "--samples must be at most 1,000,000", "limit"),
    (["kernels", "induction-2l", "--features", "10000000"], "--features must be at most 65,536", "limit"),
    (["heads", "reverse-1l", "--samples", "10000000"], "--samples must be at most 1,000,000", "limit"),
    (["kernels-bench", "--max-n", "1000000000"], "--max-n must be at most 65,536", "limit"),
    (["kernels-bench", "--threads", "1000000"], "--threads must be at most", "limit"),
    (["circuits", "induction-2l", "--samples", "100000000"], "--samples must be at most 10,000", "limit"),
    (["retrain", "reverse-1l", "--steps", str(10**12)], "steps must be at most 10,000,000", "invalid"),
    (["retrain", "reverse-1l", "--batch-size", "0", "--steps", "1"], "batch_size must be 1..65536", "invalid"),
    (["train", "--preset", "reverse-1l", "--seed", HUGE, "--steps", "1"], "seed must be an integer in 0..", "invalid"),
    (["scores", "reverse-1l", "--random-seed", HUGE], "--random-seed must be an integer in 0..", "invalid"),
    (["heads", "reverse-1l", "--seed", HUGE], "--seed must be an integer in 0..", "invalid"),
    (["kernels", "induction-2l", "--seed", HUGE], "--seed must be an integer in 0..", "invalid"),
    (["scores", ""], "no model given", "model"),
    (["scores", "/dev/zero"], "/dev/zero is not a regular file", "model"),
    (["spectrum", "{root}/fifo.safetensors"], "fifo.safetensors is not a regular file", "model"),
    (["scores", "deep-card"], "card.json is nested more than 64 levels deep", "model"),
    (["heads", "task-list"], "'task' must be a task name (a string), not a list", "model"),
    (["scores", "vocab-out"], "leads outside the model folder", "model"),
    (["spectrum", "huge"], "holds values up to 1e+30", "model"),
    (["scores", "reverse-1l", "--tokens", " ".join(["zz"] * 43_000)], "43000 tokens exceed", "invalid"),
    (["scores", "reverse-1l", "--layer", "x"], "Invalid value for '--layer'", "usage"),
    (["no-such-command"], "No such command", "usage"),
]


@pytest.mark.parametrize("args, message, kind", CASES, ids=[" ".join(c[0])[:40] for c in CASES])
def test_hostile_input_is_one_line_and_a_json_error(hostile, args, message, kind):
    args = [a.format(root=hostile) for a in args]
    proc = cli(*args, "--json", env={"ATTN_LAB_MODELS": str(hostile / "models")})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "SECRET" not in proc.stderr + proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last and len(last) < 500, proc.stderr
    assert json.loads(proc.stdout) == {"error": last.removeprefix("error: "), "kind": kind}


def test_without_json_stdout_is_empty_and_stderr_one_line(hostile):
    proc = cli("scores", "deep-card", env={"ATTN_LAB_MODELS": str(hostile / "models")})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "nested more than" in proc.stderr


def test_zoo_skips_bad_folders_with_one_warning_line_each(hostile):
    proc = cli("zoo", "--json", env={"ATTN_LAB_MODELS": str(hostile / "models")})
    assert proc.returncode == 0, proc.stderr
    names = {m["name"] for m in json.loads(proc.stdout)}
    assert {"reverse-1l", "vocab-out", "huge"} <= names and not names & {"deep-card", "task-list"}
    warnings = proc.stderr.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("warning: skipped model folder") for w in warnings)
    assert any("deep-card" in w for w in warnings) and any("task-list" in w for w in warnings)
