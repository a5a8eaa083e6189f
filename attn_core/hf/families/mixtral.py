"""Mixtral: Mistral's attention with a routed mixture of experts in place of each MLP
(``block_sparse_moe``): ``num_local_experts`` SwiGLU experts (``experts.{e}.w1`` gate, ``w3`` up,
``w2`` down, each of width intermediate_size) and a router (``gate``) whose softmax's top
``num_experts_per_tok`` are renormalised to sum to 1. ``router_jitter_noise`` acts only in
transformers' training and ``router_aux_loss_coef`` only on its loss (docs/training.md)."""

from __future__ import annotations

from attn_core.hf.config import activation, decoder_config, experts, flag, head_dim, integer, number, rope, windows
from attn_core.hf.family import Experts, Family, decoder_slots
from attn_core.model import ModelConfig

EXPERTS = Experts("block_sparse_moe.", "gate.weight", ("w1", "w3", "w2"), "num_local_experts")


def config(hf: dict) -> ModelConfig:
    d_head = head_dim(hf)
    return decoder_config(
        hf,
        d_head=d_head,
        attn_bias=flag(hf, "attention_bias", False),
        ln_eps=number(hf, "rms_norm_eps", 1e-5, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        sliding_window=windows(hf, integer(hf, "num_hidden_layers")),
        **experts(hf, "num_local_experts"),
        router_renorm=True,
        **rope(hf, d_head),
    )


FAMILY = Family("mixtral", config, lambda cfg, raw: decoder_slots(cfg, experts=EXPERTS))
