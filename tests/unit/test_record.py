"""Recording a run: the one step loop keeps the last good weights when a step diverges, stops when
asked, and a recorded run's card and metric log read back from the run store."""

import json
import math
import tempfile

import pytest
import torch

from attn_core import checkpoint
from attn_core.card import Card
from attn_core.runs import RunStore
from attn_core.tasks import get_task
from attn_core.training.config import TrainConfig
from attn_core.training.record import Outcome, RunRecorder, measure_final, record_run, rescue_folders, run_card
from attn_core.training.telemetry import measure_run
from attn_core.training.trainer import Trainer
from tests.conftest import make_tiny_model

TASK = get_task("reverse")


def trainer(steps: int = 6, **kw) -> Trainer:
    recipe = TrainConfig(
        **{**dict(steps=steps, batch_size=16, lr=3e-3, eval_every=3, eval_samples=32, device="cpu"), **kw}
    )
    return Trainer(make_tiny_model(), TASK, recipe)


def test_divergence_keeps_the_last_good_weights():
    t = trainer()
    seen, good = [], {}

    def on_step(step, row, seconds):
        seen.append((step, row))
        assert seconds >= 0
        if step == 1:
            good.update({k: v.clone() for k, v in t.model.state_dict().items()})
        if step == 2:  # break the weights: the next step's loss is NaN
            with torch.no_grad():
                t.model.embed.W_E.fill_(math.nan)

    out = record_run(t, on_step=on_step)
    assert out.status == "diverged"
    assert out.reason.startswith("diverged at step 3: loss is nan")
    assert out.message == f"{out.reason}; kept weights of step 1"
    assert t.step_index == 2 and [s for s, _ in seen] == [1, 2]
    # the weights after step 1: the last that gave a finite loss and gradient
    for k, v in t.model.state_dict().items():
        assert torch.equal(v, good[k]), k
    assert {"loss", "task_loss", "accuracy", "grad_norm", "lr"} <= set(seen[0][1]) and "step" not in seen[0][1]


def test_exploding_loss_ends_diverged_with_finite_weights():
    out = record_run(trainer(steps=50, lr=10.0, warmup_steps=0, grad_clip=1e9))
    assert out.status == "diverged" and "exceeds" in out.reason


def test_completed_and_stopped_runs():
    t = trainer()
    assert record_run(t) == Outcome("completed", "completed 6 steps")
    t = trainer()
    out = record_run(t, interrupt=lambda: "stopped at step 2 of 6" if t.step_index == 2 else None)
    assert out == Outcome("stopped", "stopped at step 2 of 6") and t.step_index == 2
    with pytest.raises(ValueError, match="a run ends"):
        Outcome("paused", "")


def test_a_recorded_run_reads_back_from_the_store(tmp_path):
    store = RunStore(tmp_path / "runs")
    t = trainer()
    recorder = RunRecorder(store)
    run_id = recorder.start("parent-model", TASK.name, {"steps": 6})
    assert store.get(run_id)["status"] == "running"

    def measured():
        return measure_run(t.model, TASK, None, 32, 0)

    before = measured()
    outcome = record_run(t, recorder)
    outcome, after = measure_final(t, outcome, measured)
    card = run_card(
        run_id,
        t,
        outcome,
        parent="parent-model",
        description="a test run",
        before=before,
        after=after,
        samples=32,
        wall_time_s=1.234,
        command="attn-lab test",
        kind="test",
    )
    assert recorder.finish(outcome, t.model, card, before, after) == outcome

    run = store.get(run_id)
    assert run["status"] == "completed" and run["message"] == "completed 6 steps"
    assert run["summary"]["after"]["accuracy"] == after["accuracy"]
    back = Card.from_dict(json.loads((store.path(run_id) / "card.json").read_text()))
    assert back.name == f"run:{run_id}" and back.run_id == run_id and back.task == "reverse"
    assert back.parent == "parent-model" and back.status == "completed" and back.steps == 6 and back.seed == 0
    assert back.metrics["accuracy"] == after["accuracy"] and back.metrics["eval_samples"] == 32
    assert back.train == t.cfg.to_dict() and back.params == t.model.n_params() and back.wall_time_s == 1.23
    assert back.machine and back.created and back.command == "attn-lab test"
    assert back.details["kind"] == "test" and back.details["before"]["loss"] == before["loss"]
    assert "per_head" not in back.details["after"] and len(back.details["per_head"]["after"]) == 2
    # the whole metric log reached the store
    logged = store.metrics(run_id)
    assert len(logged) == len(recorder) and set(logged["name"]) >= {"loss", "task_loss", "eval_loss"}
    assert store.load_model(run_id).card.status == "completed"


def test_a_broken_last_step_is_a_divergence():
    t = trainer(steps=2)
    record_run(t)
    with torch.no_grad():
        t.model.unembed.W_U.fill_(math.nan)
    outcome, after = measure_final(
        t, Outcome("completed", "completed 2 steps"), lambda: measure_run(t.model, TASK, None, 16, 0)
    )
    assert outcome.status == "diverged" and "kept weights of step 1" in outcome.message
    assert math.isfinite(after["loss"])


def test_a_store_that_fails_makes_the_run_failed(tmp_path, monkeypatch):
    """A store that refuses the save: the run fails with the true reason, and the trained weights
    go to a rescue folder that the message names (here under a temp dir of the test's own)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()

    class Broken(RunStore):
        def finish(self, *a, **kw):
            raise OSError("disk full")

    t = trainer(steps=2)
    recorder = RunRecorder(Broken(tmp_path / "runs"))
    run_id = recorder.start("p", TASK.name, {})
    outcome = record_run(t, recorder)
    card = run_card(
        run_id, t, outcome, parent="p", description="", before=None, after=None, samples=1, wall_time_s=0.0, command=""
    )
    out = recorder.finish(outcome, t.model, card, None, None)
    kept = rescue_folders(run_id)[0]
    assert kept.is_relative_to(tmp_path)
    assert out.status == "failed" and out.message == (
        f"completed 2 steps; saving the run failed: OSError: disk full; its weights were kept in {kept}"
    )
    saved = checkpoint.load_path(kept)
    assert saved.card.status == "failed" and saved.card.message.endswith("saving the run failed: OSError: disk full")
    for name, w in t.model.state_dict().items():
        assert torch.equal(saved.model.state_dict()[name], w)
    # without a store nothing is saved and the outcome stands
    assert RunRecorder().finish(outcome, t.model, card, None, None) == outcome


def nan_penalty_at(k: int):
    calls = [0]

    def penalty(model, batch, cache):
        calls[0] += 1
        return {"bad": model.embed.W_E.sum() * 0 + (math.nan if calls[0] == k else 0.0)}

    return penalty


def test_with_sync_every_a_nan_ends_the_run_diverged_with_the_last_synced_weights():
    """sync_every 4, NaN at step 6: caught at the sync point of step 8, at most 3 steps late; the
    run ends diverged with the weights of the sync point at step 4 (3 updates, taken before its
    update) and every good step logged, in order."""
    recipe = dict(steps=20, batch_size=16, lr=3e-3, eval_every=10, eval_samples=32, device="cpu")
    t = Trainer(make_tiny_model(), TASK, TrainConfig(**recipe, sync_every=4), penalty=nan_penalty_at(6))
    reference = Trainer(make_tiny_model(), TASK, TrainConfig(**recipe), penalty=nan_penalty_at(10**9))
    for _ in range(3):
        reference.step()
    recorder, seen = RunRecorder(), []
    out = record_run(t, recorder, on_step=lambda step, row, seconds: seen.append((step, seconds)))
    assert out.status == "diverged" and out.reason == "diverged at step 6: loss is nan (term 'bad')"
    assert out.message.endswith("kept weights of step 3")
    assert [s for s, _ in seen] == [1, 2, 3, 4, 5] and all(sec > 0 for _, sec in seen)
    assert sorted(set(recorder.columns[0])) == [1, 2, 3, 4, 5] and t.step_index == 5
    for p, q in zip(t.params, reference.params):
        assert torch.equal(p, q)


def test_with_sync_every_a_stop_reads_the_pending_steps_and_saves_the_final_weights():
    t = trainer(steps=20, sync_every=8)
    seen = []
    out = record_run(
        t,
        on_step=lambda step, row, seconds: seen.append(step),
        interrupt=lambda: "stopped" if t.step_index == 5 else None,
    )
    assert out.status == "stopped" and seen == [1, 2, 3, 4, 5]
    outcome, after = measure_final(t, out, lambda: measure_run(t.model, TASK, None, 16, 0))
    assert outcome == out and t.good_step == 5  # the measured weights are the ones kept
    assert all(torch.equal(a, b) for a, b in zip(t.good_state, t.params))
