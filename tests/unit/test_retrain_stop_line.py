"""A retrain's stop signal says the true thing: before training begins, that the command stops and
then that nothing was saved (never the "saving what was trained" line of a run that trains, which
tests/unit/test_run_faults.py sees on a run stopped while it trains)."""

from __future__ import annotations

import signal

import pytest
from typer.testing import CliRunner

from attn_core import checkpoint
from attn_core.cli import app
from attn_core.cli import text_options as opts
from attn_core.runs import ENV_RUNS, RunStore
from tests.conftest import make_tiny_model


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_RUNS, str(tmp_path / "runs"))
    return str(checkpoint.save(make_tiny_model(), tmp_path / "tiny", {"task": "reverse", "train": {"batch_size": 8}}))


def test_ctrl_c_before_training_began_says_only_that_nothing_was_saved(tiny, tmp_path, monkeypatch):
    def estimate_then_ctrl_c(job):  # the estimate times a few steps: a Ctrl-C lands there
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(opts, "say_estimate", estimate_then_ctrl_c)
    res = CliRunner().invoke(app, ["retrain", tiny, "--steps", "5"])
    assert res.exit_code == 130, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert "Ctrl-C: stopping before training begins" in lines, res.stderr
    assert lines[-1] == "interrupted before training began; nothing was saved", res.stderr
    assert "saving what was trained" not in res.stderr and res.stderr.count("nothing was saved") == 1
    assert RunStore(tmp_path / "runs").list_runs() == []
