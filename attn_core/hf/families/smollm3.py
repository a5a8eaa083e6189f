"""SmolLM3: Llama's layout with NoPE layers: ``no_rope_layers`` holds 1 (rotary) or 0 (no
positions) per layer, a no-position layer every ``no_rope_layer_interval`` (4) by default;
sliding windows with ``use_sliding_window``, by layer_types."""

from __future__ import annotations

from attn_core.checkpoint import CheckpointError
from attn_core.hf.config import activation, decoder_config, flag, head_dim, integer, number, rope, windows
from attn_core.hf.family import Family, decoder_slots
from attn_core.model import ModelConfig


def nope_layers(hf: dict, n_layers: int) -> list[int] | None:
    """The layers without positions, from no_rope_layers (or its interval)."""
    flags = hf.get("no_rope_layers")
    if flags is None:
        every = integer(hf, "no_rope_layer_interval", default=4)
        if every <= 0:
            raise CheckpointError(f"config.json no_rope_layer_interval must be a positive integer, got {every}")
        flags = [int((l + 1) % every != 0) for l in range(n_layers)]
    if (
        not isinstance(flags, list)
        or len(flags) != n_layers
        or any(f not in (0, 1) or isinstance(f, float) for f in flags)
    ):
        raise CheckpointError(f"config.json no_rope_layers must list 0 or 1 per layer ({n_layers} layers)")
    nope = [l for l, f in enumerate(flags) if not f]
    return nope or None


def config(hf: dict) -> ModelConfig:
    d_head = head_dim(hf)
    n_layers = integer(hf, "num_hidden_layers")
    return decoder_config(
        hf,
        d_head=d_head,
        attn_bias=flag(hf, "attention_bias", False),
        ln_eps=number(hf, "rms_norm_eps", 1e-6, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        sliding_window=windows(hf, n_layers, "use_sliding_window"),
        nope_layers=nope_layers(hf, n_layers),
        **rope(hf, d_head),
    )


FAMILY = Family("smollm3", config, lambda cfg, raw: decoder_slots(cfg, o_bias=True, mlp_bias=bool(raw.get("mlp_bias"))))
