"""Checkpoints across training (attn_core.training.checkpoints): the schedule, what a job, a
preset training and a sweep trial write (the weights of exactly that step, listed in the card,
atomically), the disk bound, partial (attention-only) checkpoints and bad settings."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import checkpoint
from attn_core.checkpoint import CHECKPOINTS, CheckpointError
from attn_core.limits import LimitError
from attn_core.retraining.job import TrainingJob
from attn_core.runs import RunStore
from attn_core.sources import resolve
from attn_core.training import checkpoints as ckpt
from attn_core.training.config import JobConfig
from attn_core.training.trainer import Trainer
from tests.conftest import make_tiny_model


@pytest.fixture
def tiny(tmp_path):
    card = {"task": "reverse", "train": {"batch_size": 8}}
    return str(checkpoint.save(make_tiny_model(n_layers=2), tmp_path / "tiny", card))


def job_cfg(source, **kw) -> JobConfig:
    base = dict(steps=12, lr=3e-3, device="cpu", telemetry_every=6, spectrum_every=6, eval_every=6)
    return JobConfig(source, **{**base, "eval_samples": 16, "probe_samples": 4, "measure_samples": 32, **kw})


# --- the schedule ------------------------------------------------------------------------------------


def test_schedule_unites_every_log_and_steps_with_0_and_the_end():
    plan = ckpt.CheckpointPlan(every=40, log=4, steps=(7, 999))
    assert plan.schedule(100) == [0, 1, 5, 7, 22, 40, 80, 100]
    assert ckpt.CheckpointPlan().schedule(100) == [] and ckpt.CheckpointPlan.of() is None
    assert ckpt.CheckpointPlan(every=1000).schedule(10) == [0, 10]


@settings(max_examples=60, deadline=None)
@given(total=st.integers(1, 100_000), n=st.integers(1, 300))
def test_log_steps_are_log_spaced_inside_the_run(total, n):
    steps = ckpt.log_steps(total, n)
    assert steps == sorted(set(steps)) and len(steps) <= n
    assert steps[-1] == total and 1 <= steps[0]
    if n >= 2 and total >= 2:
        assert steps[0] == 1


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(every=0), "--checkpoint-every must be a whole number"),
        (dict(log=0), "--checkpoint-log must be"),
        (dict(steps=(-1,)), "--checkpoint-steps must be whole numbers"),
        (dict(every=1, params="mlp"), "--checkpoint-params must be one of all, attn"),
        (dict(every=1, max_mb=0), "--checkpoint-max-mb must be a positive"),
        (dict(every=True), "--checkpoint-every must be a whole number"),
    ],
)
def test_bad_plans_are_one_sentence(kw, words):
    with pytest.raises(ValueError, match=words):
        ckpt.CheckpointPlan(**kw)


def test_job_config_checks_its_checkpoint_settings():
    with pytest.raises(ValueError, match="invalid checkpoint setting"):
        JobConfig("induction-2l", checkpoint_log=-3)
    with pytest.raises(ValueError, match="more than 10,000"):
        JobConfig("induction-2l", steps=50_000, checkpoint_every=1)
    cfg = JobConfig("induction-2l", checkpoint_every=5, checkpoint_params="attn", checkpoint_steps=[3])
    assert "--checkpoint-every 5" in cfg.command() and "--checkpoint-params attn" in cfg.command()
    assert "--checkpoint-steps 3" in cfg.command()


# --- what a job writes ---------------------------------------------------------------------------------


def test_job_keeps_the_weights_of_each_step_in_the_run(tiny):
    store = RunStore()
    job = TrainingJob.open(job_cfg(tiny, checkpoint_every=5), store=store)
    assert job.checkpoints.steps == [0, 5, 10, 12]
    replay = Trainer(resolve(tiny).model, job.task, job.train_cfg)  # the same run, by hand
    res = job.run()
    assert res["status"] == "completed"
    folder = store.path(res["run_id"])
    card = json.loads((folder / "card.json").read_text())
    listed = card["checkpoints"]
    assert listed["steps"] == [0, 5, 10, 12] and listed["folder"] == CHECKPOINTS and listed["params"] == "all"
    series = ckpt.read_series(folder / CHECKPOINTS)
    assert [s for s, _ in series] == [0, 5, 10, 12]
    assert listed["bytes"] == sum(p.stat().st_size for _, p in series)
    assert len({p.stat().st_size for _, p in series}) == 1  # every file the same size: the estimate is exact
    state = {s: ckpt.load_checkpoint(p).model.state_dict() for s, p in series}
    final = resolve(f"run:{res['run_id']}", store=store).model.state_dict()
    assert all(torch.equal(state[12][k], final[k]) for k in final)
    for _ in range(5):
        replay.step()
    assert all(torch.allclose(state[5][k], v, atol=1e-6) for k, v in replay.model.state_dict().items())
    assert not any(p.name.startswith(".") for p in (folder / CHECKPOINTS).iterdir())  # no temporary files


def test_a_stopped_job_lists_what_it_kept(tiny):
    store = RunStore()
    job = TrainingJob.open(job_cfg(tiny, steps=200, checkpoint_every=2), store=store)
    job._stop.set()  # stop before the first step
    res = job.run()
    assert res["status"] == "stopped"
    card = json.loads((store.path(res["run_id"]) / "card.json").read_text())
    assert card["checkpoints"]["steps"] == [0]


def test_attention_only_checkpoints_need_the_final_model(tiny):
    store = RunStore()
    res = TrainingJob.open(job_cfg(tiny, checkpoint_log=3, checkpoint_params="attn"), store=store).run()
    folder = store.path(res["run_id"]) / CHECKPOINTS
    step, path = ckpt.read_series(folder)[1]
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        names = set(f.keys())
    assert names and all(n.startswith(("blocks.", "ln_final.")) for n in names)
    assert not any(".mlp." in n or n.startswith(("embed", "unembed", "pos_embed")) for n in names)
    with pytest.raises(CheckpointError, match="only attention and LayerNorm"):
        ckpt.load_checkpoint(path)
    final = resolve(f"run:{res['run_id']}", store=store)
    loaded = ckpt.load_checkpoint(path, reference=final)
    assert loaded.card.details["checkpoint"] == {"step": step, "params": "attn", "partial": True}
    got = loaded.model.state_dict()
    assert torch.equal(got["embed.W_E"], final.model.state_dict()["embed.W_E"])


# --- atomic writes, bad folders, the bound ---------------------------------------------------------------


def test_a_failed_write_leaves_no_file_and_the_index_unchanged(tmp_path):
    model = make_tiny_model()
    writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=1), 3)
    writer.start(tmp_path / "series", model)
    (tmp_path / "series" / ckpt.file_name(1)).mkdir()  # the file's name is taken by a folder
    with pytest.raises(CheckpointError, match="checkpoint 1 could not be written"):
        writer.write(1, model)
    names = sorted(p.name for p in (tmp_path / "series").iterdir())
    assert names == [ckpt.INDEX, ckpt.file_name(0), ckpt.file_name(1)]  # the folder, no temporary file
    assert json.loads((tmp_path / "series" / ckpt.INDEX).read_text())["steps"] == [0]
    assert [s for s, _ in ckpt.read_series(tmp_path / "series")] == [0]


def test_an_unwritable_checkpoint_folder_is_one_sentence(tmp_path):
    (tmp_path / "a_file").write_text("x")
    writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=1), 3)
    with pytest.raises(CheckpointError, match="cannot be made"):
        writer.start(tmp_path / "a_file" / "series", make_tiny_model())


def test_the_bound_refuses_before_anything_is_written(tmp_path):
    model = make_tiny_model()
    writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=1, max_mb=0.01), 100)
    with pytest.raises(LimitError, match="more than the bound"):
        writer.start(tmp_path / "series", model)
    assert not (tmp_path / "series").exists()
    assert "101 at steps" in writer.statement(model.cfg)


def test_read_series_refuses_a_bad_index(tmp_path):
    (tmp_path / ckpt.INDEX).write_text(json.dumps({"steps": [0, 1], "files": ["step-000000000.safetensors"]}))
    with pytest.raises(CheckpointError, match="as many steps as files"):
        ckpt.read_series(tmp_path)
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        ckpt.read_series(tmp_path / "nothing")


def test_a_checkpoint_file_or_index_that_links_out_of_the_folder_is_refused(tmp_path):
    """One rule for every file of a model folder, its checkpoints included: an index leading out
    is refused; a checkpoint file leading out is left out of the series with the reason."""
    model = make_tiny_model()
    writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=1), 1)
    writer.start(tmp_path / "series", model)
    writer.write(1, model)
    for name in (ckpt.file_name(1), ckpt.INDEX):
        inside, outside = tmp_path / "series" / name, tmp_path / name
        inside.rename(outside)
        inside.symlink_to(outside)
        if name == ckpt.INDEX:
            with pytest.raises(CheckpointError, match=f"'{name}' leads outside the model folder series"):
                ckpt.read_series(tmp_path / "series")
        else:
            problems = []
            assert [s for s, _ in ckpt.read_series(tmp_path / "series", problems)] == [0]
            assert problems[0][:2] == (1, name) and "leads outside the model folder series" in problems[0][2]
        inside.unlink()
        outside.rename(inside)
    (tmp_path / "series" / ckpt.INDEX).unlink()  # without the index too
    (tmp_path / "series" / ckpt.file_name(1)).rename(tmp_path / "elsewhere")
    (tmp_path / "series" / ckpt.file_name(1)).symlink_to(tmp_path / "elsewhere")
    problems = []
    assert [s for s, _ in ckpt.read_series(tmp_path / "series", problems)] == [0]
    assert "leads outside the model folder" in problems[0][2]


def test_save_moves_included_folders_back_when_it_fails(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "x").write_text("1")
    with pytest.raises(OSError):
        checkpoint.save(make_tiny_model(), tmp_path / "m", include={"a": keep, "b": tmp_path / "missing"})
    assert (keep / "x").read_text() == "1" and not (tmp_path / "m").exists()


# --- the commands ---------------------------------------------------------------------------------------


def _cli(capsys, *args) -> tuple[int, str, str]:
    """``attn-lab ARGS`` in this process: (exit status, stdout, stderr)."""
    from attn_core.cli import main

    with pytest.raises(SystemExit) as done:
        main(list(args))
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def test_train_writes_its_checkpoints_into_out_and_states_the_disk_use(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(
        capsys, "train", "--preset", "copy-1l", "--steps", "20", "--checkpoint-every", "10", "--out", "m", "--json"
    )
    assert code == 0, err
    assert "checkpoints: 3 at steps 0, 10, 20" in err and "in all" in err
    card = json.loads(out)
    assert card["checkpoints"]["steps"] == [0, 10, 20]
    assert [s for s, _ in ckpt.read_series(tmp_path / "m" / CHECKPOINTS)] == [0, 10, 20]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # nothing left beside it


def test_train_refuses_bad_checkpoint_settings_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for args, words in (
        (("--checkpoint-every", "5"), "give --out"),
        (("--checkpoint-every", "1", "--checkpoint-max-mb", "0.01", "--out", "m"), "more than the bound"),
        (("--checkpoint-params", "mlp", "--checkpoint-log", "3", "--out", "m"), "params must be one of"),
        (("--checkpoint-steps", "1,x", "--out", "m"), "whole numbers separated by commas"),
    ):
        code, _, err = _cli(capsys, "train", "--preset", "copy-1l", "--steps", "100", *args)
        assert code == 2 and words in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_trial_brings_its_checkpoints_to_the_run(tiny):
    from attn_core.sweep import BASELINE, Trial
    from attn_core.sweep.trial import record_trial, run_trial

    job = dict(steps=6, device="cpu", telemetry_every=3, spectrum_every=3, eval_every=3, measure_samples=16)
    payload = run_trial(Trial(tiny, BASELINE, 0.0, 0).to_dict(), {**job, "checkpoint_every": 3})
    assert sorted(payload["checkpoints"]) == [ckpt.INDEX, *(ckpt.file_name(s) for s in (0, 3, 6))]
    store = RunStore()
    sweep_id = store.create_sweep("t", {"trials": []})
    run_id = record_trial(store, sweep_id, payload)
    assert [s for s, _ in ckpt.read_series(store.path(run_id) / CHECKPOINTS)] == [0, 3, 6]
    assert not [p for p in store.root.iterdir() if p.name.startswith(".checkpoints")]


def test_a_long_series_rewrites_its_index_less_often_and_is_read_whole(tmp_path, monkeypatch):
    """Past INDEX_EVERY_FROM files the index is rewritten after every n/50-th (its cost grows with
    its length); the files written since are read all the same, and the last step is indexed."""
    monkeypatch.setattr(ckpt, "INDEX_EVERY_FROM", 3)
    model = make_tiny_model()
    writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=1), 121)
    writer.start(tmp_path / "series", model)
    for step in range(1, 119):  # 119 files: the 119th is not one the index is rewritten after
        writer.write(step, model)
    indexed = json.loads((tmp_path / "series" / ckpt.INDEX).read_text())["steps"]
    assert len(indexed) == 118 and [s for s, _ in ckpt.read_series(tmp_path / "series")] == list(range(119))
    writer.write(121, model)  # the last scheduled step: indexed whatever n
    assert json.loads((tmp_path / "series" / ckpt.INDEX).read_text())["steps"][-1] == 121


# --- the size of a checkpoint, from the config alone -----------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(
    n_layers=st.integers(1, 3),
    n_heads=st.sampled_from([1, 2, 4]),
    d_head=st.sampled_from([4, 8]),
    d_mlp=st.sampled_from([0, 16]),
    params=st.sampled_from(["all", "attn"]),
)
def test_checkpoint_bytes_equals_the_written_checkpoint(n_layers, n_heads, d_head, d_mlp, params):
    model = make_tiny_model(n_layers=n_layers, n_heads=n_heads, d_head=d_head, d_mlp=d_mlp)
    assert ckpt.checkpoint_bytes(model.cfg, params) == len(ckpt.to_bytes(model, 0, params))


@pytest.mark.parametrize("name", ["induction-2l", "modadd-1l-mlp", "recall-2l-merged"])
def test_checkpoint_bytes_of_zoo_models(name):
    model = resolve(name).model
    for params in ("all", "attn"):
        assert ckpt.checkpoint_bytes(model.cfg, params) == len(ckpt.to_bytes(model, 0, params))


def test_the_checkpoint_line_of_a_run_on_workers_builds_no_model(tiny):
    job = TrainingJob.open(job_cfg(tiny, checkpoint_log=3, workers=2), store=False)
    line = job.checkpoint_statement()
    assert line.startswith("checkpoints: 4 at steps 0, 1, 3, 12 (all weights") and not job.built
    here = TrainingJob.open(job_cfg(tiny, checkpoint_log=3), store=False)  # a job that trains here
    assert here.checkpoint_statement() == line  # the same line as from the weights it builds:
    assert ckpt.checkpoint_bytes(here.model_cfg, "all") == len(ckpt.to_bytes(here.model, 0, "all"))
    assert TrainingJob.open(job_cfg(tiny), store=False).checkpoint_statement() is None
