"""Sweeps on text (attn-lab sweep FOLDER --text PATH --grid ...) on a local Ray (2 CPUs, shut down
after the module): the text is checked and tokenized once before any trial, each trial retrains
the imported model on it, and the runs carry perplexity, their family and their tokenizer; bad
text is refused before Ray starts."""

import json

import pytest
from typer.testing import CliRunner

from attn_core.cli import app
from attn_core.runs import RunStore
from attn_core.sweep import grid_plan
from tests.conftest import write_tiny_hf
from tests.text_corpus import make_text, write_word_tokenizer

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # starts a local Ray: one test worker runs these in turn (tests/conftest.py)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.fixture
def folder(tmp_path):
    f = tmp_path / "tiny-qwen2"
    write_tiny_hf(f, "qwen2", num_key_value_heads=2)
    write_word_tokenizer(f)
    (tmp_path / "text.txt").write_text(make_text(0, 60))
    return f


def test_text_paths_become_absolute_in_the_plan(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = grid_plan("m", ["entropy=0.1"], text="t.txt", eval_text="h.txt", block=8, train="qk", kl=0.5)
    assert plan.job == {
        "text": str(tmp_path / "t.txt"),
        "eval_text": str(tmp_path / "h.txt"),
        "block": 8,
        "train": "qk",
        "kl": 0.5,
    }
    assert plan.trials[1].job_config(plan.job).text == str(tmp_path / "t.txt")


def test_a_sweep_on_text_records_runs_with_perplexity(local_ray, folder, tmp_path):
    args = ["sweep", str(folder), "--text", str(tmp_path / "text.txt"), "--block", "8", "--steps", "3"]
    res = CliRunner().invoke(app, [*args, "--grid", "entropy@L1=0.1", "--kl", "0.1", "--json"])
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["status"] == "completed" and [t["status"] for t in out["trials"]] == ["completed", "completed"]
    for t in out["trials"]:
        assert t["after"]["perplexity"] > 1 and t["before"]["perplexity"] > 1
    assert out["pareto"]  # held-out perplexity against data entropy
    store = RunStore()
    for t in out["trials"]:
        run = store.get(t["run_id"])
        assert run["task"] == "text" and run["config"]["text"] == str(tmp_path / "text.txt")
        assert run["card"]["hf"]["model_type"] == "qwen2" and run["card"]["trained"]["kl"] == 0.1
        assert (store.path(t["run_id"]) / "tokenizer.json").is_file()
    human = CliRunner().invoke(app, ["sweeps", "show", out["sweep_id"]])
    assert "perplexity" in human.stdout and "held-out perplexity down" in human.stdout


def test_bad_text_is_refused_before_ray_starts(folder, tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"w1 \xff w2")
    res = CliRunner().invoke(app, ["sweep", str(folder), "--text", str(tmp_path / "bad.txt"), "--grid", "entropy=0.1"])
    assert res.exit_code == 2 and "not UTF-8 text" in res.stderr.strip().splitlines()[-1]
    assert RunStore().list_sweeps() == []
    no_text = CliRunner().invoke(app, ["sweep", str(folder), "--grid", "entropy=0.1"])
    assert no_text.exit_code == 2 and "give --text PATH" in no_text.stderr
