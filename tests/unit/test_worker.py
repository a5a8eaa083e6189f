"""Live jobs in a worker process (attn_core/training/worker.py), for real: the run a worker trains
is the run a thread trains (bit for bit, at the worker's one torch thread), its snapshots stream while it trains (seen mid-run and
across a pause, in the test of the line), pause/resume/stop reach it, the line of jobs holds it, and nothing is lost when the process that started it goes
away (killed: SIGKILL; or exiting) or when the worker itself dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attn_core import checkpoint
from attn_core.retraining.job import TrainingJob
from attn_core.runs import RunStore
from attn_core.training.config import JobConfig
from attn_core.training.slots import JobSlots
from attn_core.training.worker import PARENT_ENDED
from tests.conftest import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny(tmp_path):
    return str(checkpoint.save(make_tiny_model(), tmp_path / "tiny", {"task": "reverse", "train": {"batch_size": 8}}))


def cfg(source, **kw) -> JobConfig:
    base = dict(
        regularizers={"entropy": 0.1},
        steps=40,
        device="cpu",
        telemetry_every=5,
        spectrum_every=10,
        eval_every=20,
        eval_samples=16,
        probe_samples=4,
        measure_samples=32,
    )
    return JobConfig(source, **{**base, **kw})


def wait_for(pred, timeout=120.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_a_worker_trains_the_run_a_thread_trains(tiny):
    store = RunStore()
    job = TrainingJob.open(cfg(tiny, seed=3), store=store)
    job.watch(0, 1)  # before the worker starts: the worker is told
    job.start(process=True)
    assert job.join(300)
    snap = job.snapshot()
    assert snap.status == "completed" and snap.step == 40 and snap.message == "completed 40 steps"
    assert job.remote.process.returncode == 0 and job.remote.process.pid != os.getpid()
    here = TrainingJob.open(cfg(tiny, seed=3), store=False)
    here.watch(0, 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the worker's one thread: bit for bit holds at the same thread count
    try:
        ref = here.run()
    finally:
        torch.set_num_threads(threads)
    assert job.result()["after"] == ref["after"] and job.result()["before"] == ref["before"]
    log, ref_log = snap.metrics(), here.snapshot().metrics()
    assert log.equals(ref_log)  # every row, in order, the same values
    assert log.equals(store.metrics(snap.run_id))
    weights = job.weights()
    for k, v in here.weights().items():
        assert torch.equal(weights[k], v)
    for k, v in store.load_model(snap.run_id).model.state_dict().items():
        assert torch.equal(v, weights[k])
    # the watched head's pattern came back, the same as the thread's
    assert snap.probe_head == here.snapshot().probe_head == (0, 1) and snap.probe_step == 40
    assert snap.pattern_of(0, 1).shape == (job.task.n_ctx, job.task.n_ctx)
    assert (snap.pattern_of(0, 1) == here.snapshot().pattern_of(0, 1)).all() and snap.pattern_of(1, 1) is None
    assert job.model_copy().cfg == here.model.cfg


def test_the_line_pause_resume_and_stop_reach_a_worker(tiny):
    """A worker job queued behind a job of this process waits (no worker yet), one stopped in the
    line never starts one, and pause, resume and stop reach the worker once it trains."""
    store = RunStore()
    slots = JobSlots(limit=lambda: 1)
    first = TrainingJob.open(cfg(tiny, steps=10**6), store=False, slots=slots).start()  # holds the slot
    job = TrainingJob.open(cfg(tiny, steps=10**6), store=store, slots=slots).start(process=True)
    third = TrainingJob.open(cfg(tiny, steps=5), store=False, slots=slots).start(process=True)
    try:
        assert job.snapshot().status == "queued" and job.snapshot().message.startswith("queued: 1 job ahead")
        third.stop()
        assert third.join(60) and third.snapshot().status == "stopped" and third.remote.process is None
        assert wait_for(lambda: first.snapshot().step > 0) and job.remote.process is None
        first.stop()
        assert first.join(60)
        assert wait_for(lambda: job.snapshot().step >= 3)
        job.pause()
        assert wait_for(lambda: job.snapshot().status == "paused")
        frozen = job.snapshot().step
        time.sleep(0.3)
        assert job.snapshot().step == frozen and "paused at step" in job.snapshot().message
        job.resume()
        assert wait_for(lambda: job.snapshot().step > frozen)
    finally:
        first.stop()
        job.stop()
    assert job.join(120)
    snap = job.snapshot()
    assert snap.status == "stopped" and snap.message.startswith("stopped at step") and PARENT_ENDED not in snap.message
    run = store.get(snap.run_id)
    assert run["status"] == "stopped" and run["has_weights"]
    with pytest.raises(RuntimeError, match="already been started"):
        job.start(process=True)


def test_a_worker_that_dies_ends_its_job_failed(tiny):
    job = TrainingJob.open(cfg(tiny, steps=10**6), store=RunStore()).start(process=True)
    assert wait_for(lambda: job.snapshot().step > 0)
    job.remote.process.kill()
    assert job.join(60)
    snap = job.snapshot()
    assert snap.status == "failed" and f"exit code {-signal.SIGKILL}" in snap.message
    # the run store shows the run of the dead worker failed (its process is gone)
    [run] = RunStore().list_runs()
    assert run["status"] == "failed"


PARENT = """
import sys, time
from attn_core.runs import RunStore
from attn_core.training.config import JobConfig
from attn_core.retraining.job import TrainingJob
job = TrainingJob.open(JobConfig({source!r}, steps=10**6, device="cpu", measure_samples=32), store=RunStore({store!r}))
job.start(process=True)
while job.snapshot().step < 5:
    time.sleep(0.01)
print(job.snapshot().run_id, job.remote.process.pid, flush=True)
{then}
"""


def test_a_worker_whose_parent_goes_away_stops_and_saves(tiny, tmp_path):
    """The process that started a job (a dashboard server, say) is SIGKILLed, or another one
    exits (both at once, to share the start-up time): each worker stops after its step and saves
    the run as stopped, saying why."""
    store = RunStore(tmp_path / "runs")
    parents = {
        how: subprocess.Popen(
            [sys.executable, "-c", PARENT.format(source=tiny, store=str(store.root), then=then)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for how, then in (("killed", "time.sleep(600)"), ("exits", "sys.exit(0)"))
    }
    try:
        started = {how: p.stdout.readline().split() for how, p in parents.items()}
        parents["killed"].kill()
        for how, code in (("killed", -signal.SIGKILL), ("exits", 0)):
            assert parents[how].wait(180) == code, parents[how].stderr.read()
        for _, worker_pid in started.values():
            assert wait_for(lambda pid=int(worker_pid): not _alive(pid), 180)
    finally:
        for p in parents.values():
            p.kill()
    for run_id, _ in started.values():
        run = store.get(run_id)
        assert run["status"] == "stopped" and run["has_weights"], run
        assert run["message"].startswith("stopped at step") and PARENT_ENDED in run["message"]
        loaded = store.load_model(run_id)
        assert loaded.card.status == "stopped" and loaded.card.steps >= 5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (ended, not yet reaped by its parent's parent) counts as ended
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_job_the_retrain_page_starts_in_a_worker_process_builds_no_model_here(tiny, tmp_path, monkeypatch):
    """The Retrain page's path (a job of the server's queue, started in a worker process): this
    process reads the parent's config and task only, and watches and stops the run through the
    handle; the worker builds the model (a Transformer built here would count)."""
    from attn_core.model import Transformer
    from attn_core.training.queue import JobQueue

    built = []
    init = Transformer.__init__

    def counted(self, *args, **kwargs):
        built.append(type(self).__name__)
        init(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "__init__", counted)
    job = TrainingJob.open(cfg(tiny, steps=400), store=RunStore(), slots=JobQueue(tmp_path / "queue"), user="ann")
    job.start(process=True)
    job.watch(0, 1)
    assert wait_for(lambda: job.snapshot().pattern_of(0, 1) is not None)  # the worker's pattern arrives
    job.stop()
    assert job.join(120)
    assert job.status == "stopped", job.snapshot().message
    assert built == [] and not job.built
