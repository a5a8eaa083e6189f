"""The zoo: named models. The shipped ones are in ``assets/models/``; more folders can be listed
in the ``ATTN_LAB_MODELS`` environment variable (``os.pathsep``-separated). Each model is a
folder in the checkpoint format (``attn_core/checkpoint.py``, ``docs/checkpoints.md``) or a
Hugging Face folder of a supported family (``attn_core/hf/``), and its name is the folder's name. Loading by name is ``attn_core.sources.resolve``.
"""

from __future__ import annotations

import os
from pathlib import Path

from attn_core import hf
from attn_core.card import Card
from attn_core.checkpoint import CARD, CONFIG, WEIGHTS, CheckpointError, read_card, read_config
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
        for folder in sorted(
            p
            for p in root.iterdir()
            if not p.name.startswith(".")  # an unfinished save (see checkpoint.save)
            and (p / CONFIG).is_file()
            and ((p / WEIGHTS).is_file() or (p / hf.INDEX).is_file())
        ):
            try:
                raw = hf.hf_config(folder)
                if raw is not None:  # a Hugging Face folder: its config mapped, no card
                    cfg, card = hf.model_config(raw), Card(details={"architecture": raw["model_type"]})
                else:
                    cfg, card = read_config(folder / CONFIG), read_card(folder / CARD)
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
