"""Names of the model's activations, TransformerLens style.

Every activation the model can record or replace has one name, made by :func:`act_name` and
nowhere else: ``blocks.{l}.hook_attn_in`` (the attention input X = ln1(residual)),
``blocks.{l}.attn.hook_q`` / ``hook_k`` / ``hook_v`` (per head, [batch, head, pos, d]),
``blocks.{l}.attn.hook_attn_scores`` (pre-softmax S, [batch, head, query, key]),
``blocks.{l}.attn.hook_pattern`` (A), ``blocks.{l}.attn.hook_z`` (A V), and the residual
stream's ``blocks.{l}.hook_resid_pre`` / ``hook_resid_mid`` / ``hook_resid_post``,
``blocks.{l}.hook_attn_out`` and ``blocks.{l}.hook_mlp_out``.
"""
from __future__ import annotations

# short name -> the part after "blocks.{l}."
_IN_BLOCK = {
    "resid_pre": "hook_resid_pre",
    "attn_in": "hook_attn_in",
    "q": "attn.hook_q",
    "k": "attn.hook_k",
    "v": "attn.hook_v",
    "attn_scores": "attn.hook_attn_scores",
    "pattern": "attn.hook_pattern",
    "z": "attn.hook_z",
    "attn_out": "hook_attn_out",
    "resid_mid": "hook_resid_mid",
    "mlp_out": "hook_mlp_out",
    "resid_post": "hook_resid_post",
}
ACTIVATIONS = tuple(_IN_BLOCK)


def act_name(kind: str, layer: int) -> str:
    """The full name of activation ``kind`` (one of :data:`ACTIVATIONS`) in block ``layer``,
    e.g. ``act_name("pattern", 1) == "blocks.1.attn.hook_pattern"``."""
    try:
        return f"blocks.{layer}.{_IN_BLOCK[kind]}"
    except KeyError:
        raise ValueError(f"unknown activation {kind!r}; one of {', '.join(ACTIVATIONS)}") from None
