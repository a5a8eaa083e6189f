"""The sidebar's "Upload a model": uploaded files validated like the zoo and kept, under a name
made of their hash, in the run store's uploads folder."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import streamlit as st

from attn_core import checkpoint, sources
from attn_core.card import Card
from attn_core.sources import LoadedModel
from ui.markup import plain
from ui.state import MODEL_KEY

_UPLOAD_MSG = "_upload_message"


def upload_widget() -> None:
    with st.sidebar.expander("Upload a model"):
        folder = st.toggle(
            "Whole folder",
            key="upload_folder",
            help="Pick a model folder (model.safetensors, config.json, card.json) instead of single files.",
        )
        st.file_uploader(
            "Model folder" if folder else "model.safetensors (+ config.json, card.json)",
            type=["safetensors", "json"],
            accept_multiple_files="directory" if folder else True,
            key="upload_files",
            on_change=_on_upload,
            help="Validated like the zoo: only safetensors and JSON are read, never pickles. "
            f"A valid model is kept under {sources.upload_dir()} and appears in the model list.",
        )
        kind, text = st.session_state.get(_UPLOAD_MSG, (None, ""))
        if kind == "error":
            st.error(text)
        elif kind == "success":
            st.success(text)


def _on_upload() -> None:
    # A callback runs before the script, so it may also select the new model in the picker.
    files = st.session_state.get("upload_files") or []
    if not files:
        st.session_state.pop(_UPLOAD_MSG, None)
        return
    try:
        label = save_upload({Path(f.name).name: f.getvalue() for f in files})
    except (ValueError, OSError) as e:  # CheckpointError and LimitError included: one message, never a traceback
        st.session_state[_UPLOAD_MSG] = ("error", f"Not loaded: {plain(e)}")
        return
    st.session_state[MODEL_KEY] = label
    st.session_state[_UPLOAD_MSG] = ("success", f"Loaded and selected “{label}”.")


def save_upload(files: dict[str, bytes]) -> str:
    """Validate uploaded files (``{file name: content}``) as the zoo loader does and keep the
    model under ``<data dir>/uploads/<name>-<hash>/``; returns its picker label.

    The folder name is built from a sanitised file stem and a hash of every uploaded byte
    (weights, config and card), never from a path the user sent, so nothing can be written
    outside the data directory. The same upload twice lands in the same folder; an existing
    folder is reused only when it holds the same model and card, and nothing is overwritten."""
    weights = [n for n in files if n.endswith(".safetensors")]
    unknown = sorted(
        n for n in files if not n.endswith(".safetensors") and n not in (checkpoint.CONFIG, checkpoint.CARD)
    )
    if len(weights) != 1:
        raise checkpoint.CheckpointError(
            f"upload exactly one .safetensors file (got {len(weights)}), with its "
            "config.json unless the file carries its config"
        )
    if unknown:
        raise checkpoint.CheckpointError(
            f"unexpected file {unknown[0]!r}: a model is model.safetensors, config.json and card.json"
        )
    data = files[weights[0]]
    if len(data) > checkpoint.MAX_WEIGHTS_BYTES:
        raise checkpoint.CheckpointError(f"{weights[0]} is larger than {checkpoint.MAX_WEIGHTS_BYTES // 2**20} MiB")
    cfg = checkpoint.read_config_bytes(files[checkpoint.CONFIG]) if checkpoint.CONFIG in files else None
    card = checkpoint.read_card_bytes(files[checkpoint.CARD]) if checkpoint.CARD in files else None
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(weights[0]).stem).strip("-")[:40] or "model"
    loaded = checkpoint.load_bytes(data, cfg=cfg, card=card, name=stem)
    if loaded.card.vocab_file is not None:  # an upload is three files: a vocabulary would be read from elsewhere
        raise checkpoint.CheckpointError(
            f"the card names a vocabulary file ({plain(loaded.card.vocab_file, 80)}), which an upload cannot "
            "carry; remove vocab_file from card.json"
        )
    digest = upload_digest(data, files.get(checkpoint.CONFIG), files.get(checkpoint.CARD))
    for attempt in range(100):  # a different model under the same name: the next free name, never overwrite
        folder = sources.upload_dir() / (f"{stem}-{digest}" + (f"-{attempt + 1}" if attempt else ""))
        if folder.exists():
            if _same_upload(folder, loaded):
                return sources.UPLOAD_PREFIX + folder.name
            continue
        try:
            checkpoint.save(loaded.model, folder, card=loaded.card)
        except checkpoint.CheckpointError:
            if folder.exists():  # another session saved it first: compare on the next pass
                continue
            raise
        return sources.UPLOAD_PREFIX + folder.name
    raise checkpoint.CheckpointError(f"too many different uploads named {stem}-{digest}; rename the file")


def upload_digest(*parts: bytes | None) -> str:
    """The name-part of an upload folder: a hash of ALL its bytes (weights, config and card),
    each part length-prefixed so that moving bytes between parts changes the hash."""
    h = hashlib.sha256()
    for part in parts:
        part = part or b""
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()[:12]


def _card_text(card: Card) -> str:
    return json.dumps(card.to_dict(), sort_keys=True, default=str)  # NaN == NaN here, unlike in a dict


def _same_upload(folder: Path, loaded: LoadedModel) -> bool:
    """Whether the upload kept in ``folder`` is ``loaded``: the same config, card and weights."""
    try:
        kept = sources.resolve(sources.UPLOAD_PREFIX + folder.name)
    except (checkpoint.CheckpointError, OSError):
        return False
    if kept.config != loaded.config or _card_text(kept.card) != _card_text(loaded.card):
        return False
    mine, theirs = loaded.model.state_dict(), kept.model.state_dict()
    return mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine)
