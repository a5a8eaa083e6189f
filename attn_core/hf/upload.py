"""A Hugging Face folder sent as files (the dashboard's "Upload a model"): which of its files are
kept, as they are, to make a folder that the one Hugging Face folder reader
(``sources.resolve`` -> :func:`attn_core.hf.load_hf`) then reads with its own checks. Kept: the
config.json (one that names a ``model_type``), the weights (``model.safetensors``, or the index
and its ``*.safetensors`` shards) and the tokenizer and generation files a run of an imported
model keeps (``family_export.TOKENIZER_FILES``). Everything else a folder may hold (a README, a
pickled ``training_args.bin``) is left out and named; a pickle is never read."""

from __future__ import annotations

from collections.abc import Mapping

from attn_core.checkpoint import CONFIG, MAX_WEIGHTS_BYTES, WEIGHTS, CheckpointError
from attn_core.hf.family_export import TOKENIZER_FILES
from attn_core.hf.folder import INDEX
from attn_core.hf.tokenizer import MAX_TOKENIZER_BYTES
from attn_core.untrusted import parse_json

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def upload_config(files: Mapping[str, bytes]) -> dict | None:
    """The uploaded config.json when it is a Hugging Face one (it names a ``model_type``), else
    None (then the files are one of our own model folders)."""
    data = files.get(CONFIG)
    if data is None:
        return None
    try:
        raw = parse_json(data, CONFIG)
    except CheckpointError:
        return None  # our reader says what is wrong with it
    return raw if isinstance(raw, dict) and isinstance(raw.get("model_type"), str) else None


def split_upload(files: Mapping[str, bytes]) -> tuple[dict[str, bytes], list[str]]:
    """(the files kept, by name; the names left out) of an uploaded Hugging Face folder, or a
    one-line :class:`CheckpointError` when it has no weights, or a kept file is too large."""
    kept, left = {}, []
    for name in sorted(files):
        if name == CONFIG or name == WEIGHTS or name == INDEX or name in TOKENIZER_FILES:
            kept[name] = files[name]
        elif name.endswith(".safetensors") and INDEX in files:  # a shard (the index decides which are read)
            kept[name] = files[name]
        else:
            left.append(name)
    if WEIGHTS not in kept and INDEX not in kept:
        pickles = [n for n in left if n.lower().endswith(PICKLE_SUFFIXES)]
        raise CheckpointError(
            f"the Hugging Face folder has no {WEIGHTS} (or {INDEX} with its shards)"
            + (
                f"; {pickles[0]} is a pickle, which is never read: save it with save_pretrained(safe_serialization=True)"
                if pickles
                else ""
            )
        )
    for name, data in kept.items():
        limit = MAX_WEIGHTS_BYTES if name.endswith(".safetensors") else MAX_TOKENIZER_BYTES
        if len(data) > limit:
            raise CheckpointError(f"{name} is larger than {limit // 2**20} MiB")
    return kept, left


def left_out_text(left: list[str]) -> str:
    """The sentence naming the files an upload left out (empty when none)."""
    if not left:
        return ""
    shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    pickled = any(n.lower().endswith(PICKLE_SUFFIXES) for n in left)
    return f"Not kept: {shown} ({'pickles are never read; ' if pickled else ''}only the config, weights and tokenizer are)."
