"""GPT-2: its config and layout are ``attn_core/hf/gpt2.py`` (Conv1D weights, the score scale
folded into W_Q, and the export of any of our models as a GPT-2), so this family declares only
those whole-model maps."""

from __future__ import annotations

from attn_core.hf import export, gpt2
from attn_core.hf.family import Family


def _export(model, raw: dict):
    return export.gpt2_tensors(model)[0]


def _config(cfg, raw: dict) -> dict:
    """The config.json GPT-2's export writes: ours over the origin's, its token ids kept."""
    out = {**raw, **export.gpt2_config(cfg)}
    out.update({k: raw[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in raw})
    return out


FAMILY = Family(
    "gpt2",
    config=gpt2.config_from_gpt2,
    slots=lambda cfg, raw: [],
    prefix="transformer.",
    embed="transformer.wte.weight",
    tied=True,
    load=lambda cfg, raw, get, has: gpt2.tensors_from_gpt2(cfg, raw, get, has),
    export=_export,
    export_config=_config,
)
