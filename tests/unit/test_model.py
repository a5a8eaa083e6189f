import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core.hooks import act_name
from attn_core.model import ModelConfig, Transformer
from attn_core.training.trainer import init_model
from tests.conftest import make_tiny_model

SMALL = dict(n_layers=2, n_heads=3, d_model=24, d_head=8, d_mlp=0, n_ctx=12, d_vocab=17)


def small(**kw) -> Transformer:
    return make_tiny_model(**{**SMALL, **kw})


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"d_mlp": 32},
        {"qk": "merged"},
        {"attn_bias": True},
        {"normalization": "none", "positional": "none"},
        {"entmax_alpha": 1.5},
    ],
)
def test_shapes_and_cache(kw):
    m = small(**kw)
    tokens = torch.randint(0, 17, (5, 12))
    logits, cache = m.run_with_cache(tokens)
    assert logits.shape == (5, 12, 17)
    for l in range(2):
        assert cache[act_name("attn_in", l)].shape == (5, 12, 24)
        assert cache[act_name("attn_scores", l)].shape == (5, 3, 12, 12)
        A = cache[act_name("pattern", l)]
        torch.testing.assert_close(A.sum(-1), torch.ones(5, 3, 12))
        assert (A.triu(1) == 0).all(), "attention looks ahead"
    torch.testing.assert_close(m(tokens), logits)  # the cache does not change the output


@settings(max_examples=15, deadline=None)
@given(pos=st.integers(1, 11), kw=st.sampled_from([{}, {"qk": "merged", "d_mlp": 16}, {"attn_bias": True}]))
def test_causal_mask_future_tokens_never_change_earlier_outputs(pos, kw):
    m = small(**kw)
    tokens = torch.randint(0, 17, (2, 12), generator=torch.Generator().manual_seed(pos))
    changed = tokens.clone()
    changed[:, pos:] = (changed[:, pos:] + 1) % 17
    with torch.no_grad():
        torch.testing.assert_close(m(tokens)[:, :pos], m(changed)[:, :pos])


def test_init_is_deterministic_under_seed():
    a, b, c = small(), small(), init_model(small().cfg, seed=1)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k
    assert any(not torch.equal(va, vc) for va, vc in zip(a.state_dict().values(), c.state_dict().values()))


@pytest.mark.parametrize("bias", [False, True])
def test_merged_equals_factored_when_W_QK_is_W_Q_W_K_over_sqrt_d_head(bias):
    fac = small(d_mlp=16)
    merged = Transformer(ModelConfig(**{**fac.cfg.to_dict(), "qk": "merged"}))
    state = {k: v for k, v in fac.state_dict().items() if ".W_Q" not in k and ".W_K" not in k}
    for l, block in enumerate(fac.blocks):
        state[f"blocks.{l}.attn.W_QK"] = block.attn.W_Q @ block.attn.W_K.transpose(-1, -2) / fac.cfg.d_head**0.5
    merged.load_state_dict(state)
    tokens = torch.randint(0, 17, (4, 12))
    with torch.no_grad():
        torch.testing.assert_close(merged(tokens), fac(tokens), rtol=1e-5, atol=1e-5)


def test_grown_head_padding_contributes_nothing():
    """A head with d_qk narrower than the stored width scores exactly as an unpadded head."""
    base = small()
    wide = Transformer(ModelConfig(**{**base.cfg.to_dict(), "d_qk": [[8, 8, 8], [8, 11, 8]]}))
    state = base.state_dict()
    for l in range(2):
        w = wide.cfg.qk_width(l)
        for name in ("W_Q", "W_K"):
            t = state[f"blocks.{l}.attn.{name}"]
            state[f"blocks.{l}.attn.{name}"] = torch.nn.functional.pad(t, (0, w - t.shape[-1]))
    wide.load_state_dict(state)
    # the grown head's scale is 1/sqrt(11), so rescale its queries to keep the same scores
    with torch.no_grad():
        wide.blocks[1].attn.W_Q[1] *= (11 / 8) ** 0.5
    tokens = torch.randint(0, 17, (3, 12))
    with torch.no_grad():
        torch.testing.assert_close(wide(tokens), base(tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "bad, msg",
    [
        ({"d_model": 0}, "d_model"),
        ({"n_heads": 10**6}, "n_heads"),
        ({"qk": "fused"}, "qk"),
        ({"normalization": "rms"}, "normalization"),
        ({"d_mlp": -1}, "d_mlp"),
        ({"entmax_alpha": 3.0}, "entmax_alpha"),
        ({"d_model": 16384, "n_layers": 128, "n_heads": 4096, "d_head": 64}, "parameters is more than"),
    ],
)
def test_config_validation(bad, msg):
    with pytest.raises(ValueError, match=msg):
        ModelConfig(**bad)


def test_too_long_input_is_refused():
    with pytest.raises(ValueError, match="n_ctx"):
        small()(torch.zeros(1, 13, dtype=torch.long))


modern = st.fixed_dictionaries(
    {
        "n_layers": st.integers(1, 2),
        "kv": st.sampled_from([(4, 4), (4, 2), (4, 1), (3, 3)]),
        "d_head": st.sampled_from([4, 6, 8]),
        "rotary_half": st.booleans(),
        "normalization": st.sampled_from(["layernorm", "rmsnorm"]),
        "gated_mlp": st.booleans(),
        "parallel_attn": st.booleans(),
        "window": st.sampled_from([0, 1, 3]),
        "mlp_act": st.sampled_from(["gelu", "silu", "relu", "gelu_tanh"]),
        "attn_bias": st.booleans(),
    }
)


@settings(max_examples=30, deadline=None)
@given(spec=modern)
def test_modern_options_count_cache_and_mask(spec):
    """Rotary, grouped-query, RMSNorm, gated and parallel blocks, sliding windows: the parameter
    count is exact, the cache does not change the output, S = Q K^T / sqrt(d) from the hooked
    (rotated, repeated) Q and K, and no key outside the window gets weight."""
    h, g = spec["kv"]
    d_head = spec["d_head"]
    cfg = ModelConfig(
        n_layers=spec["n_layers"],
        n_heads=h,
        n_kv_heads=g,
        d_model=12,
        d_head=d_head,
        d_mlp=10,
        n_ctx=9,
        d_vocab=13,
        positional="rotary",
        rotary_dim=(d_head // 2 // 2 * 2 or 2) if spec["rotary_half"] else None,
        normalization=spec["normalization"],
        gated_mlp=spec["gated_mlp"],
        parallel_attn=spec["parallel_attn"],
        sliding_window=[spec["window"]] * spec["n_layers"],
        mlp_act=spec["mlp_act"],
        attn_bias=spec["attn_bias"],
    )
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    assert cfg.n_params() == sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, 13, (2, 9))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        assert torch.allclose(model(tokens), logits, atol=1e-6)
        for l in range(cfg.n_layers):
            q, k = cache[act_name("q", l)], cache[act_name("k", l)]
            assert q.shape == k.shape == (2, h, 9, d_head)
            S = cache[act_name("attn_scores", l)]
            assert torch.allclose(S, q @ k.transpose(-1, -2) / d_head**0.5, atol=1e-5)
            A = cache[act_name("pattern", l)]
            i = torch.arange(9)
            hidden = i[None, :] > i[:, None]
            if spec["window"]:
                hidden |= i[:, None] - i[None, :] >= spec["window"]
            assert (A[..., hidden] == 0).all()
    names = model.hook_names()
    assert (act_name("resid_mid", 0) in names) != spec["parallel_attn"]
