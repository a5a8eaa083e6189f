"""The Trainer: determinism, the NaN/Inf guard and last good weights, evaluation with a cache,
the before/after measurement and the retraining job's settings."""

import math
import threading

import pytest
import torch

from attn_core import checkpoint
from attn_core.device import select_device
from attn_core.hooks import act_name
from attn_core.retraining.job import TrainingJob
from attn_core.tasks import get_task
from attn_core.training.config import JobConfig, TrainConfig
from attn_core.training.telemetry import measure_run
from attn_core.training.trainer import Diverged, Trainer, evaluate, lr_factor
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
    m = measure_run(make_tiny_model(), TASK, heads="L0H1", samples=32)
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


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(steps=0), "steps must be a positive integer, got 0"),
        (dict(steps=-5), "steps must be a positive integer"),
        (dict(regularizers={"entropy": -0.1}), "must be a finite number >= 0"),
        (dict(regularizers=["nope=1"]), "unknown regularizer 'nope'"),
        (dict(entmax_alpha=2.5), "entmax_alpha must be in [1, 2]"),
        (dict(lr=0.0), "lr must be in (0, 10]"),
        (dict(lr=float("nan")), "lr must be in (0, 10]"),
        (dict(device="tpu"), "device"),
        (dict(source=""), "source must name a model"),
    ],
)
def test_job_config_checks(kw, message):
    with pytest.raises(ValueError) as e:
        JobConfig(**{"source": "x", **kw})
    assert message in str(e.value)


def test_job_checks_heads_and_source_against_the_model(tmp_path):
    folder = checkpoint.save(make_tiny_model(), tmp_path / "tiny", {"task": "reverse"})
    with pytest.raises(ValueError, match="layer L1 is out of range"):
        TrainingJob.open(JobConfig(str(folder), {"entropy": 0.1}, heads="L1"), store=False)
    with pytest.raises(ValueError, match="head L0H2 is out of range"):
        TrainingJob.open(JobConfig(str(folder), ["entropy@L0H2=0.1"]), store=False)
    with pytest.raises(ValueError, match="no model named"):
        TrainingJob.open(JobConfig("no-such-model"), store=False)
    with pytest.raises(ValueError, match="unknown preset"):
        TrainingJob.open(JobConfig("scratch:nope"), store=False)
    with pytest.raises(ValueError, match=r"scratch:text-8k cannot be retrained from a fresh init: train it with"):
        TrainingJob.open(JobConfig("scratch:text-8k"), store=False)  # a text preset trains its tokenizer too
    bare = checkpoint.save(make_tiny_model(), tmp_path / "bare", {})
    with pytest.raises(ValueError, match="no known task"):
        TrainingJob.open(JobConfig(str(bare)), store=False)


def test_job_command_reproduces_the_settings():
    c = JobConfig("recall-2l", ["topk:2@L1=0.5", "entropy=0.1"], heads="L0", entmax_alpha=1.5, steps=50, seed=3)
    assert c.command() == (
        "attn-lab retrain recall-2l --reg topk:2@L1=0.5 --reg entropy=0.1 --heads L0 "
        "--steps 50 --seed 3 --lr 0.001 --entmax-alpha 1.5"
    )
    assert c.to_dict()["regularizers"] == ["topk:2@L1=0.5", "entropy=0.1"]


# --- reading the device every sync_every steps --------------------------------------------------------


def nan_at(k: int):
    """A penalty whose value is NaN at its k-th call (the k-th step) and 0 otherwise."""
    calls = [0]

    def penalty(model, batch, cache):
        calls[0] += 1
        zero = model.embed.W_E.sum() * 0
        return {"bad": zero + (math.nan if calls[0] == k else 0.0)}

    return penalty


def test_sync_every_gives_the_same_run_bit_for_bit():
    seen = {1: [], 5: []}
    runs = {}
    for n in seen:
        t = Trainer(make_tiny_model(), TASK, cfg(steps=12, sync_every=n), callbacks=[seen[n].append])
        t.run()
        runs[n] = t
    assert all(torch.equal(a, b) for a, b in zip(runs[1].params, runs[5].params))
    assert [m["step"] for m in seen[5]] == list(range(1, 13)) and seen[5] == seen[1]


def test_between_sync_points_step_returns_only_step_and_lr():
    trainer = Trainer(make_tiny_model(), TASK, cfg(steps=12, eval_every=12, sync_every=4))
    out = [trainer.step() for _ in range(4)]
    assert [set(m) for m in out[:3]] == [{"step", "lr"}] * 3
    assert {"loss", "task_loss", "accuracy", "grad_norm", "lr"} <= set(out[3]) and out[3]["step"] == 4
    assert trainer.sync_every == 4 and Trainer(make_tiny_model(), TASK, cfg()).sync_every == 1  # CPU default


@pytest.mark.parametrize("n, k, caught_at, kept", [(4, 6, 8, 3), (4, 4, 4, 0), (5, 7, 8, 4), (3, 1, 3, 0)])
def test_a_nan_is_caught_by_the_next_sync_point(n, k, caught_at, kept):
    """NaN at step k with sync_every n (eval at step 8): caught at the next sync point, at most
    n - 1 steps later; the weights kept are those of the last sync point before k."""
    trainer = Trainer(make_tiny_model(), TASK, cfg(steps=20, eval_every=8, sync_every=n), penalty=nan_at(k))
    reference = Trainer(make_tiny_model(), TASK, cfg(steps=20, eval_every=8, sync_every=1), penalty=nan_at(10**9))
    for _ in range(kept):
        reference.step()
    seen = []
    trainer.callbacks.append(seen.append)
    calls = 0
    with pytest.raises(Diverged, match=f"diverged at step {k}: loss is nan \\(term 'bad'\\)"):
        while True:
            calls += 1
            trainer.step()
    assert calls == caught_at and calls - k <= n - 1
    assert [m["step"] for m in seen] == list(range(1, k))  # every good step was delivered
    assert trainer.step_index == k - 1 and trainer.restore_good() == kept
    for p, q in zip(trainer.params, reference.params):  # bit for bit the weights after `kept` updates
        assert torch.equal(p, q)


def test_sync_flushes_the_pending_steps():
    trainer = Trainer(make_tiny_model(), TASK, cfg(steps=12, eval_every=12, sync_every=10))
    for _ in range(3):
        trainer.step()
    rows = trainer.sync()
    assert [m["step"] for m in rows] == [1, 2, 3] and all(math.isfinite(m["loss"]) for m in rows)
    assert trainer.sync() == [] and set(trainer.seconds) == {1, 2, 3}


def test_precision_and_sync_every_settings():
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        TrainConfig(precision="fp16")
    with pytest.raises(ValueError, match="sync_every must be an integer in 1..10000"):
        TrainConfig(sync_every=0)
    with pytest.raises(ValueError, match="sync_every must be an integer"):
        JobConfig("x", sync_every=True)
    with pytest.raises(ValueError, match="precision"):
        JobConfig("x", precision="half")


def test_bf16_autocast_runs_on_cpu_near_fp32():
    """bf16 autocast (forward and loss) on CPU: finite, and within 2% of the fp32 loss after 30 steps."""
    out = {}
    for precision in ("fp32", "bf16"):
        t = Trainer(make_tiny_model(), TASK, cfg(steps=30, eval_every=30, precision=precision))
        out[precision] = t.run()
        assert all(p.dtype == torch.float32 for p in t.params)  # weights stay fp32
    assert math.isfinite(out["bf16"]["loss"]) and math.isfinite(out["bf16"]["eval_loss"])
    assert out["bf16"]["task_loss"] == pytest.approx(out["fp32"]["task_loss"], rel=0.02)
    assert out["bf16"]["eval_loss"] == pytest.approx(out["fp32"]["eval_loss"], rel=0.02)
