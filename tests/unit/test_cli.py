"""The attn-lab command, run as a user runs it (a subprocess), JSON parsed."""

import json
import subprocess
import sys

import pytest

from attn_core import zoo
from attn_core.sources import resolve


def run(*args, ok=True):
    proc = subprocess.run([sys.executable, "-m", "attn_core", *args], capture_output=True, text=True, timeout=300)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_zoo_json():
    rows = json.loads(run("zoo", "--json").stdout)
    assert {r["name"] for r in rows} == {m["name"] for m in zoo.list_models()}
    for r in rows:
        assert set(r) == {
            "name",
            "task",
            "n_layers",
            "n_heads",
            "d_model",
            "d_head",
            "qk",
            "d_mlp",
            "params",
            "accuracy",
            # what a list of models shows of each card (the Home page lists from these, loading nothing)
            "description",
            "steps",
            "wall_time_s",
            "seed",
            "command",
            "preset",
        }


def test_eval_json():
    name = zoo.list_models()[0]["name"]
    out = json.loads(run("eval", name, "--samples", "64", "--seed", "3", "--json").stdout)
    assert out["name"] == name and 0 <= out["accuracy"] <= 1 and out["loss"] >= 0
    human = run("eval", name, "--samples", "64", "--seed", "3").stdout  # without --json: one line, no JSON
    assert human.startswith(f"{name} (") and "accuracy" in human and "{" not in human and len(human.splitlines()) == 1


def test_train_json_saves_a_loadable_model(tmp_path):
    out = tmp_path / "rev"
    res = json.loads(
        run(
            "train",
            "--preset",
            "reverse-1l",
            "--out",
            str(out),
            "--steps",
            "30",
            "--seed",
            "1",
            "--device",
            "cpu",
            "--json",
        ).stdout
    )
    assert res["steps"] == 30 and res["seed"] == 1 and res["out"] == str(out)
    assert "attn-lab train --preset reverse-1l" in res["command"]
    loaded = resolve(out)
    assert loaded.card.metrics["accuracy"] == res["metrics"]["accuracy"]
    again = run("train", "--preset", "reverse-1l", "--out", str(out), "--steps", "5", "--json", ok=False)
    assert again.returncode == 2 and "already exists" in again.stderr


@pytest.mark.parametrize(
    "args, msg",
    [
        (["eval", "no-such-model", "--json"], "known models"),
        (["eval", "x", "--samples", "0"], "--samples"),
        (["train", "--preset", "nope", "--json"], "unknown preset"),
        (["train", "--preset", "reverse-1l", "--steps", "0"], "--steps"),
        (["train", "--preset", "reverse-1l", "--steps", "3", "--device", "tpu"], "device"),
    ],
)
def test_bad_input_is_one_clear_line(args, msg):
    proc = run(*args, ok=False)
    assert proc.returncode == 2
    assert msg in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--out", "{taken}"], "already exists; choose a new path (nothing was overwritten)"),
        (["--out", "{new}", "--model", "nosuch"], "no model named 'nosuch'"),
        (["--out", "{new}", "--imported", "{taken}"], "{taken}"),
    ],
)
def test_gallery_refuses_bad_input_before_drawing_anything(tmp_path, extra, message):
    """`attn-lab gallery` (the whole run is the gallery browser test's): a destination that exists
    or a model that does not is one line, exit 2, and nothing is written."""
    taken, new = tmp_path / "taken", tmp_path / "new"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    fill = {"taken": str(taken), "new": str(new)}
    proc = run("gallery", "--quick", *[a.format(**fill) for a in extra], ok=False)
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and line.startswith("error: ") and message.format(**fill) in line, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not new.exists() and [p.name for p in taken.iterdir()] == ["keep.txt"]


def test_the_readmes_table_of_commands_names_every_command():
    """The README's table of commands ("The command line") names every command ``attn-lab --help`` lists."""
    import re
    from pathlib import Path

    from typer.testing import CliRunner

    from attn_core.cli import app

    listed = re.findall(r"^  ([a-z][a-z-]+)  ", CliRunner().invoke(app, ["--help"]).stdout, re.M)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    overview = readme.split("\n## The command line\n", 1)[1].split("\n## ", 1)[0]
    assert len(listed) > 20
    missing = [c for c in listed if f"`{c}`" not in overview]
    assert not missing, f"the README's table of commands leaves out {missing}"
