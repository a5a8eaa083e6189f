"""Granite: Llama's layout with four multipliers: the embedding (``embedding_multiplier``), each
attention and MLP output before it joins the residual (``residual_multiplier``), the scores
(``attention_multiplier``, in place of 1/sqrt(d_head)) and the logits (divided by
``logits_scaling``)."""

from __future__ import annotations

from attn_core.hf.config import activation, decoder_config, flag, head_dim, integer, number, rope, windows
from attn_core.hf.family import Family, decoder_slots
from attn_core.model import ModelConfig


def config(hf: dict) -> ModelConfig:
    d_head = head_dim(hf, fixed=True)
    return decoder_config(
        hf,
        d_head=d_head,
        attn_bias=flag(hf, "attention_bias", False),
        ln_eps=number(hf, "rms_norm_eps", 1e-6, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        sliding_window=windows(hf, integer(hf, "num_hidden_layers")),
        embed_scale=number(hf, "embedding_multiplier", 1.0),
        residual_scale=number(hf, "residual_multiplier", 1.0),
        attn_scale=number(hf, "attention_multiplier", 1.0),
        logits_scaling=number(hf, "logits_scaling", 1.0),
        **rope(hf, d_head),
    )


FAMILY = Family("granite", config, lambda cfg, raw: decoder_slots(cfg, o_bias=True, mlp_bias=bool(raw.get("mlp_bias"))))
