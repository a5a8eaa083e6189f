"""The model card: what ``card.json`` holds, as one dataclass read and written everywhere.

A card travels with every checkpoint (zoo model, saved run, import, upload). The common fields
are typed here; a kind of run may add its own sections (a retrain's ``regularizers``,
``before``/``after`` and ``job``; a comparison's ``variant``; a growth's ``grow``; an import's
``architecture``), which are kept in ``details`` and written back at the top level, so the file
format is unchanged. The card is untrusted input: :meth:`Card.from_dict` checks every common
field's type and says in one sentence what is wrong (see ``docs/checkpoints.md``).
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, field, fields
from typing import Any

from attn_core.validate import is_int, is_number, is_real

# The measurements a card's ``metrics`` (and a run's before/after) may hold, in display order.
MEASURE_KEYS = ("accuracy", "loss", "entropy_data", "entropy_vocab", "top1_mass", "stable_rank")
# ... and what a run on text measures besides (attn_core.text.measure): kept by public() when present
TEXT_MEASURE_KEYS = ("perplexity", "tokens")


def machine() -> str:
    """Where a run was made: architecture, torch threads and version (recorded in every card)."""
    import torch

    return f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def public(measured: dict | None) -> dict | None:
    """The :data:`MEASURE_KEYS` (and :data:`TEXT_MEASURE_KEYS`) of a measurement (no per-head
    detail, no extra keys)."""
    keys = MEASURE_KEYS + TEXT_MEASURE_KEYS
    return None if measured is None else {k: measured[k] for k in keys if k in measured}


def _is_measurement(v: object) -> bool:
    """An object whose :data:`MEASURE_KEYS` (those present) are numbers (NaN allowed) or null."""
    return isinstance(v, dict) and all(v.get(k) is None or is_real(v[k]) for k in MEASURE_KEYS)


def _is_str(v: object) -> bool:
    return isinstance(v, str)


def _is_dict(v: object) -> bool:
    return isinstance(v, dict)


# field name -> (accepted check, what it must be); None is allowed for every optional field
_CHECKS = {
    "name": (lambda v: isinstance(v, str), "a string"),
    "task": (lambda v: isinstance(v, str), "a task name (a string)"),
    "description": (lambda v: isinstance(v, str), "a string"),
    "metrics": (_is_measurement, "an object of measurements (numbers)"),
    "seed": (is_int, "an integer"),
    "steps": (is_int, "an integer"),
    "wall_time_s": (is_number, "a number of seconds"),
    "device": (lambda v: isinstance(v, str), "a string"),
    "machine": (lambda v: isinstance(v, str), "a string"),
    "params": (is_int, "an integer"),
    "command": (lambda v: isinstance(v, str), "a string"),
    "created": (lambda v: isinstance(v, str), "a date string"),
    "train": (lambda v: isinstance(v, dict), "an object (the training recipe)"),
    "preset": (lambda v: isinstance(v, str), "a preset name"),
    "parent": (lambda v: isinstance(v, str), "a model name"),
    "run_id": (lambda v: isinstance(v, str), "a run id"),
    "status": (lambda v: isinstance(v, str), "a run status"),
    "message": (lambda v: isinstance(v, str), "a string"),
    "source": (lambda v: isinstance(v, str), "a string"),
    "vocab_file": (lambda v: isinstance(v, str), "a file name"),
}

# the sections a kind of run adds (kept in Card.details): checked when present, like the fields
DETAIL_CHECKS = {
    "before": (_is_measurement, "an object of measurements (numbers)"),
    "after": (_is_measurement, "an object of measurements (numbers)"),
    "per_head": (_is_dict, "an object"),
    "job": (_is_dict, "an object (the job's settings)"),
    "grow": (_is_dict, "an object (the growth summary)"),
    "regularizers": (lambda v: isinstance(v, (list, dict)), "a list of regularizer specs"),
    "regularized_heads": (lambda v: isinstance(v, (list, str)), "a list of heads"),
    "variant": (_is_str, "a variant name"),
    "truncation": (lambda v: isinstance(v, list), "a list"),
    "architecture": (_is_str, "an architecture name"),
    "note": (_is_str, "a string"),
    "checkpoints": (_is_dict, "an object (the checkpoints kept across training)"),
    "distributed": (_is_dict, "an object (the workers a run trained on)"),
}


@dataclass
class Card:
    """What is known about a checkpoint: its task, how it was made and what it measured."""

    name: str = ""
    task: str | None = None  # a key of attn_core.tasks.TASKS; None for imported models
    description: str = ""
    metrics: dict = field(default_factory=dict)  # accuracy, loss (held out), eval_samples, split, ...
    seed: int | None = None
    steps: int | None = None
    wall_time_s: float | None = None
    device: str | None = None
    machine: str | None = None
    params: int | None = None
    command: str = ""  # the exact command that reproduces it
    created: str | None = None
    train: dict = field(default_factory=dict)  # TrainConfig.to_dict() of the recipe
    preset: str | None = None
    parent: str | None = None  # retrained, grown or compared runs: what they started from
    run_id: str | None = None
    status: str | None = None  # runs: one of attn_core.runs.STATUSES
    message: str = ""
    source: str | None = None  # imports: where the weights came from
    vocab_file: str | None = None  # imports: vocab.json beside the weights
    details: dict = field(default_factory=dict)  # kind-specific sections, written at the top level

    @property
    def accuracy(self) -> float | None:
        acc = self.metrics.get("accuracy")
        return float(acc) if is_number(acc) else None

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "details"}
        out = {k: v for k, v in out.items() if v is not None and v != "" and v != {}}
        return {**self.details, **out}

    @classmethod
    def from_dict(cls, raw: Any, what: str = "card.json") -> Card:
        """Check a parsed card; raises ValueError naming the first field of the wrong type."""
        if raw is None:
            return cls()
        if isinstance(raw, Card):
            return raw
        if not isinstance(raw, dict):
            raise ValueError(f"{what} must be a JSON object, not {type(raw).__name__}")
        known = {f.name for f in fields(cls)} - {"details"}
        values: dict = {}
        for key, v in raw.items():
            ok, must = _CHECKS.get(key) or DETAIL_CHECKS.get(key) or (None, "")
            if v is not None and ok is not None and not ok(v):
                bad = [k for k in MEASURE_KEYS if isinstance(v, dict) and not (v.get(k) is None or is_real(v[k]))]
                if bad:  # a measurement object with a wrong value: name the value
                    key, v, must = f"{key}.{bad[0]}", v[bad[0]], "a number"
                raise ValueError(f"{what}: {key!r} must be {must}, not {_type_name(v)}")
            if key in known and v is not None:
                values[key] = v
        details = {k: v for k, v in raw.items() if k not in known}
        return cls(**values, details=details)


def _type_name(v: object) -> str:
    """What a JSON value is, for a message."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(type(v)) or (
        "a number" if isinstance(v, (int, float)) else type(v).__name__
    )
