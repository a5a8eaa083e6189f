"""attn_core.sweep: the grid, the Pareto frontier, and sweeps on a local Ray (2 CPUs, started once
for the module and shut down after it): a 4-trial sweep end to end through the CLI, a trial equal
to `attn-lab retrain` (1e-6, one torch thread), a failing trial recorded while the others go on,
and a resume that reruns only the unfinished trials."""

import json
import math

import pytest
import torch
import typer
from safetensors.torch import load_file
from typer.testing import CliRunner

from attn_core.runs import RunStore
from attn_core.sweep import (
    BASELINE,
    SweepError,
    SweepPlan,
    Trial,
    grid_plan,
    pareto,
    parse_grid,
    record_trial,
    run_sweep,
    run_trial,
    start_sweep,
)

MODEL = "reverse-1l"  # the smallest zoo model
ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # starts a local Ray: one test worker runs these in turn (tests/conftest.py)


def sweep_cli() -> typer.Typer:
    """The CLI with the sweep group merged in (as attn_core.cli registers it)."""
    from attn_core.cli import runs as runs_group
    from attn_core.cli import sweep

    app = typer.Typer(add_completion=False)
    app.add_typer(sweep.app)
    app.add_typer(runs_group.app)
    app.add_typer(sweep.sweeps_app, name="sweeps")
    return app


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


# --- no Ray needed --------------------------------------------------------------------------------


def test_grid_and_plan():
    assert parse_grid(["entropy=0.01,0.1,1", "hoyer=0.1,1", "entropy=1"]) == {
        "entropy": [0.01, 0.1, 1.0],
        "hoyer": [0.1, 1.0],
    }
    plan = grid_plan(MODEL, ["entropy=0.1,1", "topk:2@L0=0.5"], seeds=3, steps=7)
    assert len(plan.trials) == 3 * (1 + 3)
    assert sum(t.reg == BASELINE for t in plan.trials) == 3 and {t.seed for t in plan.trials} == {0, 1, 2}
    t = plan.trials[1]
    cfg = t.job_config(plan.job)
    assert (cfg.source, cfg.steps, cfg.seed, cfg.to_dict()["regularizers"]) == (MODEL, 7, 0, ["entropy=0.1"])
    assert SweepPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert Trial.from_dict(t.to_dict()).key == t.key


@pytest.mark.parametrize(
    "grid, msg",
    [
        ([], "the grid is empty"),
        (["foo=0.1"], "unknown regularizer 'foo'"),
        (["entropy=abc"], "not a number > 0"),
        (["entropy=-1"], "not a number > 0"),
        (["entropy=nan"], "not a number > 0"),
        (["entropy"], "NAME=LAMBDA"),
        (["topk:x=1"], "topk"),
    ],
)
def test_bad_grid_is_one_sentence(grid, msg):
    with pytest.raises(SweepError, match=msg) as e:
        grid_plan(MODEL, grid)
    assert "\n" not in str(e.value)


def test_pareto():
    pts = [("a", 1.0, 0.5), ("b", 0.9, 0.2), ("c", 0.8, 0.3), ("d", 1.0, 0.6), ("e", 0.5, math.nan)]
    assert pareto(pts) == ["b", "a"]


@pytest.mark.parametrize("reg, lam", [("entropy", 0.1), (BASELINE, 0.0)])
def test_with_asha_a_trials_last_step_is_only_in_its_final_report_and_a_baseline_reports_none_before(
    reg, lam, monkeypatch
):
    """ASHA stops a trial whose report reaches max_t: an intermediate report of the last step used
    to end a trial that had trained every step as "stopped early" before its final report (with
    its measurements) came; and ASHA could stop the lambda = 0 baseline, which a sweep's Pareto
    frontier needs."""
    from ray import tune

    from attn_core.sweep import ray_backend

    reports = []
    monkeypatch.setattr(tune, "report", lambda metrics: reports.append(metrics))
    steps = 20
    trial = Trial(MODEL, reg, lam, 0).to_dict()
    ray_backend._trainable({"trial": trial, "job": {"steps": steps}, "report_every": 2, "steps": steps})
    early, final = reports[:-1], reports[-1]
    assert final["final"] and final["step"] == steps and final["payload"]["status"] == "completed"
    assert all(r["step"] < steps and not r["final"] for r in early)
    if not lam:
        assert early == []  # ASHA never reads the baseline's loss before its end


# --- on Ray ---------------------------------------------------------------------------------------


def test_four_trial_sweep_end_to_end_and_trial_equals_retrain(local_ray, tmp_path):
    runner = CliRunner()
    out = runner.invoke(
        sweep_cli(), ["sweep", MODEL, "--grid", "entropy=0.1,1", "--grid", "hoyer=1", "--steps", "12", "--json"]
    )
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    assert res["backend"] == "ray-tune" and res["ray_version"] == ray.__version__ and res["wall_s"] > 0
    assert [(t["reg"], t["lambda"], t["seed"]) for t in res["trials"]] == [
        (BASELINE, 0.0, 0),
        ("entropy", 0.1, 0),
        ("entropy", 1.0, 0),
        ("hoyer", 1.0, 0),
    ]
    assert all(t["status"] == "completed" and t["after"]["accuracy"] >= 0 for t in res["trials"])
    assert res["pareto"] and set(res["pareto"]) <= {t["run_id"] for t in res["trials"]}

    store = RunStore()
    listed = {r["id"]: r for r in store.list_runs()}  # every trial is a run like any other (Runs page, picker)
    assert all(
        listed[t["run_id"]]["has_weights"] and listed[t["run_id"]]["sweep"] == res["sweep_id"] for t in res["trials"]
    )
    sweeps = json.loads(runner.invoke(sweep_cli(), ["sweeps", "--json"]).stdout)
    assert [(s["id"], s["status"], s["recorded"]) for s in sweeps] == [(res["sweep_id"], "completed", 4)]
    shown = json.loads(runner.invoke(sweep_cli(), ["sweeps", "show", res["sweep_id"], "--json"]).stdout)
    assert [t["run_id"] for t in shown["trials"]] == [t["run_id"] for t in res["trials"]]

    # the entropy=0.1 trial (trained on a Ray worker, one torch thread) equals attn-lab retrain
    trial = res["trials"][1]
    torch.set_num_threads(1)
    ref = json.loads(
        runner.invoke(
            sweep_cli(), ["retrain", MODEL, "--reg", "entropy=0.1", "--steps", "12", "--seed", "0", "--json"]
        ).stdout
    )
    for k, v in ref["after"].items():
        assert trial["after"][k] == pytest.approx(v, abs=1e-6), k
    a = load_file(store.path(trial["run_id"]) / "model.safetensors")
    b = load_file(store.path(ref["run_id"]) / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    loaded = store.load_model(trial["run_id"])
    assert loaded.name == f"run:{trial['run_id']}" and loaded.card.parent == MODEL
    assert len(store.metrics(trial["run_id"])) > 0


def test_failing_trial_is_recorded_and_the_sweep_goes_on(local_ray):
    """A trial that fails on its worker (here heads the model lacks: run_sweep refuses such a grid
    before anything starts, so the trials go to the Ray backend directly) is handed over as
    failed and recorded; the other trials go on."""
    from attn_core.sweep.ray_backend import run_tune

    plan = grid_plan(MODEL, ["entropy=0.1"], steps=5, measure_samples=64)
    base, bad = plan.trials[0], Trial(MODEL, "entropy@L9", 0.1, 0)  # this model has one layer
    store = RunStore()
    sweep_id, _ = start_sweep(plan, store)
    seen = []
    run_tune([base.to_dict(), bad.to_dict()], plan.job, seen.append, steps=5)
    assert sorted(p["status"] for p in seen) == ["completed", "failed"]
    failed = next(p for p in seen if p["status"] == "failed")
    assert "L9" in failed["message"]
    run_ids = [record_trial(store, sweep_id, p) for p in seen]
    assert sorted(store.get(r)["status"] for r in run_ids) == ["completed", "failed"]


def test_resume_reruns_only_unfinished_trials(local_ray):
    store = RunStore()
    plan = grid_plan(MODEL, ["entropy=0.5"], seeds=2, steps=4, measure_samples=64)
    sweep_id, _ = start_sweep(plan, store)
    first = plan.trials[0]
    record_trial(store, sweep_id, run_trial(first.to_dict(), plan.job))  # as if the sweep stopped after one
    seen = []
    res = run_sweep(None, store, resume=sweep_id, on_trial=lambda run_id, payload: seen.append(payload["key"]))
    assert sorted(seen) == sorted(t.key for t in plan.trials[1:])
    assert res["sweep_id"] == sweep_id and res["status"] == "completed"
    assert len(store.get_sweep(sweep_id)["runs"]) == len(plan.trials)
    again = run_sweep(None, store, resume=sweep_id, on_trial=lambda *a: pytest.fail("a finished trial ran again"))
    assert [t["run_id"] for t in again["trials"]] == [t["run_id"] for t in res["trials"]]
