"""Gemma 3 (text): Gemma 2's block (sandwich ``(1 + w)`` norms, embedding scale, GeGLU,
``query_pre_attn_scalar``, an optional final-logit cap) with per-head QK-norm (``(1 + w)`` too)
and two rotary bases: the full layers' (rope_parameters.full_attention, 1e6 by default, may be
scaled) and the sliding layers' (rope_parameters.sliding_attention, or transformers 4's
``rope_local_base_freq``; 1e4 by default). transformers' Gemma 3 reads ``attn_logit_softcapping``
but never applies it to the scores, so neither does attn-lab (the parity is with what it computes)."""

from __future__ import annotations

from attn_core.hf.config import decoder_config, number, rope
from attn_core.hf.families.gemma2 import cap, gemma_fields
from attn_core.hf.family import Family, decoder_slots
from attn_core.model import ModelConfig


def config(hf: dict) -> ModelConfig:
    fields = gemma_fields(hf)
    cap(hf, "attn_logit_softcapping", None)  # unused (module doc), but a 0, negative or NaN cap is refused
    rotary = rope(hf, fields["d_head"], 1_000_000.0, local=True)
    if "rope_theta_local" not in rotary:
        rotary["rope_theta_local"] = number(hf, "rope_local_base_freq", 10_000.0, lo=1.0)
    return decoder_config(
        hf,
        **fields,
        qk_norm="head",
        final_softcap=cap(hf, "final_logit_softcapping", None),
        **rotary,
    )


FAMILY = Family("gemma3_text", config, lambda cfg, raw: decoder_slots(cfg, o_bias=True, norm_offset=1.0), tied=True)
