"""`attn-lab dynamics` on damaged checkpoints (each skipped with its reason, the others measured),
and `--animate` held to the output rule of every command (checked before any work)."""

import json
import os
import shutil
from pathlib import Path

import pytest

from attn_core import dynamics as D
from attn_core.destinations import SHIPPED
from tests.conftest import cli_main
from tests.damaged import KINDS, damage_all, model_with_checkpoints

cli = cli_main


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return model_with_checkpoints(tmp_path_factory.mktemp("pristine") / "model", steps=len(KINDS) + 1)


@pytest.fixture
def model(pristine, tmp_path):
    return Path(shutil.copytree(pristine, tmp_path / "model"))


def test_damaged_checkpoints_are_skipped_each_with_its_reason(model, capsys):
    said = damage_all(model)
    code, out, err = cli(capsys, "dynamics", str(model), "--samples", "8", "--detector-samples", "4", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["steps"] == [0, len(KINDS) + 1]  # the two left whole, measured
    assert all(len(v) == 2 for v in res["metrics"].values())
    for step, words in said.items():
        assert any(s["step"] == step and words in s["reason"] for s in res["skipped"]), (step, res["skipped"])
        assert f"skipped step {step} (" in err
    assert "Traceback" not in err


def test_when_no_checkpoint_can_be_read_it_is_one_line(model, capsys):
    for f in (model / "checkpoints").glob("step-*.safetensors"):
        f.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    code, _, err = cli(capsys, "dynamics", str(model))
    assert code == 2 and "has no checkpoint file in" in err and "can be read (first: step 0" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("where", ["zoo", "measured", "run folder", "link", "exists"])
def test_animate_follows_the_output_rule_before_any_work(model, tmp_path, capsys, where):
    source = model
    if where == "measured":  # a checkpoints folder alone (a run still training has no model folder yet)
        source = Path(shutil.copytree(model / "checkpoints", tmp_path / "bare"))
    target = {
        "zoo": SHIPPED / "models" / "induction-2l" / "anim.html",
        "measured": source / "anim.html",
        "run folder": model / "anim.html",
        "link": tmp_path / "link.html",
        "exists": tmp_path / "there.html",
    }[where]
    if where == "link":
        target.symlink_to(tmp_path / "elsewhere.html")
    if where == "exists":
        target.write_text("mine")
    code, _, err = cli(capsys, "dynamics", str(source), "--animate", str(target))
    assert code == 2 and err.count("\n") == 1, err
    words = {"zoo": "inside the shipped assets/", "measured": "which is being measured",
             "run folder": "inside the model folder", "link": "is a link", "exists": "already exists"}[where]  # fmt: skip
    assert words in err
    assert not D.MetricCache().folder.exists()  # nothing was measured
    assert target.is_symlink() or (target.exists() and target.read_text() == "mine") or not target.exists()
    if where == "zoo":
        assert not os.path.lexists(target)
