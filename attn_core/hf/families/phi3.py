"""Phi-3: Llama's block with fused projections: ``qkv_proj`` stacks q, k and v along its output
([(h + 2 g) d_head, d]) and ``gate_up_proj`` the gate and up halves ([2 d_mlp, d]); loading splits
them, the export fuses them. Partial rotary (``partial_rotary_factor``), an optional window on
every layer; "longrope" scaling is refused by name."""

from __future__ import annotations

from attn_core.hf.config import activation, decoder_config, head_dim, integer, number, rope, windows
from attn_core.hf.family import Family, decoder_slots
from attn_core.model import ModelConfig


def config(hf: dict) -> ModelConfig:
    d_head = head_dim(hf, fixed=True)
    return decoder_config(
        hf,
        d_head=d_head,
        ln_eps=number(hf, "rms_norm_eps", 1e-5, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        sliding_window=windows(hf, integer(hf, "num_hidden_layers")),
        **rope(hf, d_head),
    )


FAMILY = Family("phi3", config, lambda cfg, raw: decoder_slots(cfg, fused_qkv=True, fused_mlp=True))
