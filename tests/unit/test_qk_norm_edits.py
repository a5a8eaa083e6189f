"""edit on QK-norm heads: what can be exact is (the per-token gains are taken before the norm
weight, so an edit written after them leaves them alone), each checked on the model's own scores;
what cannot is refused in one sentence that says why and what works instead."""

import pytest
import torch

from attn_core.checkpoint import LoadedModel
from attn_core.circuits import attribute
from attn_core.hooks import act_name
from attn_core.surgery.edit import HeadEdit, edit_model
from tests.conftest import make_tiny_model

IDS = [3, 1, 4, 1, 5, 9, 2, 6]


def scores(model, layer):
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([IDS]))
    return cache[act_name("attn_scores", layer)][0]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    pytest.importorskip("transformers")
    from attn_core.hf import load_hf
    from tests.unit.test_hf_new_families import write_family

    out = {}
    for name, family, extra in [
        ("olmo2", "olmo2", {}),
        ("qwen3", "qwen3", {}),
        ("qwen3-mha", "qwen3", dict(num_key_value_heads=4)),  # no shared key heads: transplants allowed
    ]:
        folder = tmp_path_factory.mktemp(name)
        write_family(folder, family, **extra)
        out[name] = load_hf(folder)
    return out


@pytest.mark.parametrize(
    "edit, factors",
    [
        (dict(drop=(1,)), [1, 0, 1, 1]),
        (dict(scale=((0, 2.0), (3, -0.5))), [2, 1, 1, -0.5]),
        (dict(scale=tuple((i, 3.0) for i in range(4))), [3, 3, 3, 3]),  # the head's whole score
    ],
)
def test_across_heads_norm_edits_each_rotation_plane_exactly(folders, edit, factors):
    loaded = folders["olmo2"]
    edited = edit_model(loaded, [HeadEdit(1, 2, **edit)]).loaded
    before, after = attribute(loaded, IDS, 1, 2, 7), attribute(edited, IDS, 1, 2, 7)
    f = torch.tensor(factors, dtype=torch.float64)
    assert torch.allclose(after.terms, before.terms * f, atol=1e-5)  # every plane's term times its factor
    S0, S1 = scores(loaded.model, 1), scores(edited.model, 1)
    others = [h for h in range(4) if h != 2]
    assert torch.equal(S1[others], S0[others])  # the other heads' gains and scores are untouched
    if len(set(factors)) == 1:
        assert torch.allclose(S1[2], S0[2] * factors[0], atol=1e-5)


def test_a_plain_across_heads_norm_takes_one_factor_for_every_mode():
    model = make_tiny_model(n_layers=1, normalization="rmsnorm", qk_norm="all", std=0.5)
    loaded = LoadedModel(name="normed", model=model, config=model.cfg)
    k = model.cfg.d_head
    edited = edit_model(loaded, [HeadEdit(0, 1, scale=tuple((i, 0.5) for i in range(k)))]).loaded
    S0, S1 = scores(model, 0), scores(edited.model, 0)
    assert torch.allclose(S1[1], S0[1] * 0.5, atol=1e-6) and torch.equal(S1[0], S0[0])
    with pytest.raises(ValueError, match=r"gains that depend on W_Q and W_K.*scale all modes by one factor"):
        edit_model(loaded, [HeadEdit(0, 1, rank=2)])


@pytest.mark.parametrize("edit", [dict(rank=2), dict(drop=(0,)), dict(scale=((0, 2.0),))])
def test_a_per_head_norm_refuses_mode_edits_saying_why(folders, edit):
    with pytest.raises(ValueError) as e:
        edit_model(folders["qwen3"], [HeadEdit(1, 0, **edit)])
    msg = str(e.value)
    assert "gains that depend on W_Q and W_K" in msg and "shared by every head" in msg and "--ablate works" in msg
    assert len(msg.splitlines()) == 1


def test_a_per_head_norm_transplants_from_a_layer_with_its_norm_weights(folders):
    loaded = folders["qwen3-mha"]
    sources = {"self": loaded}
    edited = edit_model(loaded, [HeadEdit(1, 0, source="self", source_head=(1, 3))], sources).loaded
    S0, S1 = scores(loaded.model, 1), scores(edited.model, 1)
    assert torch.allclose(S1[0], S0[3], atol=1e-6)  # the head now scores as the source head did
    assert torch.equal(S1[1:], S0[1:])
    with pytest.raises(ValueError, match=r"QK-norm weights differ.*shared by every head"):
        edit_model(loaded, [HeadEdit(1, 0, source="self", source_head=(0, 3))], sources)


def test_an_across_heads_norm_refuses_a_transplant_saying_why(folders):
    loaded = folders["olmo2"]
    with pytest.raises(ValueError, match=r"one gain over all the heads.*--ablate and edits of the head's modes work"):
        edit_model(loaded, [HeadEdit(1, 0, source="self", source_head=(1, 1))], {"self": loaded})


def test_ablation_still_works_on_every_qk_norm_head(folders):
    for loaded in folders.values():
        edited = edit_model(loaded, [HeadEdit(0, 1, ablate="zero")]).loaded
        assert float(edited.model.blocks[0].attn.W_O[1].detach().abs().max()) == 0.0
