"""The front door (attn_core.api, docs/python.md): its doctests run, ``import attn_core`` stays
light, one model type that every function takes, DataFrames with the columns of the CLI's
``--json``, a view's figure that Jupyter draws, and a retrain whose result can be compared."""

from __future__ import annotations

import doctest
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import attn_core as al
from attn_core import bilinear as bl
from attn_core.cli import app

ROOT = Path(__file__).resolve().parents[2]
# every module whose public functions carry the front door's >>> examples
DOCTESTED = ["attn_core.api", "attn_core.api_surgery", "attn_core.model.qk_form", "attn_core.bilinear.heads"]


@pytest.fixture(scope="module")
def m():
    return al.load("induction-2l")


@pytest.mark.parametrize("module", DOCTESTED)
def test_the_examples_run(module, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what an example writes lands here
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0, result


@pytest.mark.parametrize("module", ["attn_core.api", "attn_core.api_surgery"])
def test_every_public_function_has_an_example(module):
    api = importlib.import_module(module)
    for name in api.__all__:
        obj = getattr(api, name)
        doc = obj.__doc__ or ""
        methods = (
            [getattr(obj, k).__doc__ or "" for k in vars(obj) if not k.startswith("_")] if isinstance(obj, type) else []
        )
        assert ">>>" in doc or any(">>>" in d for d in methods), f"{name} has no >>> example"


def _run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_importing_the_front_door_loads_no_torch_and_the_packages_stay_packages():
    out = _run(
        "import sys, types\n"
        "import attn_core as al\n"
        "print('torch' in sys.modules, callable(al.load), 'torch' in sys.modules)\n"
        "from attn_core import circuits, dynamics\n"
        "print(isinstance(circuits, types.ModuleType), callable(circuits), circuits.ov_form.__name__)\n"
        "print(al.circuits is circuits, al.dynamics is dynamics)\n"
        "print(al.bilinear.qk_form.__name__, hasattr(al, 'no_such_name'), hasattr(al, 'a.b'))"
    )
    assert out.splitlines() == ["False True True", "True True ov_form", "True True", "qk_form False False"]
    # the other order: the package first, then the function
    out = _run(
        "import attn_core.circuits.ov\nimport attn_core as al\nprint(al.circuits('induction-2l', samples=4).columns[2])"
    )
    assert out == "copying_score"


def test_every_function_takes_either_model_object(m):
    t = m.model
    for a, b in ((m, t), (t, m)):
        assert torch.equal(bl.layer_form(a, 1).dense, bl.layer_form(b, 1).dense)
        assert bl.spectrum_rows(a) == bl.spectrum_rows(b)
        assert torch.equal(bl.sequence_view(a, [1, 2, 3], 1).scores, bl.sequence_view(b, [1, 2, 3], 1).scores)
    assert al.Model.of(t).cfg is t.cfg
    with pytest.raises(TypeError, match="takes a model"):
        bl.spectrum_rows("induction-2l ")


def test_heads_are_the_libraries_forms(m):
    form = m.QK[1, 2]
    want = m.model.blocks[1].attn
    B = want.W_Q[2] @ want.W_K[2].T / want.W_Q.shape[-1] ** 0.5  # independent dense B
    assert torch.allclose(form.B, B.detach(), atol=1e-6)
    assert torch.allclose(form.singular_values, torch.linalg.svdvals(B.detach())[:16], atol=1e-5)
    U, S, Vh = form.svd()
    assert torch.allclose(U @ torch.diag(S) @ Vh, B.detach(), atol=1e-5)
    assert not form.B.requires_grad
    assert torch.allclose(form.at_offset(5).B, form.B)  # learned positions: B does not depend on delta
    OV = want.W_V[2] @ want.W_O[2]
    assert torch.allclose(m.OV[1, 2].B, OV.detach(), atol=1e-6)
    with pytest.raises(ValueError, match="layer 2 is outside 0..1"):
        m.QK[2, 0]
    with pytest.raises(IndexError, match=r"\[layer, head\]"):
        m.QK[1]
    with pytest.raises(ValueError, match="at_offset needs"):
        bl.QKForm(dense=B).at_offset(1)


def test_at_offset_is_the_rotary_form(tiny_model):
    t = tiny_model(task="reverse", positional="rotary", std=0.3)
    form = al.Model.of(t).QK[0, 1]
    assert torch.allclose(form.at_offset(3).B, bl.layer_form(t, 0, offset=3)[1].dense.detach())
    assert not torch.allclose(form.at_offset(3).B, form.B)


def _cli(*args):
    result = CliRunner().invoke(app, [*map(str, args), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_frames_have_the_columns_of_the_cli_json(m):
    doc = _cli("spectrum", "induction-2l", "--samples", 4)
    df = al.spectrum(m, samples=4)
    assert list(df.columns) == list(doc[0]) and len(df) == len(doc)
    assert df.stable_rank.tolist() == pytest.approx([r["stable_rank"] for r in doc])
    doc = _cli("sinks", "induction-2l", "--samples", 4)
    df = al.sinks(m, samples=4)
    assert list(df.columns) == list(doc["heads"][0]) and df.attrs["rate"] == pytest.approx(doc["rate"])
    doc = _cli("heads", "induction-2l", "--samples", 4)
    df = al.heads(m, samples=4)
    assert list(df.columns) == list(doc["heads"][0]) and df.attrs["best"] == doc["best"]
    doc = _cli("circuits", "induction-2l", "--samples", 8)
    df = al.circuits(m, samples=8)
    assert list(df.columns) == list(doc["heads"][0])
    assert df.copying_score.tolist() == pytest.approx([h["copying_score"] for h in doc["heads"]])


def test_a_view_draws_itself_in_a_notebook_and_exports_like_the_cli(m, tmp_path):
    v = al.view(m, "a b c d a b c", layer=1)
    assert v.queries == [f"{i}:{t}" for i, t in enumerate("abcdabc")]
    plot = v.plot(head=2, value="pattern")
    assert plot.name == "sequence_pattern_L1H2"
    assert "<div" in plot._repr_html_() and plot.fig.data[0].type == "heatmap"
    path = plot.save(tmp_path / "p.csv")
    assert path.read_text().splitlines()[0] == plot.data.to_csv(index=False).splitlines()[0]
    with pytest.raises(Exception, match="already exists"):
        plot.save(tmp_path / "p.csv")
    assert al.view(m, [1, 2, 3], layer=0).token_ids == [1, 2, 3]


def test_retrain_saves_a_run_and_compares(m):
    r = al.retrain(m, reg={"entropy": 0.1}, steps=4, save=True, progress=False, eval_every=2, measure_samples=16)
    assert r.status == "completed" and r.run_id and r.model.name == f"run:{r.run_id}"
    assert isinstance(r.model, al.Model) and r.model.card.task == "induction"
    assert "loss" in r.log.columns and r.log.step.max() == 4
    cmp = r.compare()
    assert {"head", "entropy_data_before", "entropy_data_after"} <= set(cmp.columns) and len(cmp) == 8
    again = al.retrain(r.model, steps=2, progress=False, measure_samples=16)  # a run retrains from its run id
    assert again.status == "completed" and again.run_id is None and again.model.card.task == "induction"
    with pytest.raises(ValueError, match="save=True"):
        al.retrain(again.model, steps=2, progress=False)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        al.retrain(m, steps=0, progress=False)


# functions of the checks that read only .cfg, which both objects have (LoadedModel.cfg)
CFG_ONLY = {
    "check_layer",
    "check_heads",
    "check_tokens",
    "check_ids",
    "longest_dense_view",
    "visible_keys",
    "bilinear_problem",
}


def test_every_model_function_converts_its_model_at_the_top():
    """A public function of bilinear/ or circuits/ whose first argument is the model converts it
    with check_model or check_loaded (so that a new one takes either object too)."""
    import ast

    missing = []
    for path in sorted((ROOT / "attn_core").glob("[bc]i[lr]*/*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or not node.args.args:
                continue
            if node.args.args[0].arg in ("model", "loaded") and node.name not in CFG_ONLY:
                if "check_model(" not in ast.unparse(node) and "check_loaded(" not in ast.unparse(node):
                    missing.append(f"{path.name}:{node.name}")
    assert len(list((ROOT / "attn_core").glob("[bc]i[lr]*/*.py"))) > 15
    assert missing == []


def test_edit_and_diff_give_what_the_cli_gives(m, tmp_path):
    """al.edit's before/after are `attn-lab edit --json`'s; al.diff's rows are `attn-lab diff --json`'s pairs,
    and an edit that leaves B unchanged elsewhere is matched head to head."""
    from typer.testing import CliRunner

    r = al.edit(m, (1, 0), rank=2, samples=8)
    run = CliRunner().invoke(app, ["edit", "induction-2l", "--head", "L1H0", "--rank", "2", "--samples", "8", "--json"])
    cli = json.loads(run.stdout)
    assert r.before["loss"] == pytest.approx(cli["before"]["loss"], rel=1e-6)
    assert r.after["loss"] == pytest.approx(cli["after"]["loss"], rel=1e-6)
    assert r.after["heads"]["L1H0"]["sigma_1"] == pytest.approx(cli["after"]["heads"]["L1H0"]["sigma_1"], rel=1e-6)
    d = al.diff(m, r.model)
    assert list(d.columns) == ["layer", "head_a", "head_b", "distance"]
    assert (d.head_a == d.head_b).all()
    edited = d[(d.layer == 1) & (d.head_a == 0)].distance.item()
    assert edited > 1e-3 and d.drop(d[(d.layer == 1) & (d.head_a == 0)].index).distance.max() < 1e-6
    assert d.attrs["distance"].startswith("relative Frobenius")
    saved = r.save(tmp_path / "edited")
    assert saved["format"] == "attn-lab" and al.diff(r.model, str(tmp_path / "edited")).distance.max() < 1e-6
