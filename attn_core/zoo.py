"""Checkpoints: scan, load, validate and save models as safetensors + JSON (never pickle).

A model folder holds ``model.safetensors`` (tensor names as TransformerLens' state dict),
``config.json`` (:class:`ModelConfig`) and ``card.json`` (task, measured metrics, seed, steps,
wall time, the command that reproduces it). The shipped zoo is ``assets/models/``; more folders
can be listed in the ``ATTN_LAB_MODELS`` environment variable (``os.pathsep``-separated) or
passed as paths. The config is also written into the safetensors metadata, so a lone
``.safetensors`` file (an upload, say) is self-describing.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load_bytes
from safetensors.torch import save as st_save_bytes

from attn_core.card import Card
from attn_core.sources import LoadedModel
from attn_core.model import ModelConfig, Transformer

ZOO_DIR = Path(__file__).resolve().parent.parent / "assets" / "models"
ENV_DIRS = "ATTN_LAB_MODELS"
WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "card.json"
MAX_JSON_BYTES = 1_000_000
MAX_WEIGHTS_BYTES = 512 * 2**20


class CheckpointError(ValueError):
    """A model that cannot be loaded; the message says what is wrong, in one sentence."""


# --- discovery ---------------------------------------------------------------------------------

def model_dirs() -> list[Path]:
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
                             if not p.name.startswith(".")  # an unfinished save (see save())
                             and (p / CONFIG).is_file() and (p / WEIGHTS).is_file()):
            try:
                cfg = _read_config(folder / CONFIG)
                card = _read_card(folder / CARD)
            except CheckpointError:
                continue  # a broken user folder must not hide the rest of the zoo
            out.append(summary(folder.name, cfg, card, folder))
    return out


def summary(name: str, cfg: ModelConfig, card: Card, path: Optional[Path] = None) -> dict:
    return {
        "name": name,
        "task": card.task,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "d_model": cfg.d_model,
        "d_head": cfg.d_head,
        "qk": cfg.qk,
        "d_mlp": cfg.d_mlp,
        "params": _n_params(cfg),
        "accuracy": card.accuracy,
        "path": str(path) if path else None,
    }


def _n_params(cfg: ModelConfig) -> int:
    with torch.device("meta"):
        return Transformer(cfg).n_params()


def resolve(name_or_path: str | Path) -> Path:
    """A zoo/user model name or a path to a model folder or .safetensors file."""
    p = Path(name_or_path).expanduser()
    if p.exists():
        return p
    for root in model_dirs():
        if (root / str(name_or_path) / CONFIG).is_file():
            return root / str(name_or_path)
    known = ", ".join(m["name"] for m in list_models()) or "none"
    raise CheckpointError(f"no model named {str(name_or_path)!r}; known models: {known}")


# --- loading -----------------------------------------------------------------------------------

def load(name_or_path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    path = resolve(name_or_path)
    from attn_core import hf  # a local Hugging Face GPT-2 folder is converted, not validated here

    if hf.is_gpt2_folder(path):
        return hf.load_gpt2(path, device)
    if path.is_dir():
        weights = path / WEIGHTS
        if not weights.is_file():
            raise CheckpointError(f"{path} has no {WEIGHTS}")
        cfg = _read_config(path / CONFIG) if (path / CONFIG).is_file() else None
        card = _read_card(path / CARD)
        name = path.name
    else:
        weights, cfg, card, name = path, None, None, path.stem
    data = _read_bytes(weights, MAX_WEIGHTS_BYTES)
    loaded = load_bytes(data, cfg=cfg, card=card, name=name, device=device)
    loaded.path = path
    return loaded


def load_bytes(data: bytes, cfg: Optional[ModelConfig] = None, card: Optional[Card] = None,
               name: str = "upload", device: str | torch.device = "cpu") -> LoadedModel:
    """Validate and load safetensors bytes (a file's content or an upload)."""
    _refuse_pickle(data)
    try:
        tensors = st_load_bytes(data)
    except (SafetensorError, Exception) as e:  # the Rust loader raises several error types
        raise CheckpointError(f"not a readable safetensors file ({_first_line(e)}); is it truncated?") from None
    if cfg is None:
        cfg = _config_from_metadata(data)
    if card is None:
        meta_card = _metadata(data).get("card")
        card = Card.from_dict(_parse_json_text(meta_card, "card in the safetensors metadata") if meta_card else None,
                              "the card in the safetensors metadata")
    model = _build_checked(cfg, tensors)
    key = f"{name}:{hashlib.sha1(data).hexdigest()[:16]}"
    return LoadedModel(name=name, model=model.to(device).eval(), config=cfg, card=card, key=key)


def _build_checked(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> Transformer:
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing:
        raise CheckpointError(f"missing tensors for this config: {', '.join(missing[:5])}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    if extra:
        raise CheckpointError(f"unexpected tensors for this config: {', '.join(extra[:5])}")
    for k, shape in expected.items():
        t = tensors[k]
        if tuple(t.shape) != shape:
            raise CheckpointError(f"tensor {k} has shape {list(t.shape)}, the config needs {list(shape)}")
        if not t.is_floating_point():
            raise CheckpointError(f"tensor {k} has dtype {t.dtype}; weights must be floating point")
        if not torch.isfinite(t).all():
            raise CheckpointError(f"tensor {k} contains NaN or Inf values")
    model = Transformer(cfg)
    model.load_state_dict({k: v.float() for k, v in tensors.items()})
    return model


def _refuse_pickle(data: bytes) -> None:
    if len(data) < 9:
        raise CheckpointError("file is too short to be a safetensors checkpoint (truncated?)")
    # A safetensors file is an 8-byte little-endian header length, then a JSON header: that
    # length's low byte can be anything (0x80 included), so recognise the JSON first.
    if data[8:9] == b"{":
        return
    # pickle protocol 2+ starts with 0x80; torch.save files are zip archives ("PK").
    if data[:1] == b"\x80" or data[:2] == b"PK":
        raise CheckpointError("this looks like a pickle or torch.save file; only safetensors "
                              "checkpoints are read (pickles can run code and are never loaded)")


def _metadata(data: bytes) -> dict:
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data):
        return {}
    try:
        header = json.loads(data[8:8 + n])
    except ValueError:
        return {}
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def _config_from_metadata(data: bytes) -> ModelConfig:
    text = _metadata(data).get("config")
    if not text:
        raise CheckpointError("the safetensors file carries no config; provide its config.json")
    return _config_from_dict(_parse_json_text(text, "config in the safetensors metadata"))


def _read_bytes(path: Path, limit: int) -> bytes:
    size = path.stat().st_size
    if size > limit:
        raise CheckpointError(f"{path.name} is {size / 2**20:.1f} MiB; the limit is {limit / 2**20:.0f} MiB")
    return path.read_bytes()


def _parse_json_text(text, what: str):
    try:
        return json.loads(text)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{what} is not valid JSON ({e})") from None


def _read_json(path: Path) -> dict:
    raw = _read_bytes(path, MAX_JSON_BYTES)
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise CheckpointError(f"{path.name} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path.name} must hold a JSON object")
    return obj


def _read_card(path: Path) -> Card:
    """The card beside a model's weights (an empty card when there is none)."""
    if not path.is_file():
        return Card()
    try:
        return Card.from_dict(_read_json(path), path.name)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def read_json_bytes(data: bytes, what: str = "card.json") -> dict:
    """A JSON object given as bytes (an uploaded card.json)."""
    if len(data) > MAX_JSON_BYTES:
        raise CheckpointError(f"{what} is too large")
    obj = _parse_json_text(data, what)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{what} must hold a JSON object")
    return obj


def _config_from_dict(raw) -> ModelConfig:
    try:
        return ModelConfig.from_dict(raw)
    except (TypeError, ValueError) as e:
        raise CheckpointError(str(e)) from None


def _read_config(path: Path) -> ModelConfig:
    return _config_from_dict(_read_json(path))


def read_config_bytes(data: bytes) -> ModelConfig:
    """A config.json given as bytes (an upload)."""
    if len(data) > MAX_JSON_BYTES:
        raise CheckpointError("config.json is too large")
    return _config_from_dict(_parse_json_text(data, "config.json"))


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


# --- saving ------------------------------------------------------------------------------------

def to_safetensors_bytes(model: Transformer, card: Optional[Card | dict] = None) -> bytes:
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    meta = {"config": json.dumps(model.cfg.to_dict())}
    if card:
        meta["card"] = json.dumps(Card.from_dict(card).to_dict(), default=str)
    return st_save_bytes(tensors, metadata=meta)


def save(model: Transformer, folder: str | Path, card: Optional[Card | dict] = None, overwrite: bool = False) -> Path:
    """Write a model folder atomically: files go to a temporary sibling folder that is renamed
    into place, so a crash never leaves a half-written model and nothing existing is replaced
    unless ``overwrite``."""
    folder = Path(folder)
    card = Card.from_dict(card)  # a plain dict is checked against the schema
    if folder.exists() and not overwrite:
        raise CheckpointError(f"{folder} already exists; choose a new folder (nothing was overwritten)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a saved model is readable like any folder
    try:
        (tmp / WEIGHTS).write_bytes(to_safetensors_bytes(model, card))
        (tmp / CONFIG).write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")
        (tmp / CARD).write_text(json.dumps(card.to_dict(), indent=2, default=_json_default) + "\n")
        if folder.exists():
            old = folder.with_name(f".{folder.name}.old")
            folder.rename(old)
            tmp.rename(folder)
            _rmtree(old)
        else:
            tmp.rename(folder)
    except BaseException:
        _rmtree(tmp)
        raise
    return folder


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


def _rmtree(p: Path) -> None:
    import shutil

    shutil.rmtree(p, ignore_errors=True)
