"""Where a model comes from, and the one object every view, job and page takes: LoadedModel."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from attn_core.card import Card
from attn_core.model import ModelConfig, Transformer
from attn_core.tasks import TASKS, Task


@dataclass
class LoadedModel:
    """A model with what is known about it: its config, its card (and so its task) and where it
    was read from. ``key`` identifies these exact weights."""

    name: str
    model: Transformer
    config: ModelConfig
    card: Card = field(default_factory=Card)
    path: Optional[Path] = None
    key: str = ""

    @property
    def task(self) -> Optional[Task]:
        return TASKS.get(self.card.task or "")


# --- resolving a source ------------------------------------------------------------------------
# The one way to turn what a user typed or picked into a model. A source is one of:
#   "induction-2l"              a zoo model (assets/models, or a folder listed in ATTN_LAB_MODELS)
#   "/path/to/folder"           a model folder (ours, or a Hugging Face folder) or a .safetensors file
#   "run:<id>"                  a saved run in the run store
#   "upload: <name>"            a model the dashboard's upload widget kept under <data dir>/uploads
RUN_PREFIX = "run:"
UPLOAD_PREFIX = "upload: "
UPLOAD_DIR = "uploads"  # under the data directory (ATTN_LAB_RUNS), never anywhere else


def is_run(source: str) -> bool:
    return str(source).startswith(RUN_PREFIX)


def is_upload(source: str) -> bool:
    return str(source).startswith(UPLOAD_PREFIX)


def upload_dir(root: Optional[Path] = None) -> Path:
    from attn_core.runs import default_root

    return Path(root if root is not None else default_root()) / UPLOAD_DIR


def weights_path(source: str, store=None) -> Path:
    """The weights file behind ``source`` (its modification time keys caches)."""
    from attn_core import zoo
    from attn_core.runs import RunStore

    if is_run(source):
        return (store or RunStore()).path(str(source)) / zoo.WEIGHTS
    if is_upload(source):
        root = store.root if store is not None else None
        return upload_dir(root) / str(source)[len(UPLOAD_PREFIX):] / zoo.WEIGHTS
    path = zoo.resolve(source)
    return path / zoo.WEIGHTS if path.is_dir() else path


def resolve(source: str | Path, device: str = "cpu", store=None) -> LoadedModel:
    """The model named by ``source`` (see above), loaded and validated; ``store`` is the run
    store for ``run:`` and ``upload:`` sources (default: the one in ATTN_LAB_RUNS)."""
    from attn_core import zoo
    from attn_core.runs import RunStore

    source = str(source)
    if is_run(source):
        return (store or RunStore()).load_model(source, device)
    if is_upload(source):
        root = store.root if store is not None else None
        loaded = zoo.load(upload_dir(root) / source[len(UPLOAD_PREFIX):], device)
        loaded.name = source
        return loaded
    return zoo.load(source, device)
