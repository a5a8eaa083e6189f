"""The sidebar's "Upload a model": uploaded files validated like the zoo and kept, under a name
made of their hash, in the run store's uploads folder."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path, PurePosixPath

import streamlit as st

from attn_core import checkpoint, sources
from attn_core.card import Card
from attn_core.destinations import tmp_prefix
from attn_core.hf.upload import left_out_text, split_upload, upload_config
from attn_core.sources import LoadedModel
from ui.markup import plain
from ui.state import MODEL_KEY

_UPLOAD_MSG = "_upload_message"


def upload_widget() -> None:
    with st.sidebar.expander("Upload a model"):
        folder = st.toggle(
            "Whole folder",
            key="upload_folder",
            help="Pick a model folder instead of single files: ours (model.safetensors, config.json, card.json) "
            "or one that transformers' save_pretrained wrote (config.json, model.safetensors or its shards, "
            "tokenizer files).",
        )
        st.file_uploader(
            "Model folder" if folder else "model.safetensors (+ config.json, card.json)",
            type=None,  # every file is judged here, in one line (a folder holds a README, a pickle ...)
            accept_multiple_files="directory" if folder else True,
            key="upload_files",
            on_change=_on_upload,
            help="Validated like the zoo: only safetensors, JSON and tokenizer files are read, never pickles. A "
            "Hugging Face folder (its config.json names a model_type) is read as the zoo reads one. "
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
        named, deeper = folder_files({f.name: f.getvalue() for f in files})
        label = save_upload(named)
        left = (split_upload(named)[1] if upload_config(named) is not None else []) + deeper
    except (ValueError, OSError) as e:  # CheckpointError and LimitError included: one message, never a traceback
        st.session_state[_UPLOAD_MSG] = ("error", f"Not loaded: {plain(e)}")
        return
    st.session_state[MODEL_KEY] = label
    st.session_state[_UPLOAD_MSG] = ("success", f"Loaded and selected “{label}”. {plain(left_out_text(left))}".strip())


def folder_files(files: dict[str, bytes]) -> tuple[dict[str, bytes], list[str]]:
    """({file name: bytes} of the uploaded folder's own files, the paths in its subfolders): a
    folder picked in the browser sends each file with its path (``model/config.json``); a
    subfolder's file (a Trainer's ``checkpoint-500/config.json``) must not stand in for the
    folder's own."""
    parts = {name: PurePosixPath(name.replace("\\", "/")).parts or ("",) for name in files}
    top = min((len(p) for p in parts.values()), default=1)
    own = {parts[n][-1]: data for n, data in files.items() if len(parts[n]) == top}
    return own, sorted(n for n in files if len(parts[n]) > top)


def save_upload(files: dict[str, bytes]) -> str:
    """Validate uploaded files (``{file name: content}``) as the zoo loader does and keep the
    model under ``<data dir>/uploads/<name>-<hash>/``; returns its picker label.

    The folder name is built from a sanitised file stem and a hash of every uploaded byte
    (weights, config and card), never from a path the user sent, so nothing can be written
    outside the data directory. The same upload twice lands in the same folder; an existing
    folder is reused only when it holds the same model and card, and nothing is overwritten.
    A Hugging Face folder (its config.json names a ``model_type``) is kept as such: see
    :func:`save_hf_upload`."""
    if upload_config(files) is not None:
        return save_hf_upload(files)
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
            f"unexpected file {unknown[0]!r}: a model is model.safetensors, config.json and card.json "
            "(a Hugging Face folder is recognised by its config.json, which names a model_type)"
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


def save_hf_upload(files: dict[str, bytes]) -> str:
    """Keep an uploaded Hugging Face folder as it is (its config, weights and tokenizer files;
    ``attn_core.hf.upload``) under ``<data dir>/uploads/<model_type>-<hash>/``, once the one
    Hugging Face folder reader (``sources.resolve``) has read it with every check of a folder on
    disk; returns its picker label. The folder is written beside its final place and renamed in
    only when it reads, so a refused upload leaves nothing; the same files twice land in the
    same folder, and different files never overwrite one."""
    kept, _ = split_upload(files)
    kind = upload_config(files)["model_type"]
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", kind).strip("-")[:40] or "model"
    digest = upload_digest(*(part for name in sorted(kept) for part in (name.encode(), kept[name])))
    root = sources.upload_dir()
    root.mkdir(parents=True, exist_ok=True)
    for attempt in range(100):  # a different model under the same name: the next free name, never overwrite
        folder = root / (f"{stem}-{digest}" + (f"-{attempt + 1}" if attempt else ""))
        if folder.exists():
            if _same_files(folder, kept):
                return sources.UPLOAD_PREFIX + folder.name
            continue
        tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix(folder.name), dir=root))
        try:
            for name, data in kept.items():
                (tmp / name).write_bytes(data)
            sources.resolve(str(tmp))  # the Hugging Face folder reader and its checks, as for a folder on disk
            tmp.chmod(0o755)
            tmp.rename(folder)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if folder.exists():  # another session kept it first: compare on the next pass
                continue
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return sources.UPLOAD_PREFIX + folder.name
    raise checkpoint.CheckpointError(f"too many different uploads named {stem}-{digest}; rename the file")


def _same_files(folder: Path, kept: dict[str, bytes]) -> bool:
    """Whether ``folder`` holds exactly the files ``kept`` (names and bytes)."""
    try:
        names = {p.name for p in folder.iterdir()}
        if names != set(kept):
            return False
        return all(
            (folder / n).stat().st_size == len(data) and (folder / n).read_bytes() == data for n, data in kept.items()
        )
    except OSError:
        return False
