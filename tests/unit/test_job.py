"""The live retraining job: snapshots, pause/resume/stop, the NaN guard, determinism, isolation of
two jobs at once, and what ends up in the run store."""

import hashlib
import math
import statistics
import time

import pytest
import torch

from attn_core import checkpoint, zoo
from attn_core.retraining.job import TrainingJob
from attn_core.runs import RunStore
from attn_core.tasks import get_task
from attn_core.training.config import JobConfig
from attn_core.training.slots import JobSlots
from tests.conftest import make_tiny_model

TASK = get_task("reverse")


@pytest.fixture
def tiny(tmp_path):
    card = {"task": "reverse", "train": {"batch_size": 16}}
    return str(checkpoint.save(make_tiny_model(n_layers=2), tmp_path / "tiny", card))


def job_cfg(source, **kw) -> JobConfig:
    base = dict(
        regularizers={"entropy": 0.1, "vocab_topk": 0.1},
        steps=20,
        lr=3e-3,
        device="cpu",
        telemetry_every=5,
        spectrum_every=10,
        eval_every=10,
        eval_samples=32,
        probe_samples=8,
        measure_samples=64,
    )
    return JobConfig(source, **{**base, **kw})


def wait_for(pred, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_job_runs_in_a_thread_and_is_saved(tiny):
    store = RunStore()
    job = TrainingJob.open(job_cfg(tiny), store=store)
    assert job.snapshot().status == "pending"
    job.start()
    assert job.join(120)
    snap = job.snapshot()
    assert snap.status == "completed" and snap.step == 20 and snap.done and snap.message == "completed 20 steps"
    log = snap.metrics()
    names = set(log["name"])
    assert {
        "loss",
        "task_loss",
        "accuracy",
        "lr",
        "grad_norm",
        "term:entropy",
        "term:vocab_topk",
        "eval_accuracy",
        "entropy_data",
        "top1_data",
        "entropy_data:L1H0",
        "top1_data:L0H1",
        "sigma:L0H0:0",
        "stable_rank:L1H1",
    } <= names
    assert sorted(log[log["name"] == "entropy_data"]["step"]) == [0, 5, 10, 15, 20]
    assert sorted(log[log["name"] == "sigma:L0H0:0"]["step"]) == [0, 10, 20]
    assert not any(n.startswith("entropy_vocab") for n in names)  # measured before and after only
    # nobody watched: no pattern left the device; a finished run's pattern is computed on request
    assert snap.probe_pattern is None and snap.probe_head is None and len(snap.probe_tokens) == TASK.n_ctx
    assert job.pattern(1, 0).shape == (TASK.n_ctx, TASK.n_ctx)
    for m in (snap.before, snap.after):
        assert {"accuracy", "loss", "entropy_data", "entropy_vocab", "top1_mass", "stable_rank"} <= set(m)
    # the same log is in the store, and the run loads as a model
    stored = store.metrics(snap.run_id)
    assert len(stored) == len(log)
    run = store.get(snap.run_id)
    assert (
        run["status"] == "completed"
        and run["parent"] == tiny
        and run["summary"]["after"]["accuracy"] == snap.after["accuracy"]
    )
    loaded = store.load_model(snap.run_id)
    assert loaded.name == f"run:{snap.run_id}" and loaded.card.task == "reverse"
    assert loaded.card.details["regularizers"][0]["name"] == "entropy" and loaded.card.parent == tiny
    for k, v in loaded.model.state_dict().items():
        assert torch.equal(v, job.weights()[k])


def test_snapshot_is_cheap_to_read_while_training(tiny):
    job = TrainingJob.open(job_cfg(tiny, steps=150), store=False).start()
    times = []
    while not job.join(0.002):
        t = time.perf_counter()
        snap = job.snapshot()
        _ = (snap.step, snap.status, snap.latest.get("loss"))
        times.append(time.perf_counter() - t)
    assert len(times) >= 5
    assert statistics.median(times) < 1e-3


def test_pause_resume_and_stop(tiny):
    job = TrainingJob.open(job_cfg(tiny, steps=100_000), store=RunStore()).start()
    assert wait_for(lambda: job.snapshot().step >= 3)
    job.pause()
    assert wait_for(lambda: job.snapshot().status == "paused")
    frozen = job.snapshot().step
    assert "paused at step" in job.snapshot().message
    time.sleep(0.3)
    assert job.snapshot().step == frozen
    job.resume()
    assert wait_for(lambda: job.snapshot().step > frozen)
    job.stop()
    assert job.join(60)
    snap = job.snapshot()
    assert snap.status == "stopped" and snap.message.startswith("stopped at step")
    run = RunStore().get(snap.run_id)
    assert run["status"] == "stopped" and run["has_weights"]


def test_stop_while_paused(tiny):
    job = TrainingJob.open(job_cfg(tiny, steps=100_000), store=False).start()
    assert wait_for(lambda: job.snapshot().step >= 1)
    job.pause()
    assert wait_for(lambda: job.snapshot().status == "paused")
    job.stop()
    assert job.join(60) and job.snapshot().status == "stopped"


def test_diverging_lr_keeps_the_last_good_weights(tiny):
    job = TrainingJob.open(job_cfg(tiny, lr=10.0, steps=200, warmup_steps=0), store=RunStore())
    res = job.run()
    assert res["status"] == "diverged"
    assert res["message"].startswith("diverged at step") and "kept weights of step" in res["message"]
    run = RunStore().get(res["run_id"])
    assert run["status"] == "diverged" and run["message"] == res["message"] and run["has_weights"]
    model = RunStore().load_model(res["run_id"]).model  # loading also checks every tensor is finite
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert math.isfinite(res["after"]["loss"])


def test_deterministic_under_a_seed(tiny):
    a = TrainingJob.open(job_cfg(tiny, seed=4), store=False).run()
    b = TrainingJob.open(job_cfg(tiny, seed=4), store=False).start()
    b.join(120)
    assert a["after"] == b.result()["after"]
    c = TrainingJob.open(job_cfg(tiny, seed=5), store=False).run()
    assert c["after"]["loss"] != a["after"]["loss"]


def test_two_jobs_at_once_never_share_state(tiny):
    store = RunStore()
    slots = JobSlots(limit=lambda: 3)  # all three train at once (a server's line would queue them)
    jobs = [TrainingJob.open(job_cfg(tiny, seed=s, steps=30), store=store, slots=slots) for s in (1, 1, 2)]
    params = [{p.data_ptr() for p in j.model.parameters()} for j in jobs]
    assert not (params[0] & params[1]) and not (params[0] & params[2])
    for j in jobs:
        j.start()
    for j in jobs:
        assert j.join(180)
    res = [j.result() for j in jobs]
    assert all(r["status"] == "completed" for r in res)
    assert len({r["run_id"] for r in res}) == 3
    # same seed, run concurrently: bit-identical; another seed: different
    assert res[0]["after"] == res[1]["after"]
    assert res[0]["after"] != res[2]["after"]
    logs = [store.metrics(r["run_id"]) for r in res]
    assert logs[0].equals(logs[1]) and not logs[0].equals(logs[2])
    alone = TrainingJob.open(job_cfg(tiny, seed=1, steps=30), store=False).run()
    assert alone["after"] == res[0]["after"]


def test_fine_tune_a_run_and_train_from_scratch(tiny):
    store = RunStore()
    first = TrainingJob.open(job_cfg(tiny, steps=5), store=store).run()
    second = TrainingJob.open(job_cfg(f"run:{first['run_id']}", steps=5, entmax_alpha=2.0), store=store).run()
    assert second["status"] == "completed"
    assert store.get(second["run_id"])["parent"] == f"run:{first['run_id']}"
    assert store.load_model(second["run_id"]).config.entmax_alpha == 2.0
    # the parent's attention was softmax: the 'before' of the sparsemax run is measured with sparsemax
    assert second["before"]["entropy_data"] < first["after"]["entropy_data"]
    scratch = TrainingJob.open(job_cfg("scratch:reverse-1l", steps=3, regularizers={}), store=store).run()
    assert scratch["status"] == "completed" and store.get(scratch["run_id"])["parent"] == "scratch:reverse-1l"


def test_model_copy_is_independent(tiny):
    job = TrainingJob.open(job_cfg(tiny, steps=3), store=False)
    job.run()
    copy = job.model_copy()
    with torch.no_grad():
        next(copy.parameters()).add_(1.0)
    assert not torch.equal(next(copy.parameters()), next(job.model.parameters()).cpu())
    with pytest.raises(RuntimeError, match="already been started"):
        job.start()


def test_shipped_zoo_files_are_never_modified():
    folder = zoo.locate("reverse-1l")

    def digest():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}

    before = digest()
    res = TrainingJob.open(
        JobConfig("reverse-1l", {"entropy": 0.1}, steps=3, device="cpu", measure_samples=32, eval_samples=32),
        store=RunStore(),
    ).run()
    assert res["status"] == "completed"
    assert digest() == before
    assert RunStore().path(res["run_id"]).is_dir()


def test_sync_every_leaves_the_run_and_its_snapshots_unchanged(tiny):
    """Reading the device every 7 steps (telemetry every 5, spectra every 10): snapshots still arrive,
    every step is logged, telemetry lands on its steps, and the run is the same bit for bit."""
    eager = TrainingJob.open(job_cfg(tiny, seed=3), store=False).run()
    job = TrainingJob.open(job_cfg(tiny, seed=3, sync_every=7), store=False)
    assert job.trainer.sync_every == 7
    steps_seen = []
    job.trainer.callbacks.append(lambda m: steps_seen.append(job.snapshot().step))
    res = job.run()
    snap = job.snapshot()
    assert res["status"] == "completed" and snap.step == 20 and res["after"] == eager["after"]
    log = snap.metrics()
    assert sorted(log[log["name"] == "task_loss"]["step"]) == list(range(1, 21))
    assert sorted(log[log["name"] == "entropy_data"]["step"]) == [0, 5, 10, 15, 20]
    assert sorted(log[log["name"] == "sigma:L0H0:0"]["step"]) == [0, 10, 20]
    assert len(set(steps_seen)) > 3  # published along the way, not only at the end
    assert "--sync-every 7" in job.cfg.command()


def test_a_nan_with_sync_every_ends_diverged_with_finite_weights(tiny):
    job = TrainingJob.open(job_cfg(tiny, lr=10.0, steps=200, warmup_steps=0, sync_every=6), store=RunStore())
    res = job.run()
    assert res["status"] == "diverged" and "kept weights of step" in res["message"]
    model = RunStore().load_model(res["run_id"]).model
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert math.isfinite(res["after"]["loss"])


def test_bf16_job_on_cpu(tiny):
    res = TrainingJob.open(job_cfg(tiny, precision="bf16", steps=10), store=False).run()
    ref = TrainingJob.open(job_cfg(tiny, steps=10), store=False).run()
    assert res["status"] == "completed" and math.isfinite(res["after"]["loss"])
    assert res["after"]["loss"] == pytest.approx(ref["after"]["loss"], rel=0.05)


def test_the_preview_is_what_a_run_logs_at_step_0_with_no_trainer(tiny, monkeypatch):
    from attn_core.retraining.job import preview
    from attn_core.sources import resolve
    from attn_core.training import trainer as trainer_module

    cfg = job_cfg(tiny, steps=2, telemetry_every=1, spectrum_every=1, entmax_alpha=1.5)
    job = TrainingJob.open(cfg, store=False)
    job.run()
    run0 = job.snapshot().metrics().query("step == 0").set_index("name")["value"]
    made = []
    monkeypatch.setattr(trainer_module.Trainer, "__init__", lambda *a, **k: made.append(a))  # none may be made
    loaded = resolve(tiny)
    snap = preview(cfg, loaded.model)
    seen = snap.metrics().set_index("name")["value"]
    assert made == [] and snap.status == "pending" and snap.step == 0
    assert sorted(seen.index) == sorted(run0.index)
    assert torch.allclose(torch.tensor(seen[run0.index].values), torch.tensor(run0.values), rtol=1e-5, atol=1e-6)
    assert snap.probe_pattern.shape[:2] == (2, 2) and snap.probe_tokens == job.snapshot().probe_tokens
    assert loaded.model.cfg.entmax_alpha != 1.5  # the caller's model is measured as the run's, not changed
