"""Llama: RMSNorm, SwiGLU, rotary (default, linear or llama3 scaling), grouped-query attention;
``attention_bias`` biases q, k, v and o_proj, ``mlp_bias`` the MLP."""

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
        sliding_window=windows(hf, integer(hf, "num_hidden_layers")),
        **rope(hf, d_head),
    )


def slots(cfg: ModelConfig, raw: dict):
    return decoder_slots(cfg, o_bias=True, mlp_bias=bool(raw.get("mlp_bias")))


FAMILY = Family("llama", config, slots)
