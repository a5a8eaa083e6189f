"""The sampled-rows estimate of the row penalties as a training option (``JobConfig.penalty_rows``,
``--penalty-rows``): checked like every setting, recorded in the run's command, config and card,
and passed to ``build_penalty`` by the live job (in a thread and in a worker process), by
``attn-lab retrain`` and by a sweep's trials. That the estimate is unbiased is the library's test
(tests/unit/test_penalty_blocked.py); here: the plumbing."""

import json

import pytest
from typer.testing import CliRunner

from attn_core import checkpoint
from attn_core.cli import app, main
from attn_core.retraining.job import TrainingJob
from attn_core.runs import RunStore
from attn_core.sweep import grid_plan, record_trial, run_trial, start_sweep
from attn_core.training.config import MAX_PENALTY_ROWS, JobConfig
from tests.conftest import make_tiny_model

T = 16  # positions the reverse task's model reads (n_ctx); row 0 sees one key, so 15 can count


@pytest.fixture
def tiny(tmp_path):  # weights far from uniform attention: rows differ, so samples differ
    card = {"task": "reverse", "train": {"batch_size": 8}}
    return str(checkpoint.save(make_tiny_model(n_layers=2, std=0.5), tmp_path / "tiny", card))


def job_cfg(source, **kw) -> JobConfig:
    base = dict(
        regularizers=["entropy=0.5", "vocab_topk=0.1"],
        steps=4,
        device="cpu",
        telemetry_every=2,
        spectrum_every=2,
        eval_every=2,
        eval_samples=16,
        probe_samples=4,
        measure_samples=32,
    )
    return JobConfig(source, **{**base, **kw})


def entropy_terms(job: TrainingJob) -> list[float]:
    log = job.snapshot().metrics()
    return log[log["name"] == "term:entropy"].sort_values("step")["value"].tolist()


# --- the setting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "8", MAX_PENALTY_ROWS + 1])
def test_a_bad_penalty_rows_is_one_sentence(bad):
    with pytest.raises(ValueError, match=r"penalty_rows must be a whole number of query rows per head in 1\.\.") as e:
        JobConfig("reverse-1l", penalty_rows=bad)
    assert "\n" not in str(e.value) and "(unset: every row)" in str(e.value)


def test_penalty_rows_is_in_the_command_and_the_config():
    assert "--penalty-rows" not in JobConfig("reverse-1l").command()
    cfg = JobConfig("reverse-1l", regularizers=["entropy=0.1"], penalty_rows=64)
    assert cfg.command().endswith("--penalty-rows 64") and cfg.to_dict()["penalty_rows"] == 64
    again = JobConfig(**{k: v for k, v in cfg.to_dict().items() if k != "regularizers"})
    assert again.penalty_rows == 64 and again.command().endswith("--penalty-rows 64")


# --- the job --------------------------------------------------------------------------------------


def test_a_job_samples_rows_and_its_card_says_so(tiny):
    store = RunStore()
    exact = TrainingJob.open(job_cfg(tiny), store=False)
    exact.run()
    job = TrainingJob.open(job_cfg(tiny, penalty_rows=4), store=store)
    assert job.penalty.rows == 4  # what build_penalty got
    res = job.run()
    assert res["status"] == "completed" and res["steps"] == 4
    # step 1: same weights, same batch, so the terms differ only by the sampled rows
    sampled_terms, exact_terms = entropy_terms(job), entropy_terms(exact)
    assert len(sampled_terms) == len(exact_terms) == 4
    assert sampled_terms[0] != pytest.approx(exact_terms[0], rel=1e-4)

    card = store.load_model(res["run_id"]).card
    assert card.details["penalty"] == {"rows": 4, "positions": T, "estimate": "sampled"}
    assert card.details["job"]["penalty_rows"] == 4
    assert "row penalties on 4 sampled query rows per head" in card.description
    assert card.command.endswith("--penalty-rows 4")
    assert store.get(res["run_id"])["config"]["penalty_rows"] == 4


def test_rows_covering_the_sequence_are_the_exact_penalty(tiny):
    exact = TrainingJob.open(job_cfg(tiny), store=False)
    exact.run()
    job = TrainingJob.open(job_cfg(tiny, penalty_rows=T - 1), store=False)  # every row that can count
    res = job.run()
    card = job.card(_done(res), res["after"])
    assert card.details["penalty"] == {"rows": T - 1, "positions": T, "estimate": "exact"}
    assert entropy_terms(job) == pytest.approx(entropy_terms(exact), rel=1e-5)


def _done(res):
    from attn_core.training.record import Outcome

    return Outcome(res["status"], res["message"])


def test_without_a_row_penalty_nothing_is_sampled(tiny):
    job = TrainingJob.open(job_cfg(tiny, regularizers=["vocab_entropy=0.1"], penalty_rows=4), store=False)
    res = job.run()
    card = job.card(_done(res), res["after"])
    assert card.details["penalty"]["estimate"] == "none" and "sampled" not in card.description


def test_a_worker_process_gets_penalty_rows(tiny):
    store = RunStore()
    job = TrainingJob.open(job_cfg(tiny, penalty_rows=4), store=store).start(process=True)
    assert job.join(300)
    snap = job.snapshot()
    assert snap.status == "completed", snap.message
    card = store.load_model(snap.run_id).card
    assert card.details["penalty"]["estimate"] == "sampled" and card.details["job"]["penalty_rows"] == 4


# --- the CLI --------------------------------------------------------------------------------------


def test_retrain_with_penalty_rows(tiny):
    res = CliRunner().invoke(
        app, ["retrain", tiny, "--reg", "entropy=0.5", "--steps", "3", "--device", "cpu", "--penalty-rows", "5"]
    )
    assert res.exit_code == 0, res.output
    assert f"row penalties: 5 of {T} query rows per head sampled each step (unbiased estimate)" in res.stdout
    out = json.loads(
        CliRunner()
        .invoke(app, ["retrain", tiny, "--reg", "entropy=0.5", "--steps", "3", "--penalty-rows", "5", "--json"])
        .stdout
    )
    assert out["penalty"] == {"rows": 5, "positions": T, "estimate": "sampled"}
    shown = json.loads(CliRunner().invoke(app, ["runs", "show", out["run_id"], "--json"]).stdout)
    assert shown["card"]["penalty"]["rows"] == 5 and "--penalty-rows 5" in shown["card"]["command"]
    plain = json.loads(
        CliRunner().invoke(app, ["retrain", tiny, "--reg", "entropy=0.5", "--steps", "1", "--json"]).stdout
    )
    assert "penalty" not in plain  # exact: the output is as it was


@pytest.mark.parametrize("command", ["retrain", "sweep"])
@pytest.mark.parametrize(
    "value, message",
    [
        ("0", "penalty_rows must be a whole number of query rows per head in 1..1,048,576 (unset: every row), got 0"),
        ("-2", "penalty_rows must be a whole number"),
        (str(2**21), "got 2097152"),
        ("abc", "Invalid value for '--penalty-rows'"),
        ("1.5", "Invalid value for '--penalty-rows'"),
    ],
)
def test_bad_penalty_rows_on_the_command_line(tiny, command, value, message, capsys):
    # the entry point (attn_core.cli.main, what `attn-lab` runs), in this process
    flag = "--grid" if command == "sweep" else "--reg"
    with pytest.raises(SystemExit) as e:
        main([command, tiny, flag, "entropy=0.1", "--penalty-rows", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err


def test_the_help_names_the_option():
    for command in ("retrain", "sweep"):
        res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert "--penalty-rows" in res.stdout and "unbiased" in res.stdout


# --- a sweep's trials -----------------------------------------------------------------------------


def test_a_sweep_trial_passes_penalty_rows(tiny):
    plan = grid_plan(tiny, ["entropy=0.5"], steps=3, device="cpu", penalty_rows=4)
    assert plan.job["penalty_rows"] == 4
    assert all(t.job_config(plan.job).penalty_rows == 4 for t in plan.trials)
    trial = next(t for t in plan.trials if t.reg == "entropy")
    payload = run_trial(trial.to_dict(), plan.job)  # what a Ray worker runs
    assert payload["status"] == "completed", payload.get("message")
    assert payload["config"]["penalty_rows"] == 4
    assert payload["card"]["penalty"] == {"rows": 4, "positions": T, "estimate": "sampled"}
    store = RunStore()
    sweep_id, _ = start_sweep(plan, store)
    run_id = record_trial(store, sweep_id, payload)
    assert store.load_model(run_id).card.details["penalty"]["rows"] == 4


# --- a retrain on text ----------------------------------------------------------------------------


def test_a_text_retrain_samples_rows(tmp_path):
    pytest.importorskip("transformers")
    from tests.conftest import write_tiny_hf
    from tests.text_corpus import make_text, write_word_tokenizer

    folder = tmp_path / "model"
    folder.mkdir()
    write_tiny_hf(folder, "mistral", num_key_value_heads=1, sliding_window=5)  # a sliding window: rows see 5 keys
    write_word_tokenizer(folder)
    text = tmp_path / "text.txt"
    text.write_text(make_text(0, lines=60))
    args = ["retrain", str(folder), "--text", str(text), "--block", "16", "--reg", "entropy=0.1", "--steps", "2"]
    res = CliRunner().invoke(app, [*args, "--penalty-rows", "4", "--batch-size", "4", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["status"] == "completed" and out["penalty"] == {"rows": 4, "positions": 16, "estimate": "sampled"}
    card = RunStore().load_model(out["run_id"]).card
    assert card.details["penalty"]["estimate"] == "sampled" and card.details["job"]["penalty_rows"] == 4
