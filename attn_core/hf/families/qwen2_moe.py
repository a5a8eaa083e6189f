"""Qwen2-MoE: Qwen2's attention (q, k, v biases with ``qkv_bias``, none on o_proj, windows with
``use_sliding_window`` from ``max_window_layers`` on, or by layer_types) with a routed mixture of
experts in every layer's MLP: ``num_experts`` SwiGLU experts of width moe_intermediate_size, a router
(``mlp.gate``) whose softmax's top ``num_experts_per_tok`` are renormalised with
``norm_topk_prob``, and a shared expert of width shared_expert_intermediate_size
(``mlp.shared_expert``) whose output is multiplied by ``sigmoid(x w)`` (``mlp.shared_expert_gate``).
Dense layers among the sparse ones (``mlp_only_layers``, ``decoder_sparse_step`` above 1) are
refused by name."""

from __future__ import annotations

from attn_core.hf.config import (
    activation,
    decoder_config,
    expert_count,
    experts,
    flag,
    head_dim,
    integer,
    number,
    rope,
    sparse_every_layer,
    windows,
)
from attn_core.hf.family import Experts, Family, decoder_slots
from attn_core.model import ModelConfig


def config(hf: dict) -> ModelConfig:
    d_head = head_dim(hf)
    n_layers = integer(hf, "num_hidden_layers")
    sparse_every_layer(hf)
    count, field = expert_count(hf)
    return decoder_config(
        hf,
        d_head=d_head,
        d_mlp=integer(hf, "moe_intermediate_size"),
        attn_bias=flag(hf, "qkv_bias", True),
        ln_eps=number(hf, "rms_norm_eps", 1e-6, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        sliding_window=windows(hf, n_layers, "use_sliding_window", max_window_layers=True),
        **experts(hf, field, count),
        router_renorm=flag(hf, "norm_topk_prob", False),
        d_shared=integer(hf, "shared_expert_intermediate_size"),
        shared_gate=True,
        **rope(hf, d_head),
    )


FAMILY = Family("qwen2_moe", config, lambda cfg, raw: decoder_slots(cfg, experts=Experts(field=expert_count(raw)[1])))
