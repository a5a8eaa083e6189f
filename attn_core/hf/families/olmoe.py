"""OLMoE: OLMo's attention with QK-norm across all heads (one RMSNorm over the whole q projection,
weight [heads x d_head], one over k), pre norms as Llama's, and a routed mixture of experts in
every layer's MLP: ``num_experts`` SwiGLU experts (``mlp.experts.{e}.gate_proj/up_proj/down_proj``)
and a router (``mlp.gate``) whose softmax's top ``num_experts_per_tok`` are renormalised with
``norm_topk_prob``. ``clip_qkv`` (a clamp of q, k and v) is refused by name."""

from __future__ import annotations

from attn_core.checkpoint import CheckpointError
from attn_core.hf.config import activation, decoder_config, expert_count, experts, flag, head_dim, number, rope
from attn_core.hf.family import Experts, Family, decoder_slots
from attn_core.model import ModelConfig


def config(hf: dict) -> ModelConfig:
    if hf.get("clip_qkv") is not None:
        raise CheckpointError(f"config.json clip_qkv={hf['clip_qkv']!r}: clamped queries and keys are not supported")
    d_head = head_dim(hf, fixed=True)
    count, field = expert_count(hf)
    return decoder_config(
        hf,
        d_head=d_head,
        attn_bias=flag(hf, "attention_bias", False),
        ln_eps=number(hf, "rms_norm_eps", 1e-5, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        qk_norm="all",
        **experts(hf, field, count),
        router_renorm=flag(hf, "norm_topk_prob", False),
        **rope(hf, d_head),
    )


FAMILY = Family("olmoe", config, lambda cfg, raw: decoder_slots(cfg, experts=Experts(field=expert_count(raw)[1])))
