"""Qwen3: Llama's layout with per-head QK-norm (RMSNorm of q and k over each head's d_head,
before the rotation; weights ``q_norm``/``k_norm`` [d_head]), biases on q, k, v and o_proj with
``attention_bias``, head_dim its own (not hidden_size / heads), windows by layer_types."""

from __future__ import annotations

from attn_core.hf.config import activation, decoder_config, flag, head_dim, integer, number, rope, windows
from attn_core.hf.family import Family, decoder_slots
from attn_core.model import ModelConfig


def config(hf: dict) -> ModelConfig:
    d_head = head_dim(hf)
    return decoder_config(
        hf,
        d_head=d_head,
        attn_bias=flag(hf, "attention_bias", False),
        ln_eps=number(hf, "rms_norm_eps", 1e-6, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        sliding_window=windows(hf, integer(hf, "num_hidden_layers"), "use_sliding_window"),
        qk_norm="head",
        **rope(hf, d_head),
    )


FAMILY = Family("qwen3", config, lambda cfg, raw: decoder_slots(cfg, o_bias=True))
