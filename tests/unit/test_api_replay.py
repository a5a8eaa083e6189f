"""A replay of the Python front door as a hostile user of ``import attn_core as al``:
values the table walk (test_api_hostile.py) leaves out (keyword typos, extra positional
arguments, nested containers, numpy 0-d arrays and bools, torch tensors as indices, negative
zero, subnormal floats, NUL and newlines in strings, /dev/null, fifos and folders as paths, long
and unicode names, duplicated heads, indices out of range by one, huge integers, NaN in dict
values, a Hugging Face folder made by transformers, one model object used twice, a model
changed between calls, results used after the file they came from is gone). Each case is the
call and what must happen: a refusal (ValueError, TypeError, KeyError or IndexError) of one line
of at most 400 characters naming the argument, an answer checked against an independent
computation, or a write refused with nothing written."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import attn_core as al
from attn_core import checkpoint, destinations
from attn_core.surgery import HeadEdit
from attn_core.zoo import ZOO_DIR
from tests.conftest import make_tiny_model
from tests.refusals import ALLOWED, MAX_LINE, refuses


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))


@pytest.fixture(scope="module")
def m():
    return al.load("induction-2l")


@pytest.fixture(scope="module")
def view1(m):
    return al.view(m, layer=1)


@pytest.fixture(scope="module")
def plot(view1):
    return view1.plot(head=0)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return checkpoint.save(make_tiny_model(), tmp_path_factory.mktemp("models") / "m")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    from tests.conftest import write_tiny_hf

    folder = tmp_path_factory.mktemp("hf") / "llama"
    write_tiny_hf(folder, "llama")
    return folder


@pytest.fixture
def shipped_untouched(monkeypatch):
    monkeypatch.delenv(destinations.WRITE_ZOO, raising=False)
    before = sorted(str(p) for p in ZOO_DIR.rglob("*"))
    yield
    assert sorted(str(p) for p in ZOO_DIR.rglob("*")) == before


# --- keyword typos and extra positional arguments ----------------------------------------------------

TYPOS = {
    "spectrum-sampels": (lambda m: al.spectrum(m, sampels=2), "sampels"),
    "sinks-sampels": (lambda m: al.sinks(m, sampels=2), "sampels"),
    "sinks-epsilon": (lambda m: al.sinks(m, samples=2, epsilon=0.1), "epsilon"),
    "heads-sampels": (lambda m: al.heads(m, sampels=2), "sampels"),
    "heads-lenght": (lambda m: al.heads(m, samples=2, lenght=4), "lenght"),
    "circuits-sampels": (lambda m: al.circuits(m, sampels=2), "sampels"),
    "view-layers": (lambda m: al.view(m, layers=1), "layers"),
    "view-extra-positional": (lambda m: al.view(m, None, 1, None, 5), "view"),
    "retrain-stpes": (lambda m: al.retrain(m, stpes=1, progress=False), "stpes"),
    "retrain-regs": (lambda m: al.retrain(m, regs={"entropy": 0.1}, steps=1, progress=False), "regs"),
    "retrain-extra-positional": (lambda m: al.retrain(m, None, 1, None, False, False, 7), "retrain"),
    "edit-rnak": (lambda m: al.edit(m, "L1H0", rnak=1), "rnak"),
    "diff-layer": (lambda m: al.diff(m, m, layer=[0]), "layer"),
    "load-devcie": (lambda m: al.load("induction-2l", devcie="cpu"), "devcie"),
    "dynamics-lenght": (lambda m: al.dynamics(["induction-2l"], samples=2, lenght=4), "lenght"),
    "plot-heads": (lambda m: al.view(m, layer=1).plot(heads=0), "heads"),
    "save-over_write": (lambda m: al.view(m, layer=1).plot().save("x.csv", over_write=True), "over_write"),
}


@pytest.mark.parametrize("call, name", TYPOS.values(), ids=TYPOS.keys())
def test_a_misspelt_keyword_or_an_extra_argument_is_named(m, tmp_path, monkeypatch, call, name):
    monkeypatch.chdir(tmp_path)
    refuses(lambda: call(m), name)
    assert list(tmp_path.iterdir()) == []


# --- numpy 0-d arrays and bools, torch tensors, nested containers ---------------------------------------

REFUSED = {
    "QK-layer-0d-float-array": (lambda m: m.QK[np.array(1.0), 0], "layer"),
    "QK-layer-numpy-bool": (lambda m: m.QK[np.bool_(True), 0], "layer"),
    "QK-head-numpy-bool": (lambda m: m.QK[0, np.bool_(True)], "head"),
    "QK-layer-float-tensor": (lambda m: m.QK[torch.tensor(1.0), 0], "layer"),
    "QK-head-2-tensor": (lambda m: m.QK[0, torch.tensor([0, 1])], "head"),
    "QK-negative-zero": (lambda m: m.QK[-0.0, 0], "layer"),
    "QK-out-by-one-layer": (lambda m: m.QK[2, 0], "layer"),
    "QK-out-by-one-head": (lambda m: m.OV[1, 4], "head"),
    "QK-huge-head": (lambda m: m.QK[1, 10**400], "head"),
    "QK-slice": (lambda m: m.QK[0, :], "head"),
    "QK-ellipsis": (lambda m: m.QK[...], "head"),
    "view-layer-numpy-bool": (lambda m: al.view(m, layer=np.bool_(True)), "layer"),
    "view-layer-negative-zero": (lambda m: al.view(m, layer=-0.0), "layer"),
    "view-layer-out-by-one": (lambda m: al.view(m, layer=2), "layer"),
    "view-heads-nested": (lambda m: al.view(m, layer=1, heads=[[0, 1]]), "head"),
    "view-heads-numpy-bool": (lambda m: al.view(m, layer=1, heads=np.bool_(True)), "head"),
    "view-heads-bool-array": (lambda m: al.view(m, layer=1, heads=np.array([True, False])), "head"),
    "view-heads-out-by-one": (lambda m: al.view(m, layer=1, heads=[3, 4]), "head"),
    "view-heads-str": (lambda m: al.view(m, layer=1, heads="0"), "heads"),
    "view-heads-dict": (lambda m: al.view(m, layer=1, heads={0: 1}), "head"),
    "view-heads-set-of-floats": (lambda m: al.view(m, layer=1, heads={0.5}), "head"),
    "view-tokens-nested": (lambda m: al.view(m, [[1, 2]]), "text_or_tokens", "token"),
    "view-tokens-0d-array": (lambda m: al.view(m, np.array(3)), "text_or_tokens"),
    "view-tokens-bool-array": (lambda m: al.view(m, np.array([True, False])), "text_or_tokens", "token"),
    "view-tokens-2d-tensor": (lambda m: al.view(m, torch.tensor([[1, 2]])), "text_or_tokens"),
    "view-tokens-float-tensor": (lambda m: al.view(m, torch.tensor([1.0, 2.0])), "text_or_tokens", "token"),
    "view-tokens-out-by-one": (lambda m: al.view(m, [0, m.cfg.d_vocab]), "token"),
    "view-tokens-bytes": (lambda m: al.view(m, b"abc"), "text_or_tokens"),
    "view-tokens-nul": (lambda m: al.view(m, "a\x00b"), "text_or_tokens", "token", "text"),
    "view-tokens-too-many": (lambda m: al.view(m, [1] * (m.cfg.n_ctx + 1)), "token"),
    "spectrum-samples-numpy-bool": (lambda m: al.spectrum(m, samples=np.bool_(True)), "samples"),
    "spectrum-samples-0d-float": (lambda m: al.spectrum(m, samples=np.array(2.0)), "samples"),
    "spectrum-augmented-int": (lambda m: al.spectrum(m, augmented=1, samples=2), "augmented"),
    "spectrum-augmented-str": (lambda m: al.spectrum(m, augmented="no", samples=2), "augmented"),
    "spectrum-samples-huge": (lambda m: al.spectrum(m, samples=2**63), "samples"),
    "spectrum-variance-negative-zero": (lambda m: al.spectrum(m, samples=2, variance=-0.0), "variance"),
    "sinks-eps-negative-zero": (lambda m: al.sinks(m, samples=2, eps=-0.0), "eps"),
    "sinks-eps-numpy-nan": (lambda m: al.sinks(m, samples=2, eps=np.float64("nan")), "eps"),
    "sinks-eps-tensor": (lambda m: al.sinks(m, samples=2, eps=torch.tensor([0.1, 0.2])), "eps"),
    "sinks-eps-str": (lambda m: al.sinks(m, samples=2, eps="0.3"), "eps"),
    "heads-seed-huge": (lambda m: al.heads(m, samples=2, seed=2**64), "seed"),
    "heads-seed-negative-zero": (lambda m: al.heads(m, samples=2, seed=-0.0), "seed"),
    "circuits-samples-tensor": (lambda m: al.circuits(m, samples=torch.tensor(2.5)), "samples"),
    "circuits-seed-float": (lambda m: al.circuits(m, samples=2, seed=0.0), "seed"),
    "diff-layers-nested": (lambda m: al.diff(m, m, layers=[[0]]), "layers"),
    "diff-layers-out-by-one": (lambda m: al.diff(m, m, layers=[2]), "layer"),
    "diff-layers-str": (lambda m: al.diff(m, m, layers="0"), "layers"),
    "diff-layers-int": (lambda m: al.diff(m, m, layers=0), "layers"),
    "edit-head-list-pair": (lambda m: al.edit(m, [1, 0], rank=1, samples=2), "head"),
    "edit-head-nested": (lambda m: al.edit(m, ((1, 0),), rank=1, samples=2), "head"),
    "edit-head-out-by-one": (lambda m: al.edit(m, (1, 4), rank=1, samples=2), "head"),
    "edit-head-nul": (lambda m: al.edit(m, "L1\x00H0", rank=1, samples=2), "head"),
    "edit-head-unicode-digit": (lambda m: al.edit(m, "L\u00b9H0", rank=1, samples=2), "head"),
    "edit-rank-numpy-bool": (lambda m: al.edit(m, "L1H0", rank=np.bool_(True), samples=2), "rank"),
    "edit-rank-out-by-one": (lambda m: al.edit(m, "L1H0", rank=m.cfg.d_model + 1, samples=2), "rank"),
    "edit-rank-huge": (lambda m: al.edit(m, "L1H0", rank=10**30, samples=2), "rank"),
    "edit-drop-nested": (lambda m: al.edit(m, "L1H0", drop=[[0]], samples=2), "drop"),
    "edit-drop-negative": (lambda m: al.edit(m, "L1H0", drop=[-1], samples=2), "drop", "mode"),
    "edit-drop-out-by-one": (lambda m: al.edit(m, "L1H0", drop=[m.cfg.d_head], samples=2), "drop", "mode"),
    "edit-scale-numpy-nan": (lambda m: al.edit(m, "L1H0", scale={0: np.float64("nan")}, samples=2), "scale"),
    "edit-scale-inf": (lambda m: al.edit(m, "L1H0", scale={0: -math.inf}, samples=2), "scale"),
    "edit-scale-nested": (lambda m: al.edit(m, "L1H0", scale={0: [2.0]}, samples=2), "scale"),
    "edit-scale-str-factor": (lambda m: al.edit(m, "L1H0", scale={0: "2"}, samples=2), "scale"),
    "edit-scale-tensor-key": (lambda m: al.edit(m, "L1H0", scale={torch.tensor(0.5): 2.0}, samples=2), "scale"),
    "edit-scale-numpy-bool-factor": (lambda m: al.edit(m, "L1H0", scale={0: np.bool_(True)}, samples=2), "scale"),
    "edit-nothing": (lambda m: al.edit(m, "L1H0", samples=2), "rank", "drop", "scale", "ablate", "source", "edit"),
    "edit-source-head-out-by-one": (
        lambda m: al.edit(m, "L1H0", source=m, source_head="L2H0", samples=2),
        "source_head",
        "layer",
        "head",
    ),
    "edit-with_ov-numpy-int": (lambda m: al.edit(m, "L1H0", source=m, with_ov=np.int64(1), samples=2), "with_ov"),
    "retrain-reg-nested-nan": (
        lambda m: al.retrain(m, reg={"entropy": [math.nan]}, steps=1, progress=False),
        "reg",
        "strength",
    ),
    "retrain-reg-numpy-nan": (
        lambda m: al.retrain(m, reg={"entropy": np.float64("nan")}, steps=1, progress=False),
        "reg",
        "strength",
    ),
    "retrain-reg-negative": (
        lambda m: al.retrain(m, reg={"entropy": -0.1}, steps=1, progress=False),
        "reg",
        "strength",
    ),
    "retrain-reg-spec-nan": (lambda m: al.retrain(m, reg=["entropy=nan"], steps=1, progress=False), "reg", "strength"),
    "retrain-reg-spec-newline": (lambda m: al.retrain(m, reg=["entropy\n=0.1"], steps=1, progress=False), "reg"),
    "retrain-reg-tuple-pairs": (lambda m: al.retrain(m, reg=[("entropy", 0.1)], steps=1, progress=False), "reg"),
    "retrain-reg-dict-of-dict": (
        lambda m: al.retrain(m, reg={"entropy": {"weight": 0.1}}, steps=1, progress=False),
        "reg",
        "strength",
    ),
    "retrain-reg-tensor-weight": (
        lambda m: al.retrain(m, reg={"entropy": torch.tensor([0.1, 0.2])}, steps=1, progress=False),
        "reg",
        "strength",
    ),
    "retrain-steps-numpy-bool": (lambda m: al.retrain(m, steps=np.bool_(True), progress=False), "steps"),
    "retrain-steps-huge": (lambda m: al.retrain(m, steps=2**63, progress=False), "steps"),
    "retrain-steps-negative-zero": (lambda m: al.retrain(m, steps=-0.0, progress=False), "steps"),
    "retrain-lr-subnormal-negative": (lambda m: al.retrain(m, steps=1, lr=-5e-324, progress=False), "lr"),
    "retrain-lr-nan-numpy": (lambda m: al.retrain(m, steps=1, lr=np.float32("nan"), progress=False), "lr"),
    "retrain-heads-duplicated-out-by-one": (
        lambda m: al.retrain(m, steps=1, heads="L1H4", progress=False),
        "heads",
        "head",
    ),
    "retrain-heads-list": (lambda m: al.retrain(m, steps=1, heads=["L1H0"], progress=False), "heads"),
    "retrain-seed-numpy-bool": (lambda m: al.retrain(m, steps=1, seed=np.bool_(False), progress=False), "seed"),
    "retrain-unknown-setting": (lambda m: al.retrain(m, steps=1, learning_rate=0.1, progress=False), "learning_rate"),
    "load-newline": (lambda m: al.load("induction-2l\n"), "source", "model", "induction-2l"),
    "load-unicode-long": (lambda m: al.load("\u00e9" * 300), "source", "model"),
    "load-bytes": (lambda m: al.load(b"induction-2l"), "source"),
    "load-device-nul": (lambda m: al.load("induction-2l", device="cpu\x00"), "device"),
    "load-device-torch": (lambda m: al.load("induction-2l", device=torch.device("cpu")), "device"),
    "load-dev-null": (lambda m: al.load(Path("/dev/null")), "source", "model", "/dev/null"),
    "load-a-file": (lambda m: al.load(Path(__file__)), "source", "model", "test_api_replay"),
    "plot-head-numpy-bool": (lambda m: al.view(m, layer=1).plot(head=np.bool_(True)), "head"),
    "plot-head-tensor": (lambda m: al.view(m, layer=1).plot(head=torch.tensor(0.0)), "head"),
    "plot-query-out-by-one": (lambda m: al.view(m, layer=1).plot(query=len(al.view(m, layer=1).queries)), "query"),
    "plot-query-negative-zero": (lambda m: al.view(m, layer=1).plot(query=-0.0), "query"),
    "plot-value-upper": (lambda m: al.view(m, layer=1).plot(value="SCORES"), "value"),
    "plot-value-list": (lambda m: al.view(m, layer=1).plot(value=["scores"]), "value"),
    "frame-head-out-of-view": (lambda m: al.view(m, layer=1, heads=[0, 2]).frame(1), "head"),
    "frame-head-list": (lambda m: al.view(m, layer=1).frame([0, 1]), "head"),
    "row-query-huge": (lambda m: al.view(m, layer=1).row(0, 10**400), "query"),
    "row-query-float": (lambda m: al.view(m, layer=1).row(0, 1.0), "query"),
    "at_offset-huge": (lambda m: m.QK[1, 0].at_offset(10**400), "offset"),
    "at_offset-nan": (lambda m: m.QK[1, 0].at_offset(math.nan), "offset"),
    "at_offset-bool": (lambda m: m.QK[1, 0].at_offset(True), "offset"),
    "svd-extra-positional": (lambda m: m.QK[1, 0].svd(3), "svd"),
    "sink_keys-str": (lambda m: al.view(m, layer=1).sink_keys("0.3"), "eps"),
    "sink_keys-nan": (lambda m: al.view(m, layer=1).sink_keys(math.nan), "eps"),
    "concentration-eps-huge": (lambda m: al.view(m, layer=1).concentration(without_sinks=True, eps=10**400), "eps"),
    "headedit-float-layer": (lambda m: al.edit(m, [HeadEdit(1.0, 0, rank=1)], samples=2), "head"),
    "headedit-str-rank": (lambda m: al.edit(m, [HeadEdit(1, 0, rank="2")], samples=2), "rank"),
    "headedit-dict-scale": (lambda m: al.edit(m, [HeadEdit(1, 0, scale={0: 2.0})], samples=2), "scale"),
    "headedit-nan-scale": (lambda m: al.edit(m, [HeadEdit(1, 0, scale=((0, math.nan),))], samples=2), "scale"),
    "headedit-str-drop": (lambda m: al.edit(m, [HeadEdit(1, 0, drop="0")], samples=2), "drop"),
    "headedit-int-ablate": (lambda m: al.edit(m, [HeadEdit(1, 0, ablate=3)], samples=2), "ablate"),
    "headedit-nothing": (lambda m: al.edit(m, [HeadEdit(1, 0)], samples=2), "head"),
    "headedit-unknown-source": (lambda m: al.edit(m, [HeadEdit(1, 0, source="nope-model")], samples=2), "model"),
    "run_with_cache-list": (lambda m: m.model.run_with_cache([1, 2, 3]), "tokens"),
    "run_with_cache-float-tokens": (lambda m: m.model.run_with_cache(torch.tensor([[1.0, 2.0]])), "tokens"),
    "run_with_cache-out-of-vocabulary": (lambda m: m.model.run_with_cache(torch.tensor([[0, m.cfg.d_vocab]])), "token"),
    "run_with_cache-negative-token": (lambda m: m.model.run_with_cache(torch.tensor([[-1, 2]])), "token"),
    "run_with_cache-misspelt-filter": (lambda m: m.model.run_with_cache(torch.tensor([[1]]), names=None), "names"),
    "run_with_hooks-not-callable": (
        lambda m: m.model.run_with_hooks(torch.tensor([[1]]), fwd_hooks=[("blocks.0.attn.hook_pattern", 3)]),
        "fwd_hooks",
    ),
    "run_with_hooks-not-a-pair": (
        lambda m: m.model.run_with_hooks(torch.tensor([[1]]), fwd_hooks=["blocks.0.attn.hook_pattern"]),
        "fwd_hooks",
    ),
    "run_with_hooks-unknown-name": (
        lambda m: m.model.run_with_hooks(torch.tensor([[1]]), fwd_hooks=[("nonsense", lambda x, name: x)]),
        "nonsense",
    ),
    "run_with_hooks-bool-tokens": (lambda m: m.model.run_with_hooks(torch.tensor([[True]])), "tokens"),
    "model-of-dict": (lambda m: al.Model.of({"name": "induction-2l"}), "model"),
    "model-of-module": (lambda m: al.Model.of(torch.nn.Linear(2, 2)), "model"),
    "dynamics-list-of-non-str": (lambda m: al.dynamics([m], samples=2), "source", "model"),
    "dynamics-empty-list": (lambda m: al.dynamics([], samples=2), "source", "series", "model"),
    "dynamics-nested-list": (lambda m: al.dynamics([["induction-2l"]], samples=2), "source", "model"),
    "dynamics-cache-numpy-int": (lambda m: al.dynamics("induction-2l", cache=np.int64(1)), "cache"),
}


@pytest.mark.parametrize("call, names", [(c, n) for c, *n in REFUSED.values()], ids=REFUSED.keys())
def test_a_bad_value_is_refused_in_one_line_naming_it(m, call, names):
    refuses(lambda: call(m), *names)


# --- values that are fine are taken, with the right answer -------------------------------------------


def _B(m, layer: int, head: int) -> torch.Tensor:
    """B = W_Q W_K^T / sqrt(d_head) of one head, read from the attention weights themselves."""
    attn = m.model.blocks[layer].attn
    wq, wk = attn.W_Q[head].detach(), attn.per_head("W_K")[head].detach()
    return wq @ wk.T / math.sqrt(wq.shape[-1])


def test_numpy_and_torch_integers_index_a_head_like_ints(m):
    expected = m.QK[1, 0].B
    for layer, head in [(np.int32(1), np.uint8(0)), (np.array(1), np.array(0)), (torch.tensor(1), torch.tensor(0))]:
        assert torch.equal(m.QK[layer, head].B, expected)


def test_a_transplant_named_in_a_head_edit_loads_its_source(m):
    by_name = al.edit(m, [HeadEdit(1, 0, source="induction-2l", source_head=(1, 1))], samples=2)
    given = al.edit(m, "L1H0", source="induction-2l", source_head="L1H1", samples=2)
    assert torch.equal(by_name.model.QK[1, 0].B, given.model.QK[1, 0].B)
    assert torch.equal(by_name.model.QK[1, 0].B, m.QK[1, 1].B)


def test_a_views_row_takes_0d_tensors(m):
    v = al.view(m, [1, 2, 3], layer=1)
    assert v.row(torch.tensor(2), torch.tensor(1)).equals(v.row(2, 1))
    assert v.frame(np.array(2)).equals(v.frame(2))


def test_the_hook_doors_still_run_token_ids(m):
    tokens = torch.tensor([[1, 2, 3]])
    logits, cache = m.model.run_with_cache(tokens, "blocks.1.attn.hook_pattern")
    assert torch.allclose(logits, m.model(tokens)) and list(cache) == ["blocks.1.attn.hook_pattern"]
    assert torch.allclose(m.model.run_with_hooks(tokens.to(torch.int32)), logits)


def test_a_heads_form_is_its_weights_product(m):
    assert torch.allclose(m.QK[1, 2].B, _B(m, 1, 2), atol=1e-5)


def test_numpy_bools_are_switches(m):
    plain = al.spectrum(m, samples=2)
    assert al.spectrum(m, augmented=np.bool_(False), samples=2).equals(plain)


def test_token_ids_as_a_tensor_or_a_0d_integer_array_list(m):
    v = al.view(m, torch.tensor([1, 2, 3]), layer=1)
    w = al.view(m, [np.array(1), np.int16(2), torch.tensor(3)], layer=1)
    assert v.token_ids == w.token_ids == [1, 2, 3] and torch.equal(v.scores, w.scores)


def test_a_head_named_twice_is_refused(m):
    """A view of heads [2, 2, 0] would hold head 2 twice, and its frame every cell of head 2 twice."""
    refuses(lambda: al.view(m, [1, 2, 3], layer=1, heads=[2, 2, 0]), "heads")
    refuses(lambda: al.view(m, [1, 2, 3], layer=1, heads=np.array([1, 1])), "heads")


def test_duplicated_layers_of_a_diff_are_one_layer_each(m):
    assert len(al.diff(m, m, layers=[1, 1])) == 4


def test_subnormal_and_negative_zero_factors_are_numbers(m):
    e = al.edit(m, "L1H0", scale={0: -0.0, 1: 5e-324}, samples=2)
    before, after = m.QK[1, 0].singular_values, e.model.QK[1, 0].singular_values
    assert e.edits[0].scale == ((0, -0.0), (1, 5e-324))
    assert torch.allclose(after[:-2], before[2:], rtol=1e-4) and float(after[-2:].max()) < 1e-4 * float(before[0])


def test_a_head_name_is_read_as_the_cli_reads_it(m):
    assert al.edit(m, "l1h0", rank=1, samples=2).edits[0].label == "L1H0"


def test_a_mode_dropped_twice_is_dropped_once(m):
    once = al.edit(m, "L1H0", drop=[0], samples=2).model.QK[1, 0].B
    assert torch.equal(al.edit(m, "L1H0", drop=[0, 0], samples=2).model.QK[1, 0].B, once)


def test_the_same_model_object_twice(m):
    d = al.diff(m, m)
    assert float(d.distance.max()) < 1e-6
    e = al.edit(m, "L1H0", source=m, samples=2)  # a head transplanted onto itself: nothing changes
    assert torch.equal(e.model.QK[1, 0].B, m.QK[1, 0].B)
    assert abs(e.after["loss"] - e.before["loss"]) < 1e-6


def test_an_edit_leaves_its_model_as_it_was(m):
    before = {k: v.clone() for k, v in m.model.state_dict().items()}
    al.edit(m, "L1H0", ablate="zero", samples=2)
    assert all(torch.equal(v, before[k]) for k, v in m.model.state_dict().items())


def test_a_model_changed_between_calls_is_read_as_it_is_now(model_folder):
    mm = al.load(model_folder)
    old = mm.QK[0, 1].B.clone()
    with torch.no_grad():
        for p in mm.model.parameters():
            p.mul_(2.0)
    assert torch.allclose(mm.QK[0, 1].B, _B(mm, 0, 1), atol=1e-5)
    assert not torch.allclose(mm.QK[0, 1].B, old)
    d = al.diff(al.load(model_folder), mm)
    assert float(d.distance.min()) > 0


def test_a_model_whose_weights_were_replaced_by_nan_is_refused_or_reported(model_folder):
    mm = al.load(model_folder)
    with torch.no_grad():
        next(mm.model.parameters()).fill_(math.nan)
    try:
        df = al.spectrum(mm, samples=2)
    except ALLOWED as e:
        assert "\n" not in str(e) and len(str(e)) <= MAX_LINE
    else:
        assert len(df) == mm.cfg.n_layers * mm.cfg.n_heads


# --- a Hugging Face folder made by transformers ------------------------------------------------------


def test_a_hugging_face_folder_answers_and_refuses_like_a_zoo_model(m, hf_folder):
    hf = al.load(hf_folder)
    assert hf.QK[1, 3].B.shape == (32, 32)
    refuses(lambda: hf.QK[2, 0], "layer")
    refuses(lambda: al.view(hf, [0, 100], layer=0), "token")
    msg = refuses(lambda: al.diff(m, hf), "a", "b", "d_model", "model")
    assert "induction-2l" in msg or "d_model" in msg
    refuses(lambda: al.edit(hf, "L1H0", source=m, samples=2), "source", "d_model", "model", "text")


def test_nothing_is_written_into_a_hugging_face_folder(m, hf_folder, plot):
    before = tree(hf_folder)
    refuses(lambda: plot.save(hf_folder / "fig.csv"), "path")
    refuses(lambda: plot.save(hf_folder / "sub" / "fig.csv"), "path")
    refuses(lambda: al.retrain(m, steps=1, save=hf_folder, progress=False), "run store", "save")
    refuses(lambda: al.retrain(m, steps=1, save=hf_folder / "runs", progress=False), "run store", "save")
    e = al.edit(m, "L1H0", rank=1, samples=2)
    refuses(lambda: e.save(hf_folder / "edited"), "out")
    assert tree(hf_folder) == before


# --- writes: /dev/null, fifos, folders, names with NUL or newlines, long and unicode names -------------

BAD_DESTINATIONS = {
    "dev-null": lambda tmp: Path("/dev/null"),
    "folder": lambda tmp: tmp / "dir",
    "fifo": lambda tmp: tmp / "fifo",
    "file": lambda tmp: tmp / "old.csv",
    "nul": lambda tmp: str(tmp / "a\x00.csv"),
    "long-name": lambda tmp: tmp / ("a" * 300 + ".csv"),
    "long-unicode-name": lambda tmp: tmp / ("\u00e9" * 200 + ".csv"),
    "link-to-file": lambda tmp: tmp / "link.csv",
    "link-loop": lambda tmp: tmp / "loop" / "fig.csv",
    "under-a-file": lambda tmp: tmp / "old.csv" / "fig.csv",
    "newline-existing": lambda tmp: tmp / "new\nline.csv",
    "empty-path": lambda tmp: Path(""),
}


def _hostile_folder(tmp: Path) -> Path:
    (tmp / "dir").mkdir()
    os.mkfifo(tmp / "fifo")
    (tmp / "old.csv").write_text("old")
    (tmp / "new\nline.csv").write_text("old")
    (tmp / "link.csv").symlink_to(tmp / "old.csv")
    (tmp / "loop").symlink_to(tmp / "loop")
    return tmp


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("where", BAD_DESTINATIONS.values(), ids=BAD_DESTINATIONS.keys())
def test_a_plot_is_never_written_where_the_rule_forbids(plot, tmp_path, where, overwrite):
    folder = _hostile_folder(tmp_path)
    path = where(folder)
    if overwrite and Path(path).name in ("old.csv", "new\nline.csv"):
        pytest.skip("a plain file is replaced when asked")
    before = {p: (p.read_text() if p.is_file() and not p.is_symlink() else None) for p in folder.iterdir()}
    refuses(lambda: plot.save(path, fmt="csv", overwrite=overwrite), "path")
    assert {p: (p.read_text() if p.is_file() and not p.is_symlink() else None) for p in folder.iterdir()} == before


def test_a_unicode_name_is_written(plot, tmp_path):
    out = plot.save(tmp_path / "\u00e9t\u00e9 \u2013 L1H0.csv")
    assert out.read_text().splitlines()[0].startswith("query") or out.stat().st_size > 0


@pytest.mark.parametrize("where", BAD_DESTINATIONS.values(), ids=BAD_DESTINATIONS.keys())
def test_an_edit_is_never_saved_where_the_rule_forbids(m, tmp_path, where):
    folder = _hostile_folder(tmp_path)
    e = al.edit(m, "L1H0", rank=1, samples=2)
    before = tree(folder)
    refuses(lambda: e.save(where(folder)), "out")
    assert tree(folder) == before


STORES = {
    "dev-null": lambda tmp: Path("/dev/null"),
    "file": lambda tmp: tmp / "old.csv",
    "fifo": lambda tmp: tmp / "fifo",
    "nul": lambda tmp: str(tmp / "a\x00b"),
    "long-name": lambda tmp: tmp / ("a" * 300),
    "link-loop": lambda tmp: tmp / "loop",
    "under-a-file": lambda tmp: tmp / "old.csv" / "runs",
    "bytes": lambda tmp: bytes(tmp / "runs"),
}


@pytest.mark.parametrize("where", STORES.values(), ids=STORES.keys())
def test_a_run_store_that_cannot_be_is_refused_before_training(m, tmp_path, monkeypatch, where):
    import attn_core.retraining.job as job

    def never(*a, **k):
        raise AssertionError("trained")

    monkeypatch.setattr(job.TrainingJob, "run", never)
    folder = _hostile_folder(tmp_path)
    before = tree(folder)
    refuses(lambda: al.retrain(m, steps=1, save=where(folder), progress=False), "save", "run store")
    assert tree(folder) == before


# --- results used after the file they came from is gone ---------------------------------------------------


def test_a_model_whose_folder_was_deleted(tmp_path, plot):
    folder = checkpoint.save(make_tiny_model(), tmp_path / "gone", {"task": "reverse"})
    mm = al.load(folder)
    shutil.rmtree(folder)
    assert torch.allclose(mm.QK[0, 1].B, _B(mm, 0, 1), atol=1e-5)  # the weights are in memory
    assert len(al.spectrum(mm, samples=2)) == 2
    refuses(lambda: al.retrain(mm, steps=1, progress=False), "model", "gone", "folder")
    e = al.edit(mm, "L0H0", rank=1, samples=2)
    out = e.save(tmp_path / "edited")
    assert al.load(out["out"]).cfg.n_heads == 2


def test_a_plot_of_a_view_survives_its_model_folder(tmp_path):
    folder = checkpoint.save(make_tiny_model(), tmp_path / "gone")
    p = al.view(al.load(folder), [1, 2, 3]).plot(head=1)
    shutil.rmtree(folder)
    assert p.save(tmp_path / "fig.csv").is_file()


def test_a_retrained_run_whose_store_was_deleted(m, tmp_path):
    r = al.retrain(m, steps=1, save=tmp_path / "store", progress=False)
    shutil.rmtree(tmp_path / "store")
    assert r.compare().shape[0] >= 0 and r.model.QK[1, 0].B.shape == (64, 64)
    refuses(lambda: al.load(f"run:{r.run_id}"), "run", r.run_id)
