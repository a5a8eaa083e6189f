"""Gemma 2: sandwich norms (input, post-attention, pre- and post-feedforward), Gemma's ``(1 + w)``
RMSNorm (folded into our weights on load, taken off on export), the embedding times
sqrt(hidden_size), GeGLU (gelu_tanh), scores scaled by ``query_pre_attn_scalar^-1/2`` and
soft-capped (``attn_logit_softcapping``), capped logits (``final_logit_softcapping``), sliding
and global layers by layer_types; the unembedding is tied to the embedding."""

from __future__ import annotations

import math

from attn_core.hf.config import activation, decoder_config, flag, head_dim, integer, number, rope, windows
from attn_core.hf.family import Family, decoder_slots
from attn_core.model import ModelConfig


def cap(hf: dict, key: str, default: float | None) -> float | None:
    """A soft cap: null (none) or a positive finite number; 0, a negative or NaN is refused by name."""
    return None if hf.get(key, default) is None else number(hf, key, default)


def gemma_fields(hf: dict) -> dict:
    """What Gemma 2 and 3 read alike (Gemma 3 adds QK-norm and a second rotary base)."""
    d_head = head_dim(hf)
    d = integer(hf, "hidden_size")
    return dict(
        d_head=d_head,
        attn_bias=flag(hf, "attention_bias", False),
        ln_eps=number(hf, "rms_norm_eps", 1e-6, hi=1.0),
        mlp_act=activation(hf, "hidden_activation", "gelu_pytorch_tanh"),
        sliding_window=windows(hf, integer(hf, "num_hidden_layers")),
        attn_scale=number(hf, "query_pre_attn_scalar", 256.0) ** -0.5,
        block_norms="sandwich",
        embed_scale=float(math.sqrt(d)),
    )


def config(hf: dict) -> ModelConfig:
    fields = gemma_fields(hf)
    return decoder_config(
        hf,
        **fields,
        attn_softcap=cap(hf, "attn_logit_softcapping", 50.0),
        final_softcap=cap(hf, "final_logit_softcapping", 30.0),
        **rope(hf, fields["d_head"]),
    )


FAMILY = Family("gemma2", config, lambda cfg, raw: decoder_slots(cfg, o_bias=True, norm_offset=1.0), tied=True)
