"""Qwen2: Llama's layout with q, k, v biases always (none on o_proj), and sliding windows only
with ``use_sliding_window``, from layer ``max_window_layers`` on (or by layer_types)."""

from __future__ import annotations

from attn_core.hf.config import activation, decoder_config, head_dim, integer, number, rope, windows
from attn_core.hf.family import Family, decoder_slots
from attn_core.model import ModelConfig


def config(hf: dict) -> ModelConfig:
    d_head = head_dim(hf)
    return decoder_config(
        hf,
        d_head=d_head,
        attn_bias=True,
        ln_eps=number(hf, "rms_norm_eps", 1e-6, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        sliding_window=windows(hf, integer(hf, "num_hidden_layers"), "use_sliding_window", max_window_layers=True),
        **rope(hf, d_head),
    )


FAMILY = Family("qwen2", config, lambda cfg, raw: decoder_slots(cfg))
