"""Checkpoints: read, validate and write a model as safetensors + JSON (never pickle).

A model folder holds ``model.safetensors`` (tensor names as TransformerLens' state dict),
``config.json`` (:class:`ModelConfig`) and ``card.json`` (:class:`Card`: task, measured metrics,
seed, steps, wall time, the command that reproduces it). The config (and card) are also written
into the safetensors metadata, so a lone ``.safetensors`` file (an upload, say) is
self-describing. Everything read is untrusted: sizes are limited before reading, a pickle is
refused, every tensor's name, shape, dtype and finiteness is checked against the config, and a
failure is one :class:`CheckpointError` sentence. Writes are atomic. See ``docs/checkpoints.md``.
Files and JSON are read through ``attn_core.untrusted`` (re-exported here).

:class:`LoadedModel` is what every loader returns (and what ``attn_core.sources.resolve`` hands
to views, jobs and pages).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as st_load_bytes
from safetensors.torch import save as st_save_bytes

from attn_core.card import Card
from attn_core.destinations import check_not_shipped, remove_stale_tmp, tmp_prefix, write_failed
from attn_core.model import ModelConfig, Transformer
from attn_core.model.rotary import inverse_frequencies
from attn_core.tasks import TASKS, Task
from attn_core.untrusted import (  # noqa: F401 -- re-exported: checkpoint.read_json and the like
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_VOCAB_BYTES,
    CheckpointError,
    model_file,
    parse_json,
    read_bytes,
    read_json,
    read_json_bytes,
    read_model_file,
    read_vocab,
)
from attn_core.untrusted import first_line as _first_line

WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "card.json"
CHECKPOINTS = "checkpoints"  # a run's weights across training (attn_core.training.checkpoints)
MAX_WEIGHTS_BYTES = 512 * 2**20
MAX_ABS_WEIGHT = 1e6  # trained weights are O(1) to O(10); beyond this, scores overflow float32
MAX_HEADER_BYTES = 100 * 2**20  # a safetensors header (the library's own limit)


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

    @property
    def cfg(self) -> ModelConfig:
        """The model's config, as ``Transformer.cfg``: either object answers ``.cfg``."""
        return self.model.cfg


@dataclass
class Outline:
    """What is known about a model without its weights (its config, its card and so its task,
    its folder): a :class:`LoadedModel` less the model, for what reads only these (a job's handle:
    the queue's estimate, the snapshot, the heads it may watch)."""

    name: str
    config: ModelConfig
    card: Card = field(default_factory=Card)
    path: Path | None = None

    @property
    def task(self) -> Task | None:
        return TASKS.get(self.card.task or "")


# --- reading -----------------------------------------------------------------------------------


def load_path(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """A model folder (``model.safetensors`` + ``config.json`` [+ ``card.json``]) or a lone
    ``.safetensors`` file whose metadata carries the config."""
    path = Path(path)
    if path.is_dir():  # every file of the folder through model_file: a link leading out is refused
        weights, config, card_file = (model_file(path, n) for n in (WEIGHTS, CONFIG, CARD))
        if not weights.is_file():
            raise CheckpointError(f"{path} has no {WEIGHTS}")
        cfg = read_config(config) if config.is_file() else None
        card = read_card(card_file)
        name = path.name
    else:
        weights, cfg, card, name = path, None, None, path.stem
    data = read_bytes(weights, MAX_WEIGHTS_BYTES)
    loaded = load_bytes(data, cfg=cfg, card=card, name=name, device=device)
    loaded.path = path
    return loaded


def read_outline(path: str | Path) -> Outline:
    """:func:`load_path`'s model without its weights: the config and card of a model folder (or
    of a lone ``.safetensors`` file's metadata), checked as :func:`load_path` checks them."""
    path = Path(path)
    if path.is_dir():
        weights, config, card_file = (model_file(path, n) for n in (WEIGHTS, CONFIG, CARD))
        if not weights.is_file():
            raise CheckpointError(f"{path} has no {WEIGHTS}")
        cfg, card, name = (read_config(config) if config.is_file() else None), read_card(card_file), path.name
    else:
        weights, cfg, card, name = path, None, None, path.stem
    if cfg is None or card is None:  # what the weights file's metadata carries
        data = read_bytes(weights, MAX_WEIGHTS_BYTES)
        refuse_pickle(data)
        cfg = cfg or _config_from_metadata(data)
        meta_card = _metadata(data).get("card")
        text = parse_json(meta_card, "card in the safetensors metadata") if meta_card else None
        card = card or Card.from_dict(text, "the card in the safetensors metadata")
    return Outline(name=name, config=cfg, card=card, path=path)


def load_bytes(
    data: bytes,
    cfg: ModelConfig | None = None,
    card: Card | None = None,
    name: str = "upload",
    device: str | torch.device = "cpu",
) -> LoadedModel:
    """Validate and load safetensors bytes (a file's content or an upload)."""
    refuse_pickle(data)
    if cfg is None and _header(data) is None:  # a text file, an image, /dev/null: nothing to read a config from
        raise CheckpointError(
            f"{name[:120]!r} is neither a model folder nor a safetensors file (no safetensors header)"
        )
    if cfg is None:
        cfg = _config_from_metadata(data)
    header = _header(data)
    if header is not None:  # names and declared shapes checked before any tensor is read
        check_names_and_shapes(
            cfg, {k: v.get("shape") for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}
        )
    try:
        tensors = st_load_bytes(data)
    except Exception as e:  # the Rust loader raises several error types
        raise CheckpointError(f"not a readable safetensors file ({_first_line(e)}); is it truncated?") from None
    if card is None:
        meta_card = _metadata(data).get("card")
        card = Card.from_dict(
            parse_json(meta_card, "card in the safetensors metadata") if meta_card else None,
            "the card in the safetensors metadata",
        )
    model = build_checked(cfg, tensors)
    key = f"{name}:{hashlib.sha1(data).hexdigest()[:16]}"
    return LoadedModel(name=name, model=model.to(device).eval(), config=cfg, card=card, key=key)


def check_names_and_shapes(cfg: ModelConfig, shapes: dict[str, object]) -> dict[str, tuple[int, ...]]:
    """Refuse unless ``shapes`` ({tensor name: shape}, read or declared by a header) are exactly
    the tensors of a model of ``cfg``; returns the expected shapes."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    missing = sorted(set(expected) - set(shapes))
    extra = sorted(set(shapes) - set(expected))
    if missing:
        raise CheckpointError(
            f"missing tensors for this config: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        )
    if extra:
        raise CheckpointError(f"unexpected tensors for this config: {', '.join(extra[:5])}")
    for k, shape in expected.items():
        got = shapes[k]
        if not isinstance(got, (list, tuple)) or tuple(got) != shape:
            shown = list(got) if isinstance(got, (list, tuple)) else got
            raise CheckpointError(f"tensor {k} has shape {shown}, the config needs {list(shape)}")
    return expected


def build_checked(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> Transformer:
    """A model of ``cfg`` holding ``tensors``, once every name, shape and value is checked."""
    expected = check_names_and_shapes(cfg, {k: tuple(t.shape) for k, t in tensors.items()})
    for k in expected:
        check_weight(k, tensors[k])
    return Transformer.from_tensors(cfg, tensors)


def check_weight(name: str, t: torch.Tensor) -> None:
    """Refuse (one CheckpointError sentence) a tensor no loader accepts: not floating point, NaN
    or Inf, or values beyond ``MAX_ABS_WEIGHT``. What every load checks, and every edit before
    it is measured or written (``surgery.edit``)."""
    if not t.is_floating_point():
        raise CheckpointError(f"tensor {name} has dtype {t.dtype}; weights must be floating point")
    # min and max in one pass, no temporary the size of the tensor (NaN or Inf shows in them)
    lo, hi = (float(v) for v in torch.aminmax(t.detach())) if t.numel() else (0.0, 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise CheckpointError(f"tensor {name} contains NaN or Inf values")
    top = max(-lo, hi)
    if top > MAX_ABS_WEIGHT:
        raise CheckpointError(
            f"tensor {name} holds values up to {top:.3g}; weights beyond {MAX_ABS_WEIGHT:g} overflow "
            "float32 attention scores, so nothing computed from them would be finite"
        )


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


def read_card(path: Path) -> Card:
    """The card beside a model's weights (an empty card when there is none)."""
    if not path.is_file():
        return Card()
    try:
        return Card.from_dict(read_json(path), path.name)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def read_card_bytes(data: bytes, what: str = "card.json") -> Card:
    """A card given as bytes (an uploaded card.json), checked against the schema like
    :func:`read_card`: a field of the wrong type (``task: [...]``, ``metrics: 5``) is one
    :class:`CheckpointError` sentence."""
    try:
        return Card.from_dict(read_json_bytes(data, what), what)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def read_config(path: Path) -> ModelConfig:
    """A config.json, checked by :meth:`ModelConfig.from_dict`."""
    return _config_from_dict(read_json(path))


def read_config_bytes(data: bytes) -> ModelConfig:
    """A config.json given as bytes (an upload)."""
    return _config_from_dict(parse_json(data, "config.json"))


def _config_from_dict(raw) -> ModelConfig:
    try:
        cfg = ModelConfig.from_dict(raw)
        if cfg.positional == "rotary":
            inverse_frequencies(cfg)  # finite and positive, or refused before any weight is read
        return cfg
    except (TypeError, ValueError) as e:
        raise CheckpointError(str(e)) from None


def _header(data: bytes) -> dict | None:
    """The JSON header of safetensors bytes (None when it cannot be read: the loader then says why)."""
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data):
        return None
    try:
        header = parse_json(data[8 : 8 + n], "the safetensors header", limit=MAX_HEADER_BYTES)
    except CheckpointError:
        return None
    return header if isinstance(header, dict) else None


def _metadata(data: bytes) -> dict:
    meta = (_header(data) or {}).get("__metadata__")
    return meta if isinstance(meta, dict) else {}


def metadata(data: bytes) -> dict:
    """The ``__metadata__`` of safetensors bytes ({} when there is none or it cannot be read)."""
    return _metadata(data)


def config_from_metadata(data: bytes) -> ModelConfig:
    """The config a safetensors file carries in its metadata (a one-sentence error without one)."""
    return _config_from_metadata(data)


def _config_from_metadata(data: bytes) -> ModelConfig:
    text = _metadata(data).get("config")
    if not text:
        raise CheckpointError("the safetensors file carries no config; provide its config.json")
    return _config_from_dict(parse_json(text, "config in the safetensors metadata"))


# --- writing -----------------------------------------------------------------------------------


def to_safetensors_bytes(model: Transformer, card: Card | dict | None = None) -> bytes:
    """The weights as safetensors bytes, the config (and card) in the metadata."""
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    meta = {"config": json.dumps(model.cfg.to_dict())}
    if card:
        meta["card"] = json.dumps(Card.from_dict(card).to_dict(), default=str)
    return st_save_bytes(tensors, metadata=meta)


def save(
    model: Transformer,
    folder: str | Path,
    card: Card | dict | None = None,
    overwrite: bool = False,
    include: dict[str, Path] | None = None,
    files: dict[str, bytes] | None = None,
) -> Path:
    """Write a model folder atomically: files go to a temporary sibling folder that is renamed
    into place, so a crash never leaves a half-written model and nothing existing is replaced
    unless ``overwrite``. The temporary folder's name carries this host and process
    (:func:`tmp_owner`), so the left-over of a killed save is known as such and removed by the
    next save of the same folder (and by the run store) as soon as its process is gone.
    ``include`` ({name: existing folder on the same disk}) moves those folders into the new one
    under ``name`` (a run's :data:`CHECKPOINTS`), back again if the save fails. ``files``
    (name -> bytes: a tokenizer, say) are written beside the weights, in the same rename."""
    folder = Path(folder)
    if any(Path(n).name != n or n in (WEIGHTS, CONFIG, CARD) or n.startswith(".") for n in files or {}):
        raise ValueError(f"files beside a model's weights need plain names of their own, not {sorted(files)}")
    card = Card.from_dict(card)  # a plain dict is checked against the schema
    try:
        check_not_shipped(folder, "the destination")  # never into the shipped zoo or inside a model
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if folder.exists() and not overwrite:
        raise CheckpointError(f"{folder} already exists; choose a new folder (nothing was overwritten)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(folder.parent, folder.name)
    tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix(folder.name), dir=folder.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a saved model is readable like any folder
    moved: list[tuple[Path, Path]] = []
    try:
        try:
            (tmp / WEIGHTS).write_bytes(to_safetensors_bytes(model, card))
            (tmp / CONFIG).write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")
            (tmp / CARD).write_text(json.dumps(card.to_dict(), indent=2, default=_json_default) + "\n")
            for name, data in (files or {}).items():
                (tmp / name).write_bytes(data)
        except OSError as e:  # a full disk: the folder is named, not the temporary one
            raise write_failed(e, folder) from None
        for name, source in (include or {}).items():
            Path(source).rename(tmp / name)
            moved.append((Path(source), tmp / name))
        if folder.exists():
            old = tmp.with_name(tmp.name + "-old")
            folder.rename(old)
            tmp.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(folder)
    except BaseException:
        kept = False
        for source, there in moved:  # what was moved in goes back where it was
            try:
                there.rename(source)
            except OSError:
                kept = True  # it cannot: the temporary folder stays, with it inside
        if not kept:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)
