"""Retraining on Ray Train workers on CUDA (issue 29), skipped without a CUDA GPU: ``pytest -m gpu
tests/gpu``. The CPU suite runs the same code with gloo CPU workers (tests/unit/test_ray_train.py,
tests/unit/test_distributed.py); here one GPU proves ``--workers 1 --gpus-per-worker 1`` through
Ray Train (NCCL) and the FSDP path on a single rank, and a machine with two GPUs or more trains
on two GPU workers. Each run is compared with the same run in one process on the GPU: a worker
draws its batches on its GPU with the run's seed, as the process does, so the weights agree to
1e-4 (CUDA kernels need not sum in the same order twice)."""

import os

import pytest
import torch

pytest.importorskip("ray", reason="Ray Train is not installed here (the GPU check's wheels leave it out: too large)")

from attn_core.cluster import ray_session  # noqa: E402
from attn_core.retraining.job import TrainingJob  # noqa: E402
from attn_core.runs import RunStore  # noqa: E402
from attn_core.training.config import JobConfig  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]
TOL = 1e-4
SETTINGS = dict(source="reverse-1l", regularizers={"entropy": 0.1}, steps=30, batch_size=32, measure_samples=256)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    os.environ["ATTN_LAB_RUNS"] = str(root)
    with ray_session():  # every GPU of this machine, one Ray for the module
        yield RunStore(root)


def _apart(store: RunStore, a: str, b: str) -> float:
    x, y = store.load_model(a).model.state_dict(), store.load_model(b).model.state_dict()
    return max(float((x[k] - y[k]).abs().max()) for k in x)


@pytest.fixture(scope="module")
def alone(store) -> str:
    job = TrainingJob.open(JobConfig(**SETTINGS, device="cuda"), store=store)
    assert job.run()["status"] == "completed"
    return job.run_id


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_gpu_worker_through_ray_train_trains_the_run_one_process_trains(store, alone, strategy):
    """``--workers 1 --gpus-per-worker 1`` through Ray Train (NCCL), DDP and FSDP: the weights of
    the run one process trains on the GPU, to 1e-4."""
    job = TrainingJob.open(JobConfig(**SETTINGS, workers=1, gpus_per_worker=1, strategy=strategy), store=store)
    res = job.run()
    assert res["status"] == "completed", res["message"]
    card = store.get(res["run_id"])["card"]
    assert card["distributed"] == {**card["distributed"], "workers": 1, "strategy": strategy, "backend": "nccl"}
    assert card["distributed"]["device"] == "cuda"
    assert [w["device"].split(":")[0] for w in job.snapshot().workers] == ["cuda"]
    assert _apart(store, res["run_id"], alone) <= TOL


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gpu_workers_train_the_run_one_process_trains(store, alone, strategy):
    """Two GPU workers (a machine with two GPUs or more), each on its own GPU: the same weights."""
    job = TrainingJob.open(JobConfig(**SETTINGS, workers=2, gpus_per_worker=1, strategy=strategy), store=store)
    res = job.run()
    assert res["status"] == "completed", res["message"]
    assert len({w["device"] for w in job.snapshot().workers}) == 2  # one GPU each
    assert _apart(store, res["run_id"], alone) <= TOL
