"""OLMo 2: post norms only (the attention's and the MLP's outputs are normed before they join the
residual; no norm before them), and QK-norm across all heads: one RMSNorm over the whole q
projection (weight [heads x d_head]) and one over k ([kv heads x d_head]), before the rotation,
so a token's gain is shared by its heads."""

from __future__ import annotations

from attn_core.hf.config import activation, decoder_config, flag, head_dim, number, rope
from attn_core.hf.family import Family, decoder_slots
from attn_core.model import ModelConfig


def config(hf: dict) -> ModelConfig:
    d_head = head_dim(hf, fixed=True)
    return decoder_config(
        hf,
        d_head=d_head,
        attn_bias=flag(hf, "attention_bias", False),
        ln_eps=number(hf, "rms_norm_eps", 1e-5, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        qk_norm="all",
        block_norms="post",
        **rope(hf, d_head),
    )


FAMILY = Family("olmo2", config, lambda cfg, raw: decoder_slots(cfg, o_bias=True))
