"""Where a model comes from: the one way to turn what a user typed or picked into a
:class:`LoadedModel`, the object every view, job and page takes.

A source is one of (``docs/checkpoints.md``):

    "induction-2l"        a zoo model (assets/models, or a folder listed in ATTN_LAB_MODELS)
    "/path/to/folder"     a model folder (ours, or a Hugging Face folder: hf.FAMILIES) or a .safetensors file
    "run:<id>"            a saved run in the run store
    "upload: <name>"      a model the dashboard's upload widget kept under <data dir>/uploads

:func:`resolve` loads and validates it (:func:`outline`: the same without its weights); :func:`weights_path` names the file behind it, whose
modification time keys the dashboard's model cache. A source that names nothing, or a model
that cannot be read, is one :class:`CheckpointError` sentence (an unknown name lists the known
ones). A new Hugging Face family is a config mapping and a tensor layout in ``attn_core/hf/``.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from attn_core import checkpoint, hf, zoo
from attn_core.checkpoint import WEIGHTS, CheckpointError, LoadedModel, Outline
from attn_core.runs import RUN_PREFIX, RunStore, default_root
from attn_core.validate import shown

__all__ = [
    "LoadedModel",
    "CheckpointError",
    "RUN_PREFIX",
    "UPLOAD_PREFIX",
    "UPLOAD_DIR",
    "is_run",
    "is_upload",
    "upload_dir",
    "shown_name",
    "weights_path",
    "resolve",
    "outline",
]

UPLOAD_PREFIX = "upload: "
UPLOAD_DIR = "uploads"  # under the data directory (ATTN_LAB_RUNS), never anywhere else


def is_run(source: str | Path) -> bool:
    return str(source).startswith(RUN_PREFIX)


def is_upload(source: str | Path) -> bool:
    return str(source).startswith(UPLOAD_PREFIX)


def upload_dir(root: Path | None = None) -> Path:
    """Where uploads are kept: ``<root>/uploads``, root being the run store's data directory."""
    return Path(root if root is not None else default_root()) / UPLOAD_DIR


def shown_name(source: str | None) -> str | None:
    """A source in the page's words: an uploaded model's folder in the store as ``upload: <its
    name>`` (what the picker and the CLI take), anything else as given. A retraining job is given
    the folder (``/tmp/.../runs/uploads/llama-...``); a title, a caption or a shown command says
    the upload's own name, and keeps the path for a tooltip."""
    if source is None:
        return None
    path = Path(str(source))
    if path.is_absolute() and path.parent == upload_dir():
        return UPLOAD_PREFIX + path.name
    return str(source)


def _upload_folder(source: str, store: RunStore | None) -> Path:
    name = source[len(UPLOAD_PREFIX) :]
    if not name or name.startswith(".") or Path(name).name != name or len(name.encode()) > 255:
        raise CheckpointError(f"{shown(name)} is not an upload name (a folder name under the uploads directory)")
    return upload_dir(store.root if store is not None else None) / name


def _check_source(source: str | Path) -> str:
    """``source`` as a string, refused when it names nothing (``""`` would be the current folder)."""
    if not isinstance(source, (str, Path)) or not str(source).strip() or "\x00" in str(source):
        raise CheckpointError("no model given: name a zoo model, a folder, run:<id> or upload: <name>")
    return str(source)


def weights_path(source: str | Path, store: RunStore | None = None) -> Path:
    """The weights file behind ``source`` (its modification time keys caches); it need not
    exist yet (a run without weights, a deleted upload)."""
    source = _check_source(source)
    if is_run(source):
        with _as_checkpoint_error():
            return (store or RunStore()).path(source) / WEIGHTS
    path = _upload_folder(source, store) if is_upload(source) else zoo.locate(source)
    if path.is_dir() and not (path / WEIGHTS).exists() and (path / hf.INDEX).is_file():
        return path / hf.INDEX  # a sharded Hugging Face checkpoint (a folder, or an upload of one)
    return path / WEIGHTS if path.is_dir() else path


def resolve(source: str | Path, device: str = "cpu", store: RunStore | None = None) -> LoadedModel:
    """The model named by ``source`` (see above), loaded and validated; ``store`` is the run
    store for ``run:`` and ``upload:`` sources (default: the one in ATTN_LAB_RUNS)."""
    source = _check_source(source)
    loaded = _resolve(source, device, store)
    # the vocabulary file a card names is checked here, for every kind of source: a card that
    # names a file outside its folder (or a bad one) is refused when the model is loaded
    checkpoint.read_vocab(loaded.path, loaded.card.vocab_file, loaded.config.d_vocab)
    return loaded


def _resolve(source: str, device: str, store: RunStore | None) -> LoadedModel:
    if is_run(source):
        with _as_checkpoint_error():  # no such run, a bad id, an unreadable store
            return (store or RunStore()).load_model(source, device)
    if is_upload(source):
        loaded = _load(_upload_found(source, store), device)
        loaded.name = source
        return loaded
    return _load(zoo.locate(source), device)


def outline(source: str | Path, store: RunStore | None = None) -> Outline:
    """What :func:`resolve` finds for ``source`` without reading its weights: the config, the
    card (and so the task) and the folder, checked as :func:`resolve` checks them."""
    source = _check_source(source)
    if is_run(source):
        with _as_checkpoint_error():
            folder = (store or RunStore()).model_folder(source)
            found = checkpoint.read_outline(folder)
            found.name = RUN_PREFIX + folder.name
    elif is_upload(source):
        found = _outline(_upload_found(source, store))
        found.name = source
    else:
        found = _outline(zoo.locate(source))
    checkpoint.read_vocab(found.path, found.card.vocab_file, found.config.d_vocab)
    return found


def _outline(path: Path) -> Outline:
    if not hf.is_hf_folder(path):
        return checkpoint.read_outline(path)
    from attn_core.card import Card
    from attn_core.hf.folder import check_fits, hf_config
    from attn_core.hf.load import model_config

    cfg = model_config(hf_config(path))
    check_fits(cfg, path.name)
    return Outline(name=path.name, config=cfg, card=Card(source=str(path)), path=path)


def _upload_found(source: str, store: RunStore | None) -> Path:
    """The folder of an upload that exists (else a CheckpointError listing the known ones)."""
    folder = _upload_folder(source, store)
    if not folder.is_dir():
        known = (
            sorted(p.name for p in folder.parent.glob("*") if p.is_dir() and not p.name.startswith("."))
            if folder.parent.is_dir()
            else []
        )
        raise CheckpointError(f"no upload named {folder.name!r}; known uploads: {', '.join(known) or 'none'}")
    return folder


@contextmanager
def _as_checkpoint_error():
    """The run store's ValueErrors (one sentence each) as the CheckpointError every bad source raises."""
    try:
        yield
    except CheckpointError:
        raise
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def _load(path: Path, device: str) -> LoadedModel:
    """A folder or file in one of the formats read here: a Hugging Face folder, or ours."""
    if hf.is_hf_folder(path):
        return hf.load_hf(path, device)
    return checkpoint.load_path(path, device)
