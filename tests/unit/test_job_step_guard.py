"""The live job's step costs what the plain loop's costs (issue 34), guarded on the CPU without a
GPU: between two sync points the job's step (its interrupt check, ``Trainer.step`` with the
recipe, the metric log's flush) runs no more ATen ops than the plain loop of
benchmarks/job_vs_loop.py (sample, forward, loss, zero_grad, backward, AdamW) plus 5%, counted
by a ``TorchDispatchMode``, and reads no tensor living on the training device: the steps run on
``meta``, where any such read raises; the first read is the sync point's one copy
(``device.host_read``). Host-side sampling on CPU tensors is fine. An imported Llama on text
(the issue's case) and a zoo model with the every-head entropy penalty."""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attn_core.retraining import job as job_module
from attn_core.retraining.job import TrainingJob
from attn_core.training.config import JobConfig
from tests.conftest import write_tiny_hf
from tests.text_corpus import make_text, write_word_tokenizer

META = torch.device("meta")
SYNC_EVERY = 25  # CUDA's default
COUNTED = 4  # steps counted, after the first (the optimizer's state is made there)
SLACK = 1.05


class Count(TorchDispatchMode):
    """Counts the ATen ops that run under it."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def llama_text(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llama")
    write_tiny_hf(tmp / "llama", "llama", num_key_value_heads=2)
    write_word_tokenizer(tmp / "llama")
    (tmp / "t.txt").write_text(make_text(0, lines=150))
    return dict(source=str(tmp / "llama"), text=str(tmp / "t.txt"), block=16)


def job_on_meta(monkeypatch, settings: dict, penalty: str) -> TrainingJob:
    """A job as the CLI builds it, whose trainer trains on the meta device."""
    trainer = job_module.Trainer
    monkeypatch.setattr(job_module, "Trainer", lambda *a, **k: trainer(*a, **{**k, "device": META}))
    cfg = JobConfig(
        **settings, regularizers=[penalty] if penalty else [], steps=100, batch_size=4, sync_every=SYNC_EVERY,
        telemetry_every=1000, spectrum_every=1000, device="cpu", lr=1e-3,
    )  # fmt: skip
    return TrainingJob.open(cfg, store=False)


def plain_loop(job: TrainingJob, penalty: bool):
    """benchmarks/job_vs_loop.py's plain loop on the job's model, task and device: one step per call."""
    model, task, pen = job.trainer.model, job.task, job.penalty if penalty else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(0)
    batch_size = job.train_cfg.batch_size

    def step():
        batch = task.sample(batch_size, data)
        tokens, targets, mask = (t.to(META) for t in (batch.tokens, batch.targets, batch.mask))
        cache = pen.cache() if pen is not None else None
        logits = model(tokens, cache=cache).flatten(0, 1)
        loss = (
            F.cross_entropy(logits.float(), targets.flatten(), reduction="none") * mask.flatten()
        ).sum() / mask.sum()
        if pen is not None:
            loss = loss + sum(pen(model, None, cache).values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def ops_per_step(step) -> float:
    step()  # the optimizer's state
    with Count() as count:
        for _ in range(COUNTED):
            step()
    return sum(count.ops.values()) / COUNTED


@pytest.mark.parametrize("case", ["llama on text", "zoo, entropy every head"])
def test_the_jobs_step_costs_the_plain_loops_ops_and_reads_nothing_between_sync_points(
    case, monkeypatch, llama_text, tmp_path
):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    settings, penalty = (llama_text, "") if case == "llama on text" else (dict(source="induction-2l"), "entropy=0.01")
    job = job_on_meta(monkeypatch, settings, penalty)
    trainer = job.trainer
    assert trainer.device == META and trainer.sync_every == SYNC_EVERY

    def job_step():  # record_run's loop between two sync points
        assert job._interrupt() is None
        trainer.step()
        job.recorder.flush()

    job_ops = ops_per_step(job_step)  # a host read of a meta tensor would raise here
    while trainer.step_index < SYNC_EVERY - 1:
        job_step()
    plain_ops = ops_per_step(plain_loop(job, bool(penalty)))
    assert job_ops <= SLACK * plain_ops, (job_ops, plain_ops)
    # the sync point reads, once, where reads are made
    with pytest.raises(NotImplementedError, match="meta tensor") as raised:
        trainer.step()
    assert any(entry.name == "host_read" for entry in raised.traceback)
