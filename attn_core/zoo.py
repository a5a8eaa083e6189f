"""The zoo: named models. The shipped ones are in ``assets/models/``; more folders can be listed
in the ``ATTN_LAB_MODELS`` environment variable (``os.pathsep``-separated). Each model is a
folder in the checkpoint format (``attn_core/checkpoint.py``, ``docs/checkpoints.md``) or a
Hugging Face folder of a supported family (``attn_core/hf/``), and its name is the folder's name;
a model folder listed itself (not its parent) is that one model. Loading by name is
``attn_core.sources.resolve``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from attn_core import hf
from attn_core.card import Card
from attn_core.checkpoint import CARD, CONFIG, WEIGHTS, CheckpointError, model_file, read_card, read_config
from attn_core.destinations import SHIPPED
from attn_core.model import ModelConfig
from attn_core.validate import shown

ZOO_DIR = SHIPPED / "models"
ENV_DIRS = "ATTN_LAB_MODELS"


def model_dirs() -> list[Path]:
    """The folders searched for named models: the shipped zoo, then ``$ATTN_LAB_MODELS``."""
    dirs = [ZOO_DIR]
    for part in os.environ.get(ENV_DIRS, "").split(os.pathsep):
        if part.strip():
            dirs.append(Path(part).expanduser())
    return dirs


def list_models(problems: list[str] | None = None) -> list[dict]:
    """One summary per model folder found in the zoo and the user's folders.

    Only configs and cards are read (never weights), and each folder once per change of its
    files (:func:`_entry`). A folder that cannot be read (bad JSON, a wrong type in its card, no
    permission, a file where a folder should be, ...) is skipped, never fatal: each is one
    sentence that names it, appended to ``problems`` when a list is given, else issued as a
    :class:`ModelFolderWarning`."""
    out, found = [], []
    for root in model_dirs():
        try:
            if not root.exists():
                continue
            if not root.is_dir():
                raise NotADirectoryError(f"it is not a folder (listed in {ENV_DIRS})")
            own = _entry(root) if root != ZOO_DIR else None  # a model folder listed itself, not its parent
            folders = (
                [root] if own else sorted(p for p in root.iterdir() if not p.name.startswith("."))
            )  # .x: unfinished
        except OSError as e:
            found.append(f"skipped {root}: {_reason(e)}")
            continue
        for folder in folders:
            entry = _entry(folder)
            if isinstance(entry, dict):
                out.append(dict(entry))  # a copy: the remembered one stays as read
            elif entry:
                found.append(entry)
    if problems is not None:
        problems.extend(found)
    else:
        for text in found:
            warnings.warn(text, ModelFolderWarning, stacklevel=2)
    return out


# folder -> (stamp of its files, its summary, or why it was skipped, or None: not a model folder).
# A folder is read again only when one of its files changed: a broken folder costs its reading
# once per change, not on every listing (the dashboard lists the zoo on every rerun of every page).
_SEEN: dict[Path, tuple[tuple, dict | str | None]] = {}
_MAX_SEEN = 4096


def _stamp(folder: Path) -> tuple:
    """What identifies a folder's files: the (mtime, size) of its config, card and weights."""
    out = []
    for name in (CONFIG, CARD, WEIGHTS, hf.INDEX):
        try:
            st = os.stat(folder / name)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


def _entry(folder: Path) -> dict | str | None:
    """A folder's summary, the sentence why it is skipped, or None when it is no model folder:
    read from its config and card only (never its weights), remembered until its files change."""
    try:
        stamp = _stamp(folder)
    except OSError as e:  # a name the file system cannot hold
        return f"skipped model folder {folder}: {_reason(e)}"
    seen = _SEEN.get(folder)
    if seen is not None and seen[0] == stamp:
        return seen[1]
    try:
        if not ((folder / CONFIG).is_file() and ((folder / WEIGHTS).is_file() or (folder / hf.INDEX).is_file())):
            entry = None  # not a model folder
        else:
            raw = hf.hf_config(folder)
            if raw is not None:  # a Hugging Face folder: its config mapped, no card
                cfg, card = hf.model_config(raw), Card(details={"architecture": raw["model_type"]})
            else:  # every file through model_file: a link leading out of the folder is refused
                cfg, card = read_config(model_file(folder, CONFIG)), read_card(model_file(folder, CARD))
            model_file(folder, WEIGHTS)
            entry = summary(folder.name, cfg, card, folder)
    except Exception as e:  # noqa: BLE001 -- one bad folder must not hide the rest of the zoo
        entry = f"skipped model folder {folder}: {_reason(e)}"
    if len(_SEEN) >= _MAX_SEEN:
        _SEEN.clear()
    _SEEN[folder] = (stamp, entry)
    return entry


class ModelFolderWarning(UserWarning):
    """A model folder that :func:`list_models` skipped (the message names it and says why)."""


def _reason(e: BaseException) -> str:
    if isinstance(e, RecursionError):
        return "its JSON is nested too deeply"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return " ".join(str(e).split())[:300] or type(e).__name__


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
        # what a list of models shows of each card, so that listing never loads weights
        "description": card.description,
        "steps": card.steps,
        "wall_time_s": card.wall_time_s,
        "seed": card.seed,
        "command": card.command,
        "preset": card.preset,
    }


def locate(name_or_path: str | Path) -> Path:
    """The folder (or file) of a zoo/user model name, or a path to a model folder or
    .safetensors file; an unknown name is a :class:`CheckpointError` listing the known ones."""
    if not str(name_or_path).strip():
        raise CheckpointError("no model given: name a zoo model, a model folder or a .safetensors file")
    p = Path(name_or_path).expanduser()
    try:
        if p.exists():
            return p
    except OSError:  # a name the file system cannot hold (too long): not a path, maybe a name
        pass
    for root in model_dirs():
        try:
            if (root / str(name_or_path) / CONFIG).is_file():
                return root / str(name_or_path)
            if root != ZOO_DIR and root.name == str(name_or_path) and isinstance(_entry(root), dict):
                return root  # a model folder listed itself in ATTN_LAB_MODELS
        except (OSError, ValueError):  # a name the file system cannot hold: not a model here
            continue
    known = ", ".join(m["name"] for m in list_models(problems=[])) or "none"
    raise CheckpointError(f"no model named {shown(str(name_or_path))}; known models: {known}")
