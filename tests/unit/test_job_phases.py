"""Where a live job's time goes (issue 34): the job times each part of its run (load, the
before/after measurements, the periodic telemetry and spectra, saving; the steps, the
evaluations and compiling from the trainer), ``attn-lab retrain --json`` reports them as
``phases_s``, and compiling is reported apart from steps/s."""

import json
import math

import pytest
import torch._dynamo

from attn_core.cli import runs as cli_runs
from attn_core.retraining.job import TrainingJob
from attn_core.runs import RunStore
from attn_core.training import step as step_module
from attn_core.training.config import JobConfig

PARTS = {"load", "before", "telemetry", "spectra", "after", "save", "steps", "evaluation", "compile"}


def _job(tmp_path, compile: bool) -> TrainingJob:
    cfg = JobConfig("reverse-1l", steps=6, measure_samples=32, eval_samples=16, compile=compile, device="cpu")
    job = TrainingJob.open(cfg, store=RunStore(tmp_path / "runs"))
    assert job.run()["status"] == "completed"
    return job


def test_an_eager_job_times_every_part_and_compiles_nothing(tmp_path):
    job = _job(tmp_path, compile=False)
    got = job.phase_seconds()
    assert set(got) == PARTS and got["compile"] == 0 and job.snapshot().compile_s == 0
    assert all(v > 0 for k, v in got.items() if k != "compile"), got
    assert got["evaluation"] < got["steps"]  # the evaluations run inside the steps
    snap = job.snapshot()
    assert snap.steps_per_s == pytest.approx(snap.step / snap.train_s)


def test_a_compiled_job_reports_compiling_apart_from_steps_per_s(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(step_module, "BACKEND", "aot_eager")  # dynamo and AOTAutograd without a C++ compile
    torch._dynamo.reset()
    job = _job(tmp_path, compile=True)
    torch._dynamo.reset()
    snap, res = job.snapshot(), job.result()
    assert job.trainer.graph.compiled and 0 < snap.compile_s < snap.train_s
    assert res["compile_s"] == snap.compile_s == job.phase_seconds()["compile"]
    assert snap.steps_per_s == pytest.approx(snap.step / (snap.train_s - snap.compile_s))
    cli_runs._report(res, True, job)  # the CLI's JSON
    doc = json.loads(capsys.readouterr().out)
    assert doc["compile_s"] == snap.compile_s and set(doc["phases_s"]) == PARTS
    assert all(math.isfinite(v) for v in doc["phases_s"].values())
    cli_runs._report(res, False, job)  # and its text
    assert f"compiled in {snap.compile_s:.1f} s (apart from steps/s)" in capsys.readouterr().out
