"""The model: :class:`ModelConfig` (the architecture, validated) and :class:`Transformer`.

The config is imported with the package; the modules (torch) when a name of theirs is first read
(``attn_core.lazy``), so that a config or a CLI's help does not wait for torch."""

from attn_core import lazy
from attn_core.model.config import MAX_DIM, MAX_LAYERS, MAX_VOCAB, ModelConfig

__getattr__, __dir__ = lazy.exports(
    __name__,
    {
        "attention": ("Attention", "attention_weights"),
        "transformer": ("Block", "Transformer"),
    },
)

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
