"""Surgery on B (attn_core.surgery.modes, .edit), checked against dense references: a rank-R
edit's B is the SVD truncation of the dense B (1e-5), a full-rank or unit-scale edit changes no
logit, an edit of a query head leaves the rest of its key/value group alone, rotary heads are
scaled plane by plane, ablations match a hook that zeroes or averages the head's output, and an
edited imported folder exported to transformers computes attn_core's edited logits.
Tolerances: float32 weights, 1e-5 relative to the largest entry (B, logits)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_core.checkpoint import LoadedModel
from attn_core.hooks import act_name
from attn_core.model import ModelConfig
from attn_core.surgery import HeadEdit, edit_model, head_form64, head_modes, mode_factors, parse_head
from tests.conftest import make_tiny_model, write_tiny_hf


def loaded_of(model, name="m") -> LoadedModel:
    return LoadedModel(name=name, model=model, config=model.cfg)


def tokens_for(cfg: ModelConfig, seed: int = 0, batch: int = 3) -> torch.Tensor:
    return torch.randint(0, cfg.d_vocab, (batch, min(cfg.n_ctx, 12)), generator=torch.Generator().manual_seed(seed))


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


def truncation(B: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    U, S, Vh = torch.linalg.svd(B)
    return (U[:, : len(keep)] * (S[: len(keep)] * keep)) @ Vh[: len(keep)]


CONFIGS = {
    "plain": dict(n_heads=2, d_model=16, d_head=8),
    "bias": dict(n_heads=2, d_model=16, d_head=8, attn_bias=True),
    "gqa": dict(n_heads=4, n_kv_heads=2, d_model=16, d_head=4),
    "merged": dict(n_heads=2, d_model=8, qk="merged"),
}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(CONFIGS)), rank=st.integers(1, 8), data=st.data())
def test_a_rank_R_edit_is_the_SVD_truncation_of_the_dense_B(kind, rank, data):
    model = make_tiny_model("reverse", seed=1, std=0.5, **CONFIGS[kind])
    cfg = model.cfg
    k = head_modes(model, 0, 1).k
    rank = min(rank, k)
    dense = head_form64(model, 0, 1).dense
    others = {h: head_form64(model, 0, h).dense for h in range(cfg.n_heads) if h != 1}
    K_before = None if cfg.qk == "merged" else model.blocks[0].attn.W_K.detach().clone()
    edited = edit_model(loaded_of(model), [HeadEdit(0, 1, rank=rank)]).loaded.model
    keep = torch.zeros(k, dtype=torch.float64)
    keep[:rank] = 1
    assert close(head_form64(edited, 0, 1).dense, truncation(dense, keep))
    for h, B in others.items():  # every other head, those sharing its key/value head included
        assert torch.equal(head_form64(edited, 0, h).dense, B)
    if K_before is not None:
        assert torch.equal(edited.blocks[0].attn.W_K, K_before)
    if cfg.attn_bias:
        assert torch.equal(edited.blocks[0].attn.b_Q, model.blocks[0].attn.b_Q)
    scale = data.draw(st.floats(-2, 2, allow_nan=False))
    i = data.draw(st.integers(0, k - 1))
    again = edit_model(loaded_of(model), [HeadEdit(0, 1, drop=(0,), scale=((i, scale),))]).loaded.model
    f = torch.ones(k, dtype=torch.float64)
    f[0] = 0
    f[i] *= scale
    assert close(head_form64(again, 0, 1).dense, truncation(dense, f))


@pytest.mark.parametrize("kind", sorted(CONFIGS) + ["rotary"])
def test_full_rank_and_unit_scale_edits_change_no_logit(kind):
    config = CONFIGS.get(kind) or dict(n_heads=4, n_kv_heads=2, d_model=16, d_head=8, positional="rotary")
    model = make_tiny_model("reverse", seed=2, std=0.5, **config)
    tokens = tokens_for(model.cfg)
    k = head_modes(model, 0, 0).k
    for e in (HeadEdit(0, 0, rank=k), HeadEdit(0, 0, scale=((0, 1.0),))):
        edited = edit_model(loaded_of(model), [e]).loaded.model
        with torch.no_grad():
            assert torch.equal(edited(tokens), model(tokens))


def test_rotary_heads_are_edited_plane_by_plane_and_keep_their_group():
    """Scaling plane c of query head 1 scales that plane's term of every score of head 1 (the
    split ``attribute`` makes, from the rotated q and k) and nothing else; head 0, which shares
    its key/value head, keeps every score."""
    model = make_tiny_model(
        "reverse", seed=3, std=0.5, n_heads=4, n_kv_heads=2, d_model=16, d_head=8, rotary_dim=6, positional="rotary"
    )
    modes = head_modes(model, 0, 1)
    assert modes.kind == "plane" and modes.k == 4 and modes.names[-1] == "offset-free dims"
    tokens = tokens_for(model.cfg)
    edited = edit_model(loaded_of(model), [HeadEdit(0, 1, scale=((1, 0.25),), drop=(3,))]).loaded.model
    names = [act_name("q", 0), act_name("k", 0), act_name("attn_scores", 0)]
    with torch.no_grad():
        _, before = model.run_with_cache(tokens, names_filter=names)
        _, after = edited.run_with_cache(tokens, names_filter=names)
    q0, k0, q1 = before[names[0]][:, 1], before[names[1]][:, 1], after[names[0]][:, 1]
    f = torch.tensor([1, 0.25, 1, 1, 0.25, 1, 0, 0])  # dims (0,3), (1,4), (2,5), offset-free 6, 7
    assert torch.allclose(q1, q0 * f, atol=1e-6)
    S_ref = (q0 * f) @ k0.transpose(-1, -2) / 8**0.5
    assert torch.allclose(after[names[2]][:, 1], S_ref, atol=1e-5)
    assert torch.equal(after[names[2]][:, 0], before[names[2]][:, 0])
    assert torch.equal(after[names[1]], before[names[1]])


@pytest.mark.parametrize("how", ["zero", "mean"])
def test_ablation_matches_a_hook_on_the_head_output(how):
    model = make_tiny_model("reverse", seed=4, std=0.5, n_layers=2, attn_bias=True)
    tokens = tokens_for(model.cfg, batch=4)
    edited = edit_model(loaded_of(model), [HeadEdit(1, 0, ablate=how)], tokens=tokens).loaded.model

    def hook(z, name):
        z = z.clone()
        z[:, 0] = 0 if how == "zero" else z[:, 0].mean((0, 1))
        return z

    with torch.no_grad():
        ref = model.run_with_hooks(tokens, [(act_name("z", 1), hook)])
        assert close(edited(tokens), ref)


def test_bad_edits_are_refused_in_one_sentence_and_change_nothing():
    model = make_tiny_model("reverse", seed=0, std=0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loaded = loaded_of(model)
    cases = [
        (HeadEdit(0, 5, rank=1), "does not exist"),
        (HeadEdit(3, 0, rank=1), "does not exist"),
        (HeadEdit(0, 0, rank=9), "out of range"),
        (HeadEdit(0, 0, rank=0), "out of range"),
        (HeadEdit(0, 0, drop=(8,)), "out of range"),
        (HeadEdit(0, 0, scale=((0, float("nan")),)), "finite"),
        (HeadEdit(0, 0, ablate="mean"), "output bias"),
    ]
    for e, words in cases:
        with pytest.raises(ValueError, match=words) as info:
            edit_model(loaded, [e])
        assert "\n" not in str(info.value)
    gqa = loaded_of(make_tiny_model("reverse", std=0.5, n_heads=4, n_kv_heads=2, d_model=16, d_head=4))
    with pytest.raises(ValueError, match="grouped-query"):
        edit_model(gqa, [HeadEdit(0, 0, source="x")], sources={"x": gqa})
    other = loaded_of(make_tiny_model("reverse", std=0.5, d_head=4), "other")
    with pytest.raises(ValueError, match="d_head differ"):
        edit_model(loaded, [HeadEdit(0, 0, source="other")], sources={"other": other})
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    for text, words in (("layer1", "L<layer>H<head>"), ("L1", "L<layer>H<head>"), ("L0H7", "out of range")):
        with pytest.raises(ValueError, match=words):
            parse_head(text, model.cfg)
    assert parse_head("l0h1", model.cfg) == (0, 1)


def test_a_transplant_copies_the_heads_form_and_with_ov_its_output():
    a = make_tiny_model("reverse", seed=5, std=0.5, attn_bias=True, n_layers=2)
    b = make_tiny_model("reverse", seed=6, std=0.5, attn_bias=True, n_layers=2)
    edits = [HeadEdit(0, 1, source="b", source_head=(1, 0), with_ov=True)]
    out = edit_model(loaded_of(a, "a"), edits, sources={"b": loaded_of(b, "b")}).loaded.model
    assert torch.equal(head_form64(out, 0, 1).dense, head_form64(b, 1, 0).dense)
    for n in ("W_V", "W_O", "b_Q", "b_K", "b_V"):
        assert torch.equal(getattr(out.blocks[0].attn, n)[1], getattr(b.blocks[1].attn, n)[0])
    assert torch.equal(out.blocks[0].attn.W_Q[0], a.blocks[0].attn.W_Q[0])


def test_mode_factors_keep_the_strongest_planes():
    model = make_tiny_model("reverse", seed=3, std=0.5, d_head=8, positional="rotary")
    modes = head_modes(model, 0, 0)
    f = mode_factors(modes, rank=2)
    assert set(torch.nonzero(f).flatten().tolist()) == set(modes.sigma.argsort(descending=True)[:2].tolist())


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "mistral", "qwen2"])
def test_an_edited_imported_folder_exports_to_transformers_with_the_same_logits(family, tmp_path):
    transformers = pytest.importorskip("transformers")
    from attn_core.sources import resolve
    from attn_core.surgery.save import save_edited
    from tests.conftest import write_tiny_gpt2

    folder = tmp_path / "src"
    folder.mkdir()
    modes = [HeadEdit(1, 3, rank=1), HeadEdit(0, 0, drop=(0,), scale=((1, 0.5),))]
    if family == "gpt2":
        write_tiny_gpt2(folder)
    else:
        write_tiny_hf(folder, family, **({} if family == "gpt_neox" else {"num_key_value_heads": 2}))
    mean = family in ("gpt2", "gpt_neox")  # their attention output has a bias to hold a mean
    edits = modes + [HeadEdit(1, 0, ablate="mean" if mean else "zero")]
    if family == "qwen2":  # q, k, v biases but no o_proj bias
        with pytest.raises(ValueError, match="output bias"):
            edit_model(resolve(str(folder)), [HeadEdit(0, 0, ablate="mean")])
    loaded = resolve(str(folder))
    tokens = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    edited = edit_model(loaded, edits, tokens=tokens)
    assert save_edited(loaded, edited, tmp_path / "out")["format"] == family
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    with torch.no_grad():
        ours, theirs, orig = edited.loaded.model(tokens), hf(tokens).logits, loaded.model(tokens)
    assert close(theirs, ours, 1e-4)
    assert not close(orig, ours, 1e-3)  # the edit did change the model
    assert resolve(str(tmp_path / "out")).config == loaded.config  # a folder of its own family again
