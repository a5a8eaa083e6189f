"""The registry of Hugging Face families: one file each in this folder, one line each here.

A family file declares a :class:`attn_core.hf.family.Family` named ``FAMILY``: its config
fields (config.json -> :class:`ModelConfig`), its tensors both ways (a slot table the loader
splits and the export joins) and so its features. Adding a family: its file, its line below,
its parity test (docs/architecture.md, "Adding a family").
"""

from __future__ import annotations

from attn_core.checkpoint import CheckpointError
from attn_core.hf.families import (
    deepseek_v2,
    deepseek_v3,
    exaone4,
    gemma2,
    gemma3,
    gpt2,
    gpt_neox,
    gpt_oss,
    granite,
    llama,
    mistral,
    mixtral,
    olmo2,
    olmoe,
    phi3,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_moe,
    smollm3,
)
from attn_core.hf.family import Family

REGISTRY: dict[str, Family] = {
    f.model_type: f
    for f in (
        gpt2.FAMILY,
        gpt_neox.FAMILY,
        llama.FAMILY,
        mistral.FAMILY,
        qwen2.FAMILY,
        qwen3.FAMILY,
        gemma2.FAMILY,
        gemma3.FAMILY,
        olmo2.FAMILY,
        smollm3.FAMILY,
        phi3.FAMILY,
        granite.FAMILY,
        exaone4.FAMILY,
        mixtral.FAMILY,
        qwen3_moe.FAMILY,
        olmoe.FAMILY,
        qwen2_moe.FAMILY,
        gpt_oss.FAMILY,
        deepseek_v3.FAMILY,
        deepseek_v2.FAMILY,
    )
}
FAMILIES = tuple(REGISTRY)


def family(hf: dict) -> Family:
    """The registered family of a config.json's model_type (one sentence naming it otherwise)."""
    kind = hf.get("model_type")
    if kind not in REGISTRY:
        shown = kind if isinstance(kind, str) else type(kind).__name__
        raise CheckpointError(f"model_type {shown!r} is not supported; supported families: {', '.join(FAMILIES)}")
    return REGISTRY[kind]
