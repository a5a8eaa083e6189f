"""The model: :class:`ModelConfig` (the architecture, validated) and :class:`Transformer`."""

from attn_core.model.attention import Attention, attention_weights
from attn_core.model.config import MAX_DIM, MAX_LAYERS, MAX_VOCAB, ModelConfig
from attn_core.model.transformer import Block, Transformer

__all__ = [
    "Attention",
    "Block",
    "MAX_DIM",
    "MAX_LAYERS",
    "MAX_VOCAB",
    "ModelConfig",
    "Transformer",
    "attention_weights",
]
