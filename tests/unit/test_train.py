"""The Trainer: determinism, the NaN/Inf guard and last good weights, evaluation with a cache,
the before/after measurement and the retraining job's settings."""
import math
import threading

import pytest
import torch

from attn_core import checkpoint
from attn_core.hooks import act_name
from attn_core.tasks import get_task
from attn_core.training.job import JobConfig, TrainingJob
from attn_core.training.telemetry import measure
from attn_core.training.trainer import (
    Diverged,
    TrainConfig,
    Trainer,
    evaluate,
    lr_factor,
    select_device,
)
from tests.conftest import make_tiny_model

TASK = get_task("reverse")


def cfg(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(steps=8, batch_size=16, lr=3e-3, eval_every=4, eval_samples=32, device="cpu"), **kw})


def losses(seed: int, model_seed: int = 0, steps: int = 6) -> list[float]:
    trainer = Trainer(make_tiny_model(seed=model_seed), TASK, cfg(steps=steps, seed=seed))
    return [trainer.step()["loss"] for _ in range(steps)]


def test_deterministic_under_a_seed():
    assert losses(1) == losses(1)
    assert losses(1) != losses(2)


def test_step_metrics_and_callbacks():
    seen = []
    trainer = Trainer(make_tiny_model(), TASK, cfg(), callbacks=[seen.append])
    trainer.run()
    assert len(seen) == 8 and seen[-1]["step"] == 8
    assert {"loss", "task_loss", "accuracy", "grad_norm", "lr"} <= set(seen[0])
    assert "eval_accuracy" in seen[3] and "eval_accuracy" not in seen[4] and "eval_accuracy" in seen[7]
    assert 0 <= seen[0]["accuracy"] <= 1


def test_lr_schedule_unchanged():
    c = cfg(steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, c) == pytest.approx(0.1)
    assert lr_factor(9, c) == pytest.approx(1.0)
    assert lr_factor(100, c) == pytest.approx(0.1)


def test_nan_loss_stops_before_any_update():
    trainer = Trainer(make_tiny_model(), TASK, cfg())
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.step()
    trainer.step()
    with torch.no_grad():
        trainer.model.embed.W_E.fill_(math.nan)
    with pytest.raises(Diverged, match="diverged at step 3: loss is nan"):
        trainer.step()
    assert trainer.step_index == 2
    # weights are known good once they gave a finite loss and gradient: those of step 1 here
    assert trainer.restore_good() == 1
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    assert not torch.equal(trainer.model.embed.W_E, initial["embed.W_E"])


def test_nan_gradient_stops_before_any_update():
    def bad_penalty(model, batch, cache):
        x = model.embed.W_E.sum()
        return {"bad": torch.sqrt(x - x)}  # value 0, gradient NaN

    trainer = Trainer(make_tiny_model(), TASK, cfg(), penalty=bad_penalty)
    before = trainer.model.embed.W_E.detach().clone()
    with pytest.raises(Diverged, match="gradient norm is nan"):
        trainer.step()
    assert torch.equal(trainer.model.embed.W_E.detach(), before)


def test_exploding_loss_counts_as_divergence():
    trainer = Trainer(make_tiny_model(), TASK, cfg(steps=50, lr=10.0, warmup_steps=0, grad_clip=1e9))
    with pytest.raises(Diverged, match="exceeds"):
        for _ in range(50):
            trainer.step()
    assert trainer.good_step == max(0, trainer.step_index - 1)
    sd = trainer.good_state_dict()
    assert all(torch.isfinite(t).all() for t in sd.values())


def test_good_state_can_be_read_from_another_thread():
    trainer = Trainer(make_tiny_model(), TASK, cfg(steps=40))
    stop = threading.Event()
    copies = []

    def reader():
        while not stop.is_set():
            copies.append(trainer.good_state_dict())

    t = threading.Thread(target=reader)
    t.start()
    try:
        trainer.run()
    finally:
        stop.set()
        t.join()
    assert copies and all(set(c) == set(trainer.model.state_dict()) for c in copies)


def test_evaluate_keeps_the_forward_in_a_cache():
    model = make_tiny_model()
    cache = {}
    res = evaluate(model, TASK, samples=16, seed=0, cache=cache)
    assert cache[act_name("pattern", 0)].shape == (16, 2, TASK.n_ctx, TASK.n_ctx)
    assert res == evaluate(model, TASK, samples=16, seed=0)


def test_measure_reports_the_before_after_keys():
    m = measure(make_tiny_model(), TASK, heads="L0H1", samples=32)
    assert {"accuracy", "loss", "entropy_data", "entropy_vocab", "top1_mass", "stable_rank"} <= set(m)
    assert 0 <= m["entropy_data"] <= 1 and 0 <= m["entropy_vocab"] <= 1 and 0 < m["top1_mass"] <= 1
    assert [r["head"] for r in m["per_head"]] == ["L0H1"]
    assert m["stable_rank"] >= 1
    assert len(m["per_head"][0]["singular_values"]) == 8


def test_train_config_checks():
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="unknown device|unsupported device"):
        select_device("tpu")


@pytest.mark.parametrize("kw, message", [
    (dict(steps=0), "steps must be a positive integer, got 0"),
    (dict(steps=-5), "steps must be a positive integer"),
    (dict(regularizers={"entropy": -0.1}), "must be a finite number >= 0"),
    (dict(regularizers=["nope=1"]), "unknown regularizer 'nope'"),
    (dict(entmax_alpha=2.5), "entmax_alpha must be in [1, 2]"),
    (dict(lr=0.0), "lr must be in (0, 10]"),
    (dict(lr=float("nan")), "lr must be in (0, 10]"),
    (dict(device="tpu"), "device"),
    (dict(source=""), "source must name a model"),
])
def test_job_config_checks(kw, message):
    with pytest.raises(ValueError) as e:
        JobConfig(**{"source": "x", **kw})
    assert message in str(e.value)


def test_job_checks_heads_and_source_against_the_model(tmp_path):
    folder = checkpoint.save(make_tiny_model(), tmp_path / "tiny", {"task": "reverse"})
    with pytest.raises(ValueError, match="layer L1 is out of range"):
        TrainingJob(JobConfig(str(folder), {"entropy": 0.1}, heads="L1"), store=False)
    with pytest.raises(ValueError, match="head L0H2 is out of range"):
        TrainingJob(JobConfig(str(folder), ["entropy@L0H2=0.1"]), store=False)
    with pytest.raises(ValueError, match="no model named"):
        TrainingJob(JobConfig("no-such-model"), store=False)
    with pytest.raises(ValueError, match="unknown preset"):
        TrainingJob(JobConfig("scratch:nope"), store=False)
    bare = checkpoint.save(make_tiny_model(), tmp_path / "bare", {})
    with pytest.raises(ValueError, match="no known task"):
        TrainingJob(JobConfig(str(bare)), store=False)


def test_job_command_reproduces_the_settings():
    c = JobConfig("recall-2l", ["topk:2@L1=0.5", "entropy=0.1"], heads="L0", entmax_alpha=1.5, steps=50, seed=3)
    assert c.command() == ("attn-lab retrain recall-2l --reg topk:2@L1=0.5 --reg entropy=0.1 --heads L0 "
                           "--steps 50 --seed 3 --lr 0.001 --entmax-alpha 1.5")
    assert c.to_dict()["regularizers"] == ["topk:2@L1=0.5", "entropy=0.1"]
