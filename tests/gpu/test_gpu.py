"""Training on CUDA (issue 15), skipped without a CUDA GPU: ``pytest -m gpu tests/gpu``.

- a short retrain on CUDA matches the same run on CPU: held-out loss within 2% (relative),
  accuracy within 0.02, data entropy within 0.01, every weight within 1e-2 (absolute) after 30
  AdamW steps; the two devices differ only in float rounding (no TF32: matmuls stay fp32), which
  Adam's normalisation amplifies a little;
- the live job publishes snapshots while it trains on CUDA, with the model on the GPU;
- a diverging run on CUDA ends "diverged" with finite weights, and a NaN injected at step k is
  caught by the next sync point (sync_every 25 on CUDA) with the weights of the last one;
- every training command runs with --device cuda, and bf16 autocast trains.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attn_core.runs import RunStore
from attn_core.sources import resolve
from attn_core.tasks import get_task
from attn_core.training.config import JobConfig, TrainConfig
from attn_core.training.device import SYNC_EVERY_CUDA
from attn_core.training.job import TrainingJob
from attn_core.training.record import record_run
from attn_core.training.trainer import Trainer
from tests.conftest import make_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "reverse-1l"


def retrain(device: str) -> TrainingJob:
    job = TrainingJob(
        JobConfig(MODEL, {"entropy": 0.1}, steps=30, seed=2, device=device, measure_samples=256, eval_samples=64),
        store=False,
    )
    job.run()
    return job


def test_a_short_retrain_on_cuda_matches_cpu():
    cpu, gpu = retrain("cpu"), retrain("cuda")
    assert gpu.device.type == "cuda" and next(gpu.model.parameters()).is_cuda
    assert gpu.trainer.sync_every == SYNC_EVERY_CUDA
    a, b = cpu.result(), gpu.result()
    assert a["status"] == b["status"] == "completed" and a["steps"] == b["steps"] == 30
    assert b["after"]["loss"] == pytest.approx(a["after"]["loss"], rel=0.02, abs=1e-4)
    assert b["after"]["accuracy"] == pytest.approx(a["after"]["accuracy"], abs=0.02)
    assert b["after"]["entropy_data"] == pytest.approx(a["after"]["entropy_data"], abs=0.01)
    wa, wb = cpu.weights(), gpu.weights()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-2
    # every step was logged on both devices
    la, lb = (j.snapshot().metrics(["task_loss"]) for j in (cpu, gpu))
    assert list(la["step"]) == list(lb["step"]) == list(range(1, 31))


def test_the_live_job_publishes_snapshots_on_cuda():
    job = TrainingJob(JobConfig(MODEL, {"entropy": 0.1}, steps=400, device="cuda", measure_samples=64), store=False)
    job.start()
    steps = set()
    while not job.join(0.005):
        snap = job.snapshot()
        if snap.status == "running":
            steps.add(snap.step)
    snap = job.snapshot()
    assert snap.status == "completed" and snap.step == 400
    assert len(steps) >= 3 and any(0 < s < 400 for s in steps)  # progress arrived before the end
    assert snap.probe_pattern.shape[:2] == (1, 2) and snap.steps_per_s > 0
    assert str(job.device).startswith("cuda") and "task_loss" in snap.latest


def test_a_diverging_run_on_cuda_ends_diverged():
    res = TrainingJob(
        JobConfig(MODEL, steps=200, lr=10.0, warmup_steps=0, device="cuda", measure_samples=64), store=RunStore()
    ).run()
    assert res["status"] == "diverged" and "kept weights of step" in res["message"]
    model = RunStore().load_model(res["run_id"]).model
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert math.isfinite(res["after"]["loss"])


def test_a_nan_on_cuda_is_caught_by_the_next_sync_point():
    calls = [0]

    def nan_at_30(model, batch, cache):
        calls[0] += 1
        return {"bad": model.embed.W_E.sum() * 0 + (math.nan if calls[0] == 30 else 0.0)}

    task = get_task("reverse")
    t = Trainer(
        make_tiny_model(), task, TrainConfig(steps=200, batch_size=16, eval_every=100, device="cuda"), penalty=nan_at_30
    )
    out = record_run(t)
    assert out.status == "diverged" and out.reason.startswith("diverged at step 30: loss is nan")
    assert out.message.endswith(f"kept weights of step {SYNC_EVERY_CUDA - 1}")  # the sync point at step 25
    assert calls[0] == 2 * SYNC_EVERY_CUDA  # caught at the sync point of step 50
    assert all(torch.isfinite(p).all() for p in t.params)


def test_bf16_on_cuda_trains():
    task = get_task("reverse")
    out = {}
    for precision in ("fp32", "bf16"):
        t = Trainer(
            make_tiny_model(),
            task,
            TrainConfig(steps=60, batch_size=32, eval_every=60, eval_samples=64, device="cuda", precision=precision),
        )
        out[precision] = t.run()
    assert math.isfinite(out["bf16"]["eval_loss"])
    assert out["bf16"]["eval_loss"] == pytest.approx(out["fp32"]["eval_loss"], rel=0.05)


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--preset", "reverse-1l", "--steps", "20"],
        ["retrain", MODEL, "--reg", "entropy=0.1", "--steps", "20"],
        ["retrain", MODEL, "--steps", "20", "--precision", "bf16"],
        ["compare-qk", "--steps", "20", "--seeds", "1", "--d-qk", "2", "--merged", "merged", "--no-store"],
        ["grow", "induction-2l", "--add", "1", "--steps", "5"],
    ],
    ids=["train", "retrain", "retrain-bf16", "compare-qk", "grow"],
)
def test_every_training_command_runs_on_cuda(args, tmp_path):
    env = {**os.environ, "ATTN_LAB_RUNS": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "attn_core", *args, "--device", "cuda", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    if args[0] == "retrain":
        assert doc["status"] == "completed"
    if args[0] == "train":
        assert doc["device"].startswith("cuda")


def test_resolve_then_train_on_cuda_keeps_the_source_on_cpu():
    loaded = resolve(MODEL)
    job = TrainingJob(JobConfig(MODEL, steps=3, device="cuda", measure_samples=32), store=False)
    job.run()
    assert all(not p.is_cuda for p in loaded.model.parameters())
    assert all(not t.is_cuda for t in job.weights().values())
