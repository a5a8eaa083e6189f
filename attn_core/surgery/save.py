"""Where an edited model goes: a folder every command, page and ``export-hf`` opens (an imported
Hugging Face model, or a run of one, stays a folder of its own family: ``hf.family_export``; our
own models a model folder whose card names the parent and the edits), or a new run of the run
store (``save_run``), which the Runs page lists and ``run:<id>`` names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from attn_core import checkpoint
from attn_core.card import Card
from attn_core.checkpoint import LoadedModel
from attn_core.destinations import check_destination
from attn_core.surgery.edit import Edited

JOB = "edit"  # the card's job section names the kind of run


def edited_card(parent: LoadedModel, edited: Edited, command: str = "", measured: dict | None = None) -> Card:
    """The parent's card with the parent named, the command and the edits (``details["job"]``),
    and the after-measurements when given (``details["before"]``/``["after"]``: numbers only)."""
    from attn_core.hf.family_export import HF_DETAIL, hf_origin

    details = dict(parent.card.details)
    details["job"] = {"kind": JOB, "edits": [e.to_json() for e in edited.edits]}
    origin = hf_origin(parent)
    if origin is not None:
        details[HF_DETAIL] = origin
    for side in ("before", "after"):
        if measured and side in measured:
            details[side] = {k: v for k, v in measured[side].items() if k != "heads" and v is not None}
    return dataclasses.replace(parent.card, parent=parent.name, command=command, details=details, run_id=None)


def _files(parent: LoadedModel) -> dict[str, bytes]:
    from attn_core.hf.family_export import companion_files

    files = companion_files(parent.path)
    vocab = parent.card.vocab_file
    if vocab and parent.path is not None and Path(parent.path).is_dir() and (Path(parent.path) / vocab).is_file():
        files[vocab] = checkpoint.read_model_file(Path(parent.path), vocab, checkpoint.MAX_VOCAB_BYTES)
    return files


def save_edited(parent: LoadedModel, edited: Edited, out: str | Path, command: str = "", measured=None) -> dict:
    """Write the edited model at ``out`` (new; checked by ``check_destination``); returns
    ``{"out", "format"}``."""
    from attn_core.hf.family_export import export_family, hf_origin

    out = check_destination(out)
    origin = hf_origin(parent)
    if origin is not None:
        export_family(edited.loaded, out, origin)
        return {"out": str(out), "format": origin["model_type"]}
    card = edited_card(parent, edited, command, measured)
    checkpoint.save(edited.loaded.model, out, card=card, files=_files(parent))
    return {"out": str(out), "format": "attn-lab"}


def save_run(parent: LoadedModel, edited: Edited, store=None, measured: dict | None = None) -> str:
    """Save the edited model as a finished run of the run store (default: ATTN_LAB_RUNS); its id."""
    from attn_core.runs import RunStore

    store = store or RunStore()
    card = edited_card(parent, edited, "", measured)
    config = {"job": JOB, "edits": [e.to_json() for e in edited.edits]}
    task = parent.card.task
    return store.add_run(
        parent.name, task, config, "completed", model=edited.loaded.model, card=card, files=_files(parent)
    )
