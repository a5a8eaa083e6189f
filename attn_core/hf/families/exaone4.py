"""EXAONE 4: OLMo 2's post norms with Qwen3's per-head QK-norm; with a sliding window, the
sliding layers (by layer_types) are rotary and the global layers have no positions (NoPE)."""

from __future__ import annotations

from attn_core.hf.config import activation, decoder_config, head_dim, integer, layer_types, number, rope, windows
from attn_core.hf.family import Family, decoder_slots
from attn_core.model import ModelConfig


def config(hf: dict) -> ModelConfig:
    d_head = head_dim(hf)
    n_layers = integer(hf, "num_hidden_layers")
    found = windows(hf, n_layers)
    kinds = layer_types(hf, n_layers) or ["full_attention"] * n_layers
    hybrid = hf.get("sliding_window") is not None
    nope = [l for l, t in enumerate(kinds) if t == "full_attention"] if hybrid else []
    return decoder_config(
        hf,
        d_head=d_head,
        ln_eps=number(hf, "rms_norm_eps", 1e-5, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        sliding_window=found,
        qk_norm="head",
        block_norms="post",
        nope_layers=nope or None,
        **rope(hf, d_head),
    )


FAMILY = Family("exaone4", config, lambda cfg, raw: decoder_slots(cfg))
