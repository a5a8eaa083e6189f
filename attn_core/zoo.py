"""The zoo: named models. The shipped ones are in ``assets/models/``; more folders can be listed
in the ``ATTN_LAB_MODELS`` environment variable (``os.pathsep``-separated). Each model is a
folder in the checkpoint format (``attn_core/checkpoint.py``, ``docs/checkpoints.md``) and its
name is the folder's name. Loading by name is ``attn_core.sources.resolve``.
"""
from __future__ import annotations

import os
from pathlib import Path

# TRANSITIONAL re-exports (the checkpoint names other files still read as zoo.X): removed at
# integration, when they import attn_core.checkpoint.
from attn_core import hf  # noqa: F401  (TRANSITIONAL: for load() below)
from attn_core.card import Card
from attn_core.checkpoint import (  # noqa: F401
    CARD,
    CONFIG,
    MAX_JSON_BYTES,
    MAX_WEIGHTS_BYTES,
    WEIGHTS,
    CheckpointError,
    LoadedModel,
    build_checked,
    load_bytes,
    load_path,
    read_bytes,
    read_card,
    read_config,
    read_config_bytes,
    read_json,
    read_json_bytes,
    refuse_pickle,
    save,
    to_safetensors_bytes,
)
from attn_core.model import ModelConfig

ZOO_DIR = Path(__file__).resolve().parent.parent / "assets" / "models"
ENV_DIRS = "ATTN_LAB_MODELS"


def model_dirs() -> list[Path]:
    """The folders searched for named models: the shipped zoo, then ``$ATTN_LAB_MODELS``."""
    dirs = [ZOO_DIR]
    for part in os.environ.get(ENV_DIRS, "").split(os.pathsep):
        if part.strip():
            dirs.append(Path(part).expanduser())
    return dirs


def list_models() -> list[dict]:
    """One summary per model folder found in the zoo and the user's folders."""
    out = []
    for root in model_dirs():
        if not root.is_dir():
            continue
        for folder in sorted(p for p in root.iterdir()
                             if not p.name.startswith(".")  # an unfinished save (see checkpoint.save)
                             and (p / CONFIG).is_file() and (p / WEIGHTS).is_file()):
            try:
                cfg = read_config(folder / CONFIG)
                card = read_card(folder / CARD)
            except CheckpointError:
                continue  # a broken user folder must not hide the rest of the zoo
            out.append(summary(folder.name, cfg, card, folder))
    return out


def summary(name: str, cfg: ModelConfig, card: Card, path: Path | None = None) -> dict:
    return {
        "name": name,
        "task": card.task,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "d_model": cfg.d_model,
        "d_head": cfg.d_head,
        "qk": cfg.qk,
        "d_mlp": cfg.d_mlp,
        "params": cfg.n_params(),
        "accuracy": card.accuracy,
        "path": str(path) if path else None,
    }


def locate(name_or_path: str | Path) -> Path:
    """The folder (or file) of a zoo/user model name, or a path to a model folder or
    .safetensors file; an unknown name is a :class:`CheckpointError` listing the known ones."""
    p = Path(name_or_path).expanduser()
    if p.exists():
        return p
    for root in model_dirs():
        if (root / str(name_or_path) / CONFIG).is_file():
            return root / str(name_or_path)
    known = ", ".join(m["name"] for m in list_models()) or "none"
    raise CheckpointError(f"no model named {str(name_or_path)!r}; known models: {known}")


# --- TRANSITIONAL: old names still used by files outside the models layer; removed at integration
resolve = locate  # now zoo.locate (a path) or attn_core.sources.resolve (a model)
_build_checked, _read_json, _read_card, _read_config = build_checked, read_json, read_card, read_config
_refuse_pickle, _read_bytes = refuse_pickle, read_bytes


def load(name_or_path: str | Path, device: str = "cpu") -> LoadedModel:
    """TRANSITIONAL: use ``attn_core.sources.resolve`` (this is its zoo-name/path branch)."""
    path = locate(name_or_path)
    return hf.load_gpt2(path, device) if hf.is_gpt2_folder(path) else load_path(path, device)
