"""Hook points: run_with_cache records every named activation, the scores equal a dense computation
from the weights, replacing the scores changes the pattern as an offset before the softmax would,
unknown names are refused; and the one parameter count equals the real one."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core.hooks import ACTIVATIONS, MLP_ACTIVATIONS, act_name
from attn_core.model import ModelConfig, Transformer

configs = st.fixed_dictionaries(
    {
        "n_layers": st.integers(1, 2),
        "n_heads": st.integers(1, 3),
        "d_model": st.sampled_from([8, 12]),
        "d_head": st.integers(2, 5),
        "d_mlp": st.sampled_from([0, 8]),
        "qk": st.sampled_from(["factored", "merged"]),
        "attn_bias": st.booleans(),
        "normalization": st.sampled_from(["layernorm", "none"]),
        "positional": st.sampled_from(["learned", "none"]),
        "grown": st.booleans(),
    }
)


# Not conftest's make_tiny_model: a float64 model, its weights drawn in float64 from N(0, 0.5).
def build(spec: dict, seed: int = 0) -> Transformer:
    spec = dict(spec)
    grown = spec.pop("grown", False)
    if grown and spec["qk"] == "factored":  # heads of their own widths, the layer stored at the widest
        spec["d_qk"] = [[spec["d_head"] + (h + l) % 3 for h in range(spec["n_heads"])] for l in range(spec["n_layers"])]
    cfg = ModelConfig(d_vocab=11, n_ctx=7, **spec)
    torch.manual_seed(seed)
    model = Transformer(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
        if cfg.d_qk is not None:
            model.zero_qk_padding()
    return model


# two layers with MLPs and query/key biases: every hook point a model has
TWO_LAYERS_MLP_BIAS = {
    "n_layers": 2,
    "n_heads": 2,
    "d_model": 8,
    "d_head": 4,
    "d_mlp": 8,
    "qk": "factored",
    "attn_bias": True,
    "normalization": "layernorm",
    "positional": "learned",
}


def tokens(n: int = 3, T: int = 7, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 11, (n, T), generator=torch.Generator().manual_seed(seed))


def dense_scores(model: Transformer, X: torch.Tensor, layer: int) -> torch.Tensor:
    """S[b, h] = (X W_Q + b_Q)(X W_K + b_K)^T / sqrt(d_qk) head by head from the weights (X W_QK X^T merged)."""
    cfg, attn = model.cfg, model.blocks[layer].attn
    out = []
    for h in range(cfg.n_heads):
        if cfg.qk == "merged":
            out.append(X @ attn.W_QK[h] @ X.transpose(-1, -2))
            continue
        w = cfg.head_d_qk(layer, h)
        q, k = X @ attn.W_Q[h, :, :w], X @ attn.W_K[h, :, :w]
        if cfg.attn_bias:
            q, k = q + attn.b_Q[h, :w], k + attn.b_K[h, :w]
        out.append(q @ k.transpose(-1, -2) / math.sqrt(w))
    return torch.stack(out, 1)


@settings(max_examples=30, deadline=None)
@given(spec=configs, seed=st.integers(0, 1000))
def test_run_with_cache_records_every_activation_with_its_shape(spec, seed):
    model = build(spec, seed)
    cfg = model.cfg
    x = tokens(seed=seed)
    b, T = x.shape
    with torch.no_grad():
        logits, cache = model.run_with_cache(x)
        torch.testing.assert_close(logits, model(x))  # recording changes nothing
    kinds = [k for k in ACTIVATIONS if cfg.d_mlp > 0 or k not in MLP_ACTIVATIONS]
    assert list(cache) == [act_name(k, l) for l in range(cfg.n_layers) for k in kinds] == model.hook_names()
    for l in range(cfg.n_layers):
        w = cfg.d_model if cfg.qk == "merged" else cfg.qk_width(l)
        shapes = {
            "q": (b, cfg.n_heads, T, w),
            "k": (b, cfg.n_heads, T, w),
            "v": (b, cfg.n_heads, T, cfg.d_head),
            "attn_scores": (b, cfg.n_heads, T, T),
            "pattern": (b, cfg.n_heads, T, T),
            "z": (b, cfg.n_heads, T, cfg.d_head),
        }
        for kind in kinds:
            assert cache[act_name(kind, l)].shape == shapes.get(kind, (b, T, cfg.d_model)), (kind, l)
        # the residual stream adds up: resid_post = resid_pre + attn_out (+ mlp_out)
        total = cache[act_name("resid_pre", l)] + cache[act_name("attn_out", l)]
        if cfg.d_mlp:
            total = total + cache[act_name("mlp_out", l)]
        torch.testing.assert_close(cache[act_name("resid_post", l)], total)
        # S = Q K^T (/ sqrt(d_qk)) from the cached q and k, and z = A V
        S = cache[act_name("q", l)] @ cache[act_name("k", l)].transpose(-1, -2)
        if cfg.qk == "factored":
            S = S * model.blocks[l].attn.qk_scale
        torch.testing.assert_close(cache[act_name("attn_scores", l)], S)
        torch.testing.assert_close(cache[act_name("z", l)], cache[act_name("pattern", l)] @ cache[act_name("v", l)])


@settings(max_examples=30, deadline=None)
@given(spec=configs, seed=st.integers(0, 1000))
def test_hooked_scores_equal_a_dense_computation_from_the_weights(spec, seed):
    model = build(spec, seed)
    x = tokens(seed=seed)
    with torch.no_grad():
        _, cache = model.run_with_cache(x)
        resid = model.embed.W_E[x] + (model.pos_embed.W_pos[: x.shape[1]] if model.cfg.positional == "learned" else 0)
        for l, block in enumerate(model.blocks):
            torch.testing.assert_close(cache[act_name("resid_pre", l)], resid)
            if model.cfg.normalization == "layernorm":
                X = F.layer_norm(resid, (model.cfg.d_model,), block.ln1.w, block.ln1.b, model.cfg.ln_eps)
            else:
                X = resid
            torch.testing.assert_close(cache[act_name("attn_in", l)], X)
            torch.testing.assert_close(cache[act_name("attn_scores", l)], dense_scores(model, X, l))
            resid = cache[act_name("resid_post", l)]


@settings(max_examples=20, deadline=None)
@given(spec=configs, seed=st.integers(0, 1000), layer=st.integers(0, 1), head=st.integers(0, 2))
def test_replacing_the_scores_is_an_offset_before_the_softmax(spec, seed, layer, head):
    model = build(spec, seed)
    layer, head = layer % model.cfg.n_layers, head % model.cfg.n_heads
    x = tokens(seed=seed)
    offset = (
        torch.randn(
            x.shape[0], x.shape[1], x.shape[1], generator=torch.Generator().manual_seed(seed), dtype=torch.float64
        )
        * 3
    )
    seen = []

    def shift(S, name):
        seen.append(name)
        S = S.clone()
        S[:, head] = S[:, head] + offset
        return S

    name = act_name("attn_scores", layer)
    with torch.no_grad():
        _, plain = model.run_with_cache(x)
        cache: dict = {}
        logits = model.run_with_hooks(x, fwd_hooks=[(name, shift)], cache=cache)
    assert seen == [name]
    T = x.shape[1]
    expected = plain[name].clone()  # the layers before it are untouched, so are its plain scores
    expected[:, head] = expected[:, head] + offset
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    A = torch.softmax(expected.masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(cache[act_name("pattern", layer)], A)
    torch.testing.assert_close(cache[name], expected)  # the cache holds what the softmax saw
    torch.testing.assert_close(cache[act_name("attn_in", layer)], plain[act_name("attn_in", layer)])
    assert not torch.allclose(logits, model(x))


def test_hooks_that_return_none_keep_the_activation_and_run_in_order():
    model = build(TWO_LAYERS_MLP_BIAS)
    x = tokens()
    order = []
    hooks = [(name, lambda t, n: order.append(n)) for name in reversed(model.hook_names())]
    with torch.no_grad():
        torch.testing.assert_close(model.run_with_hooks(x, hooks), model(x))
    assert order == model.hook_names()  # each point once, in the order the forward reaches it
    with torch.no_grad():
        _, only = model.run_with_cache(x, names_filter=act_name("pattern", 1))
        _, some = model.run_with_cache(x, names_filter=lambda n: n.endswith("hook_q"))
    assert list(only) == [act_name("pattern", 1)]
    assert list(some) == [act_name("q", 0), act_name("q", 1)]


def test_unknown_names_and_bad_replacements_fail_in_one_sentence():
    attn_only = build(
        {
            "n_layers": 1,
            "n_heads": 2,
            "d_model": 8,
            "d_head": 4,
            "d_mlp": 0,
            "qk": "factored",
            "attn_bias": False,
            "normalization": "layernorm",
            "positional": "learned",
        }
    )
    x = tokens()
    for name in ("blocks.3.attn.hook_pattern", "blocks.0.attn.hook_result", act_name("mlp_out", 0)):
        with pytest.raises(ValueError, match=r"unknown activation name .*act_name\(kind, layer\)"):
            attn_only.run_with_hooks(x, [(name, lambda t, n: None)])
        with pytest.raises(ValueError, match="unknown activation name"):
            attn_only.run_with_cache(x, names_filter=[name])
    with pytest.raises(ValueError, match="unknown activation 'scores'"):
        act_name("scores", 0)
    with pytest.raises(ValueError, match=r"returned \[1\] where a tensor of shape \[3, 2, 7, 7\]"):
        attn_only.run_with_hooks(x, [(act_name("attn_scores", 0), lambda t, n: torch.zeros(1))])


def test_hook_points_add_nothing_to_the_checkpoint():
    model = build(TWO_LAYERS_MLP_BIAS)
    keys = set(model.state_dict())
    assert not any("hook" in k for k in keys)
    assert {"blocks.0.attn.W_Q", "blocks.1.attn.b_K", "blocks.1.mlp.W_in", "embed.W_E", "unembed.b_U"} <= keys
    assert len(keys) == len(list(model.parameters()))  # parameters only: no buffer is persistent


@settings(max_examples=40, deadline=None)
@given(spec=configs)
def test_the_one_parameter_count_is_exact(spec):
    model = build(spec)
    assert model.cfg.n_params() == sum(p.numel() for p in model.parameters()) == model.n_params()
