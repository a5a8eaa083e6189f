"""Load a local Hugging Face folder (the families in ``hf/families/``) as a :class:`LoadedModel`.

The config is mapped first (the family's reader) and the model's size checked against the memory
available; then each tensor is read from the memory-mapped safetensors file(s), converted to
float32 and re-laid out by the family's slot table (``hf/family.py``), and the model takes those
tensors as its parameters (``Transformer.from_tensors``): one float copy of the weights, no more
(a tied unembedding is the embedding itself, not a copy).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch

from attn_core.card import Card
from attn_core.checkpoint import CheckpointError, LoadedModel, build_checked
from attn_core.hf.config import flag
from attn_core.hf.families import family
from attn_core.hf.family import convert
from attn_core.hf.folder import Tensors, check_fits, hf_config
from attn_core.hf.gpt2 import IMPORTED
from attn_core.hf.tokenizer import TOKENIZER, VOCAB
from attn_core.model import ModelConfig


def model_config(hf: dict) -> ModelConfig:
    """Our :class:`ModelConfig` for a config.json of any supported family; a slot-table family's
    unembedding is tied to the embedding (``tied_embed``) when its ``tie_word_embeddings`` says so,
    one tensor as in transformers."""
    fam = family(hf)
    cfg = fam.config(hf)
    if fam.load is None and flag(hf, "tie_word_embeddings", fam.tied):
        cfg = dataclasses.replace(cfg, tied_embed=True)
    return cfg


def _file_names(msg: str, fam, cfg: ModelConfig, raw: dict) -> str:
    """``msg`` with each of our tensor names followed by the file's tensor that holds it."""
    if fam.load is not None:
        return msg
    for slot in fam.slots(cfg, raw):
        for ours in slot.ours:
            if f"tensor {ours} " in msg:
                return msg.replace(f"tensor {ours} ", f"tensor {ours} (the file's {slot.theirs}) ", 1)
    return msg


def is_hf_folder(path: str | Path) -> bool:
    """True for a folder whose config.json names a ``model_type`` (any; unsupported ones are
    refused with their name by :func:`load_hf`)."""
    return hf_config(Path(path)) is not None


def load_hf(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """The model in a local Hugging Face folder, with its tokenizer's names when it has one."""
    path = Path(path)
    raw = hf_config(path)
    if raw is None:
        raise CheckpointError(f"{path} is not a Hugging Face folder (config.json with a model_type)")
    fam = family(raw)
    cfg = model_config(raw)
    check_fits(cfg, path.name)
    tensors = Tensors(path)
    tied = flag(raw, "tie_word_embeddings", fam.tied)
    prefix = fam.prefix

    def name(n: str) -> str:  # the file's own spelling: with or without the family's prefix (as asked: absent)
        for spelling in (n, n.removeprefix(prefix), prefix + n):
            if spelling in tensors:
                return spelling
        return n

    def has(n: str) -> bool:
        return name(n) in tensors

    def get(n: str, shape: tuple[int, ...]) -> torch.Tensor:
        return tensors.get(name(n), shape)

    if not tied and not has(fam.head):
        raise CheckpointError(f"the checkpoint lacks {fam.head!r} and its config does not tie it to the embedding")
    try:  # every tensor's shape is checked against the config before its data is read
        ours = convert(fam, cfg, raw, get, has)
    finally:
        tensors.close()
    try:
        model = build_checked(cfg, ours)
    except CheckpointError as e:  # a bad value: named as the file spells the tensor too
        raise CheckpointError(_file_names(str(e), fam, cfg, raw)) from None
    del ours
    stamp = json.dumps(
        [str(path.resolve()), raw, [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in tensors.files]],
        sort_keys=True,
    )
    key = f"{path.name}:{hashlib.sha1(stamp.encode()).hexdigest()[:16]}"
    card = Card(
        source=str(path),
        vocab_file=VOCAB if (path / VOCAB).is_file() and not (path / TOKENIZER).is_file() else None,
        details={"architecture": fam.model_type, "note": IMPORTED},
    )
    return LoadedModel(name=path.name, model=model.to(device).eval(), config=cfg, card=card, path=path, key=key)
