"""Checkpoints: read, validate and write a model as safetensors + JSON (never pickle).

A model folder holds ``model.safetensors`` (tensor names as TransformerLens' state dict),
``config.json`` (:class:`ModelConfig`) and ``card.json`` (:class:`Card`: task, measured metrics,
seed, steps, wall time, the command that reproduces it). The config (and card) are also written
into the safetensors metadata, so a lone ``.safetensors`` file (an upload, say) is
self-describing. Everything read is untrusted: sizes are limited before reading, a pickle is
refused, every tensor's name, shape, dtype and finiteness is checked against the config, and a
failure is one :class:`CheckpointError` sentence. Writes are atomic. See ``docs/checkpoints.md``.

:class:`LoadedModel` is what every loader returns (and what ``attn_core.sources.resolve`` hands
to views, jobs and pages).
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import re
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as st_load_bytes
from safetensors.torch import save as st_save_bytes

from attn_core.card import Card
from attn_core.model import ModelConfig, Transformer
from attn_core.tasks import TASKS, Task

WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "card.json"
MAX_JSON_BYTES = 1_000_000
MAX_WEIGHTS_BYTES = 512 * 2**20


class CheckpointError(ValueError):
    """A model that cannot be loaded; the message says what is wrong, in one sentence."""


@dataclass
class LoadedModel:
    """A model with what is known about it: its config, its card (and so its task) and where it
    was read from. ``key`` identifies these exact weights."""

    name: str
    model: Transformer
    config: ModelConfig
    card: Card = field(default_factory=Card)
    path: Path | None = None
    key: str = ""

    @property
    def task(self) -> Task | None:
        return TASKS.get(self.card.task or "")


# --- reading -----------------------------------------------------------------------------------


def load_path(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """A model folder (``model.safetensors`` + ``config.json`` [+ ``card.json``]) or a lone
    ``.safetensors`` file whose metadata carries the config."""
    path = Path(path)
    if path.is_dir():
        weights = path / WEIGHTS
        if not weights.is_file():
            raise CheckpointError(f"{path} has no {WEIGHTS}")
        cfg = read_config(path / CONFIG) if (path / CONFIG).is_file() else None
        card = read_card(path / CARD)
        name = path.name
    else:
        weights, cfg, card, name = path, None, None, path.stem
    data = read_bytes(weights, MAX_WEIGHTS_BYTES)
    loaded = load_bytes(data, cfg=cfg, card=card, name=name, device=device)
    loaded.path = path
    return loaded


def load_bytes(
    data: bytes,
    cfg: ModelConfig | None = None,
    card: Card | None = None,
    name: str = "upload",
    device: str | torch.device = "cpu",
) -> LoadedModel:
    """Validate and load safetensors bytes (a file's content or an upload)."""
    refuse_pickle(data)
    try:
        tensors = st_load_bytes(data)
    except Exception as e:  # the Rust loader raises several error types
        raise CheckpointError(f"not a readable safetensors file ({_first_line(e)}); is it truncated?") from None
    if cfg is None:
        cfg = _config_from_metadata(data)
    if card is None:
        meta_card = _metadata(data).get("card")
        card = Card.from_dict(
            _parse_json_text(meta_card, "card in the safetensors metadata") if meta_card else None,
            "the card in the safetensors metadata",
        )
    model = build_checked(cfg, tensors)
    key = f"{name}:{hashlib.sha1(data).hexdigest()[:16]}"
    return LoadedModel(name=name, model=model.to(device).eval(), config=cfg, card=card, key=key)


def build_checked(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> Transformer:
    """A model of ``cfg`` holding ``tensors``, once every name, shape and value is checked."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing:
        raise CheckpointError(
            f"missing tensors for this config: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
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
    return Transformer.from_tensors(cfg, tensors)


def refuse_pickle(data: bytes) -> None:
    """Raise unless ``data`` can be a safetensors file; pickles are never loaded."""
    if len(data) < 9:
        raise CheckpointError("file is too short to be a safetensors checkpoint (truncated?)")
    # A safetensors file is an 8-byte little-endian header length, then a JSON header: that
    # length's low byte can be anything (0x80 included), so recognise the JSON first.
    if data[8:9] == b"{":
        return
    # pickle protocol 2+ starts with 0x80; torch.save files are zip archives ("PK").
    if data[:1] == b"\x80" or data[:2] == b"PK":
        raise CheckpointError(
            "this looks like a pickle or torch.save file; only safetensors "
            "checkpoints are read (pickles can run code and are never loaded)"
        )


def read_bytes(path: Path, limit: int) -> bytes:
    """A file's content, refused when it is larger than ``limit`` bytes."""
    size = path.stat().st_size
    if size > limit:
        raise CheckpointError(f"{path.name} is {size / 2**20:.1f} MiB; the limit is {limit / 2**20:.0f} MiB")
    return path.read_bytes()


def read_json(path: Path) -> dict:
    """A JSON object from a file (size-limited)."""
    raw = read_bytes(path, MAX_JSON_BYTES)
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise CheckpointError(f"{path.name} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path.name} must hold a JSON object")
    return obj


def read_json_bytes(data: bytes, what: str = "card.json") -> dict:
    """A JSON object given as bytes (an uploaded card.json)."""
    if len(data) > MAX_JSON_BYTES:
        raise CheckpointError(f"{what} is too large")
    obj = _parse_json_text(data, what)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{what} must hold a JSON object")
    return obj


def read_card(path: Path) -> Card:
    """The card beside a model's weights (an empty card when there is none)."""
    if not path.is_file():
        return Card()
    try:
        return Card.from_dict(read_json(path), path.name)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def read_config(path: Path) -> ModelConfig:
    """A config.json, checked by :meth:`ModelConfig.from_dict`."""
    return _config_from_dict(read_json(path))


def read_config_bytes(data: bytes) -> ModelConfig:
    """A config.json given as bytes (an upload)."""
    if len(data) > MAX_JSON_BYTES:
        raise CheckpointError("config.json is too large")
    return _config_from_dict(_parse_json_text(data, "config.json"))


def _config_from_dict(raw) -> ModelConfig:
    try:
        return ModelConfig.from_dict(raw)
    except (TypeError, ValueError) as e:
        raise CheckpointError(str(e)) from None


def _metadata(data: bytes) -> dict:
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data):
        return {}
    try:
        header = json.loads(data[8 : 8 + n])
    except ValueError:
        return {}
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def _config_from_metadata(data: bytes) -> ModelConfig:
    text = _metadata(data).get("config")
    if not text:
        raise CheckpointError("the safetensors file carries no config; provide its config.json")
    return _config_from_dict(_parse_json_text(text, "config in the safetensors metadata"))


def _parse_json_text(text, what: str):
    try:
        return json.loads(text)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{what} is not valid JSON ({e})") from None


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


# --- writing -----------------------------------------------------------------------------------


def to_safetensors_bytes(model: Transformer, card: Card | dict | None = None) -> bytes:
    """The weights as safetensors bytes, the config (and card) in the metadata."""
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    meta = {"config": json.dumps(model.cfg.to_dict())}
    if card:
        meta["card"] = json.dumps(Card.from_dict(card).to_dict(), default=str)
    return st_save_bytes(tensors, metadata=meta)


def save(model: Transformer, folder: str | Path, card: Card | dict | None = None, overwrite: bool = False) -> Path:
    """Write a model folder atomically: files go to a temporary sibling folder that is renamed
    into place, so a crash never leaves a half-written model and nothing existing is replaced
    unless ``overwrite``. The temporary folder's name carries this host and process
    (:func:`tmp_owner`), so the left-over of a killed save is known as such and removed by the
    next save of the same folder (and by the run store) as soon as its process is gone."""
    folder = Path(folder)
    card = Card.from_dict(card)  # a plain dict is checked against the schema
    if folder.exists() and not overwrite:
        raise CheckpointError(f"{folder} already exists; choose a new folder (nothing was overwritten)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(folder.parent, folder.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}{TMP_MARK}{_HOST}-{os.getpid()}-", dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a saved model is readable like any folder
    try:
        (tmp / WEIGHTS).write_bytes(to_safetensors_bytes(model, card))
        (tmp / CONFIG).write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")
        (tmp / CARD).write_text(json.dumps(card.to_dict(), indent=2, default=_json_default) + "\n")
        if folder.exists():
            old = tmp.with_name(tmp.name + "-old")
            folder.rename(old)
            tmp.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


TMP_MARK = ".tmp-"  # .<folder>.tmp-<host tag>-<pid>-<random>[-old]: a save in progress (or killed)
_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
_TMP = re.compile(r"\.tmp-([0-9a-f]{8})-(\d+)-[A-Za-z0-9_]+(?:-old)?$")
_OLD_TMP = re.compile(r"^\.[^.]+\.(?:[a-z0-9_]{8}|old)$")  # mkdtemp's names before TMP_MARK


def check_destination(path: str | Path, what: str = "--out") -> Path:
    """Refuse, before any work, a destination that exists or cannot be created: the nearest
    existing folder above it must take a new (hidden, removed at once) folder."""
    path = Path(path).expanduser()
    if path.exists() or path.is_symlink():
        raise ValueError(f"{what} {path} already exists; choose a new path (nothing was overwritten)")
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{what} {path}: {parent} is not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{path.name}{TMP_MARK}{_HOST}-{os.getpid()}-", dir=parent))
    except OSError as e:
        raise ValueError(f"{what} {path} cannot be written ({e.strerror or e} in {parent})") from None
    return path


def pid_alive(pid: int | None) -> bool:
    """Whether process ``pid`` of this host exists."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def tmp_owner(path: Path) -> tuple[bool, int] | None:
    """(made on this host, pid) of a temporary save folder of :func:`save`, None for any other name."""
    m = _TMP.search(path.name)
    return None if m is None or not path.name.startswith(".") else (m.group(1) == _HOST, int(m.group(2)))


def remove_stale_tmp(directory: Path, name: str | None = None, max_age_s: float | None = None) -> list[Path]:
    """Remove the temporary save folders in ``directory`` (of folder ``name`` only, if given) whose
    process on this host is gone; with ``max_age_s``, also those older than that (a save on
    another host, or one named by an older version: ``.<name>.<8 characters>``). Nothing else
    is touched. Returns what was removed."""
    removed, now = [], time.time()
    try:
        entries = list(directory.glob(f".{glob.escape(name)}.*" if name else ".*"))
    except OSError:
        return removed
    for p in entries:
        try:
            if not p.is_dir() or p.is_symlink():
                continue
            owner = tmp_owner(p)
            mine_and_dead = owner is not None and owner[0] and not pid_alive(owner[1]) and owner[1] != os.getpid()
            ours = owner is not None or _OLD_TMP.match(p.name) is not None
            too_old = ours and max_age_s is not None and now - p.stat().st_mtime > max_age_s
            if mine_and_dead or too_old:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
        except OSError:
            pass
    return removed


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)
