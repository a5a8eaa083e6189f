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
