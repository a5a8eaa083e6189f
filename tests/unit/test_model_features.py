"""The newer families' model features (QK-norm per head and across heads, a score scale, soft caps,
a second rotary base, NoPE layers, sandwich and post norms, the embedding / residual / logit
multipliers): validated in one line naming the field, absent by default (the saved config is
the one it always was), counted exactly, the fused path equal to the explicit one, and one head's
scores equal to a dense float64 computation written out here."""

import math

import pytest
import torch

from attn_core.hooks import act_name
from attn_core.model import ModelConfig, Transformer
from tests.refusals import refuses

BASE = dict(n_layers=2, n_heads=4, d_model=32, d_head=8, d_mlp=48, n_ctx=32, d_vocab=50, normalization="rmsnorm",
            positional="rotary", gated_mlp=True, n_kv_heads=2, mlp_act="gelu_tanh")  # fmt: skip
VARIANTS = {
    "qk-norm-head": dict(qk_norm="head"),
    "qk-norm-all": dict(qk_norm="all", block_norms="post"),
    "gemma-like": dict(
        qk_norm="head",
        attn_scale=0.3,
        attn_softcap=3.0,
        final_softcap=4.0,
        block_norms="sandwich",
        embed_scale=32**0.5,
        sliding_window=[5, 0],
        rope_theta_local=100.0,
    ),  # fmt: skip
    "nope-granite": dict(nope_layers=[1], embed_scale=2.0, residual_scale=0.5, logits_scaling=3.0, attn_scale=0.2),
}


def _model(**features) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**BASE, **features)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5 if name.endswith(".w") else torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(attn_softcap=0.0), "attn_softcap"),
        (dict(attn_softcap=-50.0), "attn_softcap"),
        (dict(final_softcap=math.nan), "final_softcap"),
        (dict(attn_scale=math.inf), "attn_scale"),
        (dict(qk_norm="rms"), "qk_norm"),
        (dict(block_norms="sandwitch"), "block_norms"),
        (dict(nope_layers=[2]), "nope_layers"),
        (dict(nope_layers=[0, 0]), "nope_layers"),
        (dict(embed_scale=0), "embed_scale"),
        (dict(residual_scale=True), "residual_scale"),
        (dict(logits_scaling=-1.0), "logits_scaling"),
        (dict(rope_theta_local=0.5), "rope_theta_local"),
        (dict(rope_theta_local=100.0, positional="learned"), "rope_theta_local"),
        (dict(qk_norm="head", normalization="layernorm"), "qk_norm"),
        (dict(block_norms="post", parallel_attn=True), "parallel_attn"),
    ],
)
def test_a_bad_feature_is_one_line_naming_it(change, field):
    refuses(lambda: ModelConfig(**{**BASE, **change}), field)


def test_absent_features_leave_the_saved_config_as_it_was():
    cfg = ModelConfig(**BASE)
    saved = cfg.to_dict()
    assert not {"qk_norm", "attn_softcap", "block_norms", "embed_scale", "nope_layers"} & set(saved)
    assert ModelConfig.from_dict(saved) == cfg
    with_cap = ModelConfig(**BASE, attn_softcap=30.0).to_dict()
    assert with_cap["attn_softcap"] == 30.0 and ModelConfig.from_dict(with_cap).attn_softcap == 30.0


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_parameter_count_is_exact(variant):
    model = _model(**VARIANTS[variant])
    assert model.n_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_fused_path_equals_the_explicit_one(variant):
    model = _model(**VARIANTS[variant])
    tokens = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(tokens)
        explicit, _ = model.run_with_cache(tokens)
    assert torch.allclose(plain, explicit, atol=1e-5, rtol=1e-5)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [T, w] rotated by its position, rotate-half, base theta (float64; the frequencies rounded
    to float32 once, as the model and transformers keep them)."""
    T, w = x.shape
    inv = (1.0 / (theta ** (torch.arange(0, w, 2).float() / w))).double()
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    return x * cos + torch.cat([-x[:, w // 2 :], x[:, : w // 2]], -1) * sin


@pytest.mark.parametrize("variant", ["gemma-like", "qk-norm-all", "nope-granite"])
def test_scores_match_a_dense_float64_computation(variant):
    """S of every head of both layers, from the layer's input, by the formulas of docs/maths.md."""
    model = _model(**VARIANTS[variant]).double()
    cfg = model.cfg
    tokens = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        for layer in range(2):
            attn = model.blocks[layer].attn
            X = cache[act_name("attn_in", layer)][0]
            q = torch.einsum("pd,hde->hpe", X, attn.W_Q)
            k = torch.einsum("pd,hde->hpe", X, attn.per_head("W_K"))
            if cfg.qk_norm == "head":
                q, k = (
                    _rms(q, attn.q_norm.w, cfg.ln_eps),
                    _rms(k, attn.per_head("W_K").new_ones(1) * attn.k_norm.w, cfg.ln_eps),
                )
            elif cfg.qk_norm == "all":
                Tq = q.transpose(0, 1).reshape(12, -1)
                q = _rms(Tq, attn.q_norm.w, cfg.ln_eps).reshape(12, 4, 8).transpose(0, 1)
                kv = torch.einsum("pd,gde->gpe", X, attn.W_K).transpose(0, 1).reshape(12, -1)
                k = _rms(kv, attn.k_norm.w, cfg.ln_eps).reshape(12, 2, 8).transpose(0, 1).repeat_interleave(2, 0)
            if layer not in (cfg.nope_layers or []):
                theta = cfg.rope_theta_local if cfg.rope_theta_local and cfg.window(layer) else cfg.rope_theta
                q, k = torch.stack([_rotate(t, theta) for t in q]), torch.stack([_rotate(t, theta) for t in k])
            S = q @ k.transpose(-1, -2) * (cfg.attn_scale or cfg.d_head**-0.5)
            if cfg.attn_softcap:
                S = torch.tanh(S / cfg.attn_softcap) * cfg.attn_softcap
            assert torch.allclose(cache[act_name("attn_scores", layer)][0], S, atol=1e-10), (variant, layer)


@pytest.mark.parametrize("variant", ["gemma-like", "nope-granite"])
def test_the_entropy_penalty_is_the_models_own_attention(variant):
    """The data-view penalty of a capped model (rows from its pattern) or one with its own score
    scale (rows from Q and K) equals the normalized entropy of the model's pattern."""
    from attn_core import metrics
    from attn_core.regularizers import build_penalty
    from attn_core.regularizers.summaries import mean_rows

    model = _model(**VARIANTS[variant])
    tokens = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(3))
    penalty = build_penalty(["entropy@L0=1", "entropy@L1=1"], model)
    cache = penalty.cache()
    with torch.no_grad():
        model(tokens, cache=cache)
        got = penalty(model, cache=cache)
        _, full = model.run_with_cache(tokens)
    for layer in range(2):
        A = full[act_name("pattern", layer)]
        mask = model.mask(16, model.cfg.window(layer))
        want = mean_rows(metrics.normalized_entropy(A, mask), A.shape, mask).mean()
        assert float(got[f"entropy@L{layer}"]) == pytest.approx(float(want), rel=1e-4), (variant, layer)
