"""DeepSeek-V2 (and V2-Lite): DeepSeek-V3's layout (attn_core/hf/families/deepseek_v3.py) with
V2's router. Multi-head latent attention as V3's (V2-Lite has no query latent: ``q_lora_rank``
null, ``q_proj`` from x), its rotary pairs always adjacent (transformers rotates them as complex
numbers); the first ``first_k_dense_replace`` layers dense; the others ``n_routed_experts``
experts and ``n_shared_experts`` of them as one shared expert, routed by the softmax of
``mlp.gate``: ``topk_method`` "greedy" (the top ``num_experts_per_tok``) or
"group_limited_greedy" (within the best ``topk_group`` of ``n_group`` groups, a group scoring its
best expert), the weights (not renormalised: transformers' V2 ignores ``norm_topk_prob``) times
``routed_scaling_factor``; no correction bias."""

from __future__ import annotations

from attn_core.checkpoint import CheckpointError
from attn_core.hf.config import activation, decoder_config, experts, flag, number
from attn_core.hf.families.deepseek_v3 import _rank, dense_layers, groups, mla_fields, shared_width, slots
from attn_core.hf.family import Family
from attn_core.model import ModelConfig

TOPK_METHODS = ("greedy", "group_limited_greedy")


def router_fields(hf: dict) -> dict:
    """V2's experts and router (module doc), each refused by its config.json name."""
    routed = experts(hf, "n_routed_experts")
    E, k = routed["n_experts"], routed["experts_per_token"]
    method = hf.get("topk_method", "greedy")
    if method not in TOPK_METHODS:
        raise CheckpointError(f"config.json topk_method={method!r} must be one of {', '.join(TOPK_METHODS)}")
    grouped = {}
    if method == "group_limited_greedy":
        G, top = groups(hf, E, k)
        grouped = dict(router_groups=G, router_top_groups=top, router_group_score="max")
    if flag(hf, "mlp_bias", False):
        raise CheckpointError("config.json mlp_bias=true is not supported for DeepSeek-V2")
    return dict(
        d_mlp=_rank(hf, "moe_intermediate_size"),
        **routed,
        router_scoring="softmax",
        routed_scale=number(hf, "routed_scaling_factor", 1.0, hi=1e6),
        d_shared=shared_width(hf),
        **dense_layers(hf),
        **grouped,
    )


def config(hf: dict) -> ModelConfig:
    return decoder_config(
        hf,
        **mla_fields(hf),
        ln_eps=number(hf, "rms_norm_eps", 1e-6, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        **router_fields(hf),
    )


FAMILY = Family("deepseek_v2", config, lambda cfg, raw: slots(cfg, {**raw, "rope_interleave": True}))
