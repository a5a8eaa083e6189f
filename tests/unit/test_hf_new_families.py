"""The newer Hugging Face families (Qwen3, Gemma 2, Gemma 3 text, OLMo 2, SmolLM3, Phi-3, Granite,
EXAONE 4, and the mixtures of experts Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE and gpt-oss): tiny random models built by transformers here (nothing downloaded), saved to a
folder and loaded by attn-lab; transformers' eager attention is the reference for every head's
pattern (windows, caps, norms included) and the logits; each exports back to its family."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attn_core.hf import load_hf  # noqa: E402
from attn_core.hf.family_export import export_family, hf_origin  # noqa: E402
from attn_core.hooks import act_name  # noqa: E402

TINY = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48, vocab_size=100)
TWO_TYPES = ["sliding_attention", "full_attention"]
# family: (config class, model class, the config's own settings, the features it shows)
CASES = {
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(num_key_value_heads=2, head_dim=16, use_sliding_window=True, sliding_window=5, max_window_layers=1),
        "per-head QK-norm, head_dim 16 != 32 / 4, a window on layer 1, GQA",
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            num_key_value_heads=2,
            head_dim=8,
            query_pre_attn_scalar=10,
            attn_logit_softcapping=4.0,
            final_logit_softcapping=3.0,
            sliding_window=5,
            layer_types=TWO_TYPES,
        ),  # fmt: skip
        "attention and final soft-caps, query_pre_attn_scalar, sandwich (1 + w) norms, embedding scale, GeGLU, window",
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            num_key_value_heads=2,
            head_dim=8,
            query_pre_attn_scalar=8,
            sliding_window=5,
            layer_types=TWO_TYPES,
            attn_logit_softcapping=6.0,
            final_logit_softcapping=5.0,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),  # fmt: skip
        "per-head (1 + w) QK-norm, two rotary bases, a final cap (the attention cap is unused), sandwich norms, window",
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(num_key_value_heads=2), "QK-norm across all heads, post norms"),
    "smollm3": (
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        dict(
            num_key_value_heads=2,
            no_rope_layers=[1, 0],
            use_sliding_window=True,
            sliding_window=5,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),  # fmt: skip
        "a NoPE layer (1), GQA",
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(num_key_value_heads=2, partial_rotary_factor=0.5, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        "fused qkv_proj and gate_up_proj, partial rotary",
    ),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        dict(
            num_key_value_heads=2,
            embedding_multiplier=2.0,
            residual_multiplier=0.5,
            attention_multiplier=0.2,
            logits_scaling=4.0,
            attention_bias=True,
        ),  # fmt: skip
        "embedding, residual, attention and logit multipliers, biases",
    ),
    "exaone4": (
        "Exaone4Config",
        "Exaone4ForCausalLM",
        dict(num_key_value_heads=2, sliding_window=5, sliding_window_pattern=2),
        "per-head QK-norm, post norms, a window on layer 0, NoPE on the global layer 1",
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=5),
        "4 routed experts, top 2 of the softmax renormalised, a window on every layer, GQA",
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=3, moe_intermediate_size=24),
        "4 routed experts of width 24, top 3 of the softmax (not renormalised), per-head QK-norm",
    ),
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True),
        "4 routed experts, top 2 of the softmax renormalised, QK-norm across all heads, GQA",
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            shared_expert_intermediate_size=40,
            norm_topk_prob=True,
        ),  # fmt: skip
        "4 routed experts of width 24, top 2 renormalised, a gated shared expert of width 40, q/k/v biases",
    ),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=5),
        "learned sinks, q/k/v/o biases, a window on layer 0, YaRN, 4 experts with biases (clamped SwiGLU), GQA",
    ),
}
FAMILIES = list(CASES)


def write_family(folder, family: str, **overrides):
    """A random tiny ``family`` model saved into ``folder`` by transformers (eager attention);
    returns it. Weights far from uniform attention, so comparisons mean something."""
    config_cls, model_cls, own, _ = CASES[family]
    cfg = getattr(transformers, config_cls)(
        **{**TINY, "max_position_embeddings": 64, "attn_implementation": "eager", **own, **overrides}
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3 if p.dim() > 1 else 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


@pytest.fixture(scope="module", params=FAMILIES)
def case(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, write_family(folder, request.param), folder


def _tokens(n: int = 20, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 100, (batch, n), generator=torch.Generator().manual_seed(1))


def _close_logits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Within 1e-4 relative (of the largest logit)."""
    return float((got - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max()))


def test_patterns_and_logits_match_transformers(case):
    family, reference, folder = case
    loaded = load_hf(folder)
    tokens = _tokens()
    with torch.no_grad():
        ref = reference(tokens, output_attentions=True)
        plain = loaded.model(tokens)  # the fused path where the maths allows it
        logits, cache = loaded.model.run_with_cache(tokens)
    for layer in range(2):
        A_ref = ref.attentions[layer]
        assert A_ref.max() > 0.5, (family, layer)  # peaked patterns: a real comparison
        err = float((cache[act_name("pattern", layer)] - A_ref).abs().max())
        assert err <= 1e-5, (family, layer, err)
    assert _close_logits(logits, ref.logits), (family, float((logits - ref.logits).abs().max()))
    assert _close_logits(plain, ref.logits), family


def test_features_reach_the_config(case):
    family, _, folder = case
    cfg = load_hf(folder).config
    expected = {
        "qwen3": dict(qk_norm="head", d_head=16, sliding_window=[0, 5]),
        "gemma2": dict(
            attn_softcap=4.0,
            final_softcap=3.0,
            attn_scale=10**-0.5,
            block_norms="sandwich",
            embed_scale=32**0.5,
            mlp_act="gelu_tanh",
            sliding_window=[5, 0],
        ),  # fmt: skip
        "gemma3_text": dict(
            qk_norm="head", rope_theta=10000.0, rope_theta_local=100.0, attn_softcap=None, final_softcap=5.0
        ),  # fmt: skip
        "olmo2": dict(qk_norm="all", block_norms="post"),
        "smollm3": dict(nope_layers=[1], sliding_window=[0, 5]),
        "phi3": dict(rotary_dim=4),
        "granite": dict(embed_scale=2.0, residual_scale=0.5, attn_scale=0.2, logits_scaling=4.0, attn_bias=True),
        "exaone4": dict(qk_norm="head", block_norms="post", nope_layers=[1], sliding_window=[5, 0]),
        "mixtral": dict(n_experts=4, experts_per_token=2, router_renorm=True, d_mlp=48, sliding_window=[5, 5]),
        "qwen3_moe": dict(n_experts=4, experts_per_token=3, router_renorm=False, d_mlp=24, qk_norm="head"),
        "olmoe": dict(n_experts=4, experts_per_token=2, router_renorm=True, d_mlp=48, qk_norm="all"),
        "qwen2_moe": dict(n_experts=4, d_mlp=24, d_shared=40, shared_gate=True, attn_bias=True, router_renorm=True),
        "gpt_oss": dict(attn_sinks=True, attn_bias=True, sliding_window=[5, 0], router_bias=True, glu_limit=7.0),
    }[family]
    got = {k: getattr(cfg, k) for k in expected}
    assert got == pytest.approx(expected) if family == "gemma2" else got == expected


def test_export_goes_back_to_the_family(case, tmp_path):
    family, _, folder = case
    loaded = load_hf(folder)
    origin = hf_origin(loaded)
    assert origin["model_type"] == family
    out = tmp_path / "out"
    summary = export_family(loaded, out, origin)
    assert summary["model_type"] == family
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    tokens = _tokens()
    with torch.no_grad():
        assert _close_logits(back(tokens).logits, loaded.model(tokens))
    again = load_hf(out)  # and attn-lab reads its own export as the same model
    assert again.config == loaded.config


def test_the_form_gives_the_models_own_scores(case):
    """S_ij = cap(g_q(i) g_k(j) x_i' B~(j - i) x_j'^T): the core form with the norm weights folded
    in, the per-token QK-norm gains, each layer's own rotation (its base, none in a NoPE layer)
    and scale, and the soft cap, against the model's pre-softmax scores at every offset."""
    from attn_core import bilinear as bl

    family, _, folder = case
    model = load_hf(folder).model
    cfg = model.cfg
    T = 12
    with torch.no_grad():
        _, cache = model.run_with_cache(_tokens(T, 1))
        for layer in range(2):
            X = cache[act_name("attn_in", layer)][0]
            aug = bl.has_bias(model)
            Xa = bl.augment(X) if aug else X
            g_q, g_k = bl.qk_gains(model, layer, X)  # [h, T]
            S = cache[act_name("attn_scores", layer)][0]  # [h, T, T]
            for delta in range(-(T - 1), 1):
                rows = torch.arange(-delta, T)
                form = bl.layer_form(model, layer, aug, offset=delta)
                got = form.bilinear(Xa)[:, rows, rows + delta] * g_q[:, rows] * g_k[:, rows + delta]
                if cfg.attn_softcap is not None:
                    got = torch.tanh(got / cfg.attn_softcap) * cfg.attn_softcap
                want = S[:, rows, rows + delta]
                assert float((got - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max())), (
                    family,
                    layer,
                    delta,
                )


def test_blocked_scores_are_the_models_own(case):
    """The blocked path (long inputs) gives each head's S as the model does: capped, normed, scaled."""
    from attn_core.bilinear.blocked import layer_qk

    family, _, folder = case
    model = load_hf(folder).model
    ids = _tokens(16, 1)[0].tolist()
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids]))
        for layer in range(2):
            qk = layer_qk(model, ids, layer)
            S = cache[act_name("attn_scores", layer)][0]
            for h in range(model.cfg.n_heads):
                got, want = qk.scores(h, 0, 16, 0, 16), S[h]
                seen = torch.isfinite(got)
                assert torch.allclose(got[seen], want[seen], atol=1e-5, rtol=1e-5), (family, layer, h)


def test_offset_forms_use_each_layers_rotation(case):
    """offset_form(layer, head, [delta]) is layer_form at that offset: Gemma 3's local base in its
    sliding layer, no rotation in a NoPE layer (the same B at every offset)."""
    from attn_core import bilinear as bl
    from attn_core.bilinear.offsets import offset_form

    family, _, folder = case
    model = load_hf(folder).model
    with torch.no_grad():
        for layer in range(2):
            got = offset_form(model, layer, 1, [-3]).dense[0]
            want = bl.layer_form(model, layer, offset=-3)[1].dense
            assert torch.allclose(got, want, atol=1e-5), (family, layer)
            if layer in (model.cfg.nope_layers or []):
                assert torch.allclose(want, bl.layer_form(model, layer)[1].dense, atol=1e-6)


def test_the_vocabulary_view_is_the_first_layers_own_scores(case):
    """At layer 0 a token's input is the vocabulary view's x_t (embedding, its scale, the norm
    before attention if any), so f_x(y) at offset j - i, with QK-norm's gains and the cap, is the
    model's own score S_ij."""
    from attn_core.bilinear.views import vocab_scores

    family, _, folder = case
    model = load_hf(folder).model
    ids = _tokens(8, 1)[0].tolist()
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids]))
        S = cache[act_name("attn_scores", 0)][0]
        for delta in range(-7, 1):
            view = vocab_scores(model, 0, tokens=ids, offset=delta)  # [h, T, T] by token position
            rows = torch.arange(-delta, 8)
            got, want = view[:, rows, rows + delta], S[:, rows, rows + delta]
            assert float((got - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max())), (family, delta)


def test_the_affine_forms_terms_add_up_to_the_scores(case):
    """x x + x b + b x + b b (gains, weights, rotation and YaRN's factor in each side) is the
    model's uncapped S; a family without biases has the bilinear term alone."""
    family, _, folder = case
    model = load_hf(folder).model
    with torch.no_grad():
        _, cache = model.run_with_cache(_tokens(10, 1))
        for layer in range(2):
            form = model.blocks[layer].attn.form()
            X = cache[act_name("attn_in", layer)][0]
            terms = form.terms(X)
            assert set(terms) == ({"xx", "xb", "bx", "bb"} if model.cfg.attn_bias else {"xx"}), family
            want = form.scores(X, capped=False)
            got = sum(terms.values())
            assert float((got - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max())), (family, layer)
            one = form[1].terms(X)
            assert all(torch.allclose(one[k], terms[k][1]) for k in terms), family
