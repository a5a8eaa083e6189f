"""`attn-lab retrain`, `attn-lab runs` and `attn-lab runs show`, run as a user runs them."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from attn_core import checkpoint
from attn_core.cli import app
from tests.conftest import make_tiny_model

KEYS = {"accuracy", "loss", "entropy_data", "entropy_vocab", "top1_mass", "stable_rank"}


def run(*args, ok=True):
    proc = subprocess.run(
        [sys.executable, "-m", "attn_core", *args], capture_output=True, text=True, timeout=300, env=os.environ.copy()
    )
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture
def tiny(tmp_path):
    return str(checkpoint.save(make_tiny_model(n_layers=2), tmp_path / "tiny", {"task": "reverse"}))


def test_retrain_then_list_and_show(tiny):
    out = json.loads(
        run(
            "retrain",
            tiny,
            "--reg",
            "entropy=0.1",
            "--reg",
            "vocab_entropy@L1=0.05",
            "--steps",
            "6",
            "--seed",
            "2",
            "--lr",
            "0.002",
            "--entmax-alpha",
            "1.5",
            "--device",
            "cpu",
            "--json",
        ).stdout
    )
    assert out["status"] == "completed" and out["steps"] == 6
    assert set(out["before"]) == KEYS and set(out["after"]) == KEYS
    assert all(0 <= out[w]["entropy_data"] <= 1 for w in ("before", "after"))

    rows = json.loads(run("runs", "--json").stdout)
    assert [r["id"] for r in rows] == [out["run_id"]]
    row = rows[0]
    assert row["status"] == "completed" and row["parent"] == tiny and row["task"] == "reverse"
    assert row["regularizers"] == "entropy=0.1, vocab_entropy@L1=0.05" and row["entmax_alpha"] == 1.5

    shown = json.loads(run("runs", "show", out["run_id"], "--json").stdout)
    assert shown["id"] == out["run_id"] and shown["summary"]["after"] == out["after"]
    assert shown["card"]["entmax_alpha"] == 1.5 and shown["card"]["seed"] == 2
    assert shown["card"]["command"].startswith(f"attn-lab retrain {tiny} --reg entropy=0.1")
    assert {"loss", "task_loss", "term:entropy", "entropy_data"} <= set(shown["final"])
    assert "metrics" not in shown
    full = json.loads(run("runs", "show", out["run_id"], "--metrics", "--json").stdout)
    assert {"step", "name", "value"} == set(full["metrics"][0])

    human = run("runs").stdout
    assert out["run_id"] in human and "completed" in human


def test_diverging_lr_ends_as_diverged(tiny):
    out = json.loads(
        run("retrain", tiny, "--reg", "entropy=1", "--steps", "200", "--lr", "10", "--device", "cpu", "--json").stdout
    )
    assert out["status"] == "diverged"
    assert out["message"].startswith("diverged at step") and "kept weights of step" in out["message"]
    shown = json.loads(run("runs", "show", out["run_id"], "--json").stdout)
    assert shown["status"] == "diverged" and shown["has_weights"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--reg", "entropy=-0.1"], "strength (lambda) of 'entropy' must be a finite number >= 0"),
        (["--reg", "entropi=0.1"], "unknown regularizer 'entropi'"),
        (["--reg", "entropy@L4=0.1"], "layer L4 is out of range"),
        (["--reg", "entropy=0.1", "--heads", "L0H9"], "head L0H9 is out of range"),
        (["--steps", "0"], "steps must be a positive integer"),
        (["--entmax-alpha", "0.5"], "entmax_alpha must be in [1, 2]"),
    ],
)
def test_bad_input_gives_one_clear_line(tiny, args, message):
    # in-process (the command's own parsing and error path; one subprocess above covers the entry point)
    res = CliRunner().invoke(app, ["retrain", tiny, *args, "--json"])
    assert res.exit_code == 2 and json.loads(res.stdout)["error"] in res.stderr  # --json: the error as JSON too
    # the message is the last line (a library may warn before it), and it is one line
    assert message in res.stderr.strip().splitlines()[-1] and "Traceback" not in res.stderr


def test_unknown_model_and_run():
    res = CliRunner().invoke(app, ["retrain", "no-such-model", "--json"])
    assert res.exit_code == 2 and "no model named 'no-such-model'" in res.stderr
    res = CliRunner().invoke(app, ["runs", "show", "nope", "--json"])
    assert res.exit_code == 2 and "no run 'nope'" in res.stderr
    res = CliRunner().invoke(app, ["runs", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout) == []


def test_runs_show_prints_settings_as_wrapped_key_value_words(tmp_path, monkeypatch):
    """The human ``runs show`` gives each set setting as key=value, wrapped at 100 columns (not
    the raw settings dict on one line of some 900 characters); --json keeps them all."""
    from attn_core.runs import ENV_RUNS, RunStore
    from attn_core.training.config import JobConfig

    monkeypatch.setenv(ENV_RUNS, str(tmp_path / "runs"))
    config = JobConfig(source="induction-2l", regularizers=["entropy=0.1", "vocab_entropy@L1=0.05"]).to_dict()
    run_id = RunStore().add_run("induction-2l", "induction", config, "completed", model=make_tiny_model())
    res = CliRunner().invoke(app, ["runs", "show", run_id])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("settings: "))
    settings = [lines[start]] + [line for line in lines[start + 1 :] if line.startswith("  ")]
    text = " ".join(settings)
    assert "{" not in text and "'" not in text and all(len(line) <= 100 for line in settings), settings
    assert "steps=300" in text and "regularizers=entropy=0.1,vocab_entropy@L1=0.05" in text
    assert "text=" not in text  # unset: left out
    shown = CliRunner().invoke(app, ["runs", "show", run_id, "--json"])
    assert json.loads(shown.stdout)["config"]["text"] is None
