"""Reading untrusted files: a model folder's files (``model_file``: nothing outside the folder,
a link leading out included), regular files of bounded size (``read_bytes``), JSON of bounded
size and depth (``parse_json``, ``read_json``) and a vocabulary file a card names
(``read_vocab``). Every failure is one :class:`CheckpointError` sentence. ``attn_core.checkpoint``
re-exports all of it.
"""

from __future__ import annotations

import json
from pathlib import Path

from attn_core import limits
from attn_core.validate import is_int

MAX_JSON_BYTES = 1_000_000
MAX_JSON_DEPTH = 64  # nesting levels of a config or card (ours use 4)
MAX_VOCAB_BYTES = 64 * 2**20  # a vocabulary file (GPT-2's vocab.json is 1 MiB)


class CheckpointError(ValueError):
    """A model that cannot be loaded; the message says what is wrong, in one sentence."""


def read_bytes(path: Path, limit: int) -> bytes:
    """A file's content when it is a regular file of at most ``limit`` bytes (a FIFO, a device
    or a folder is refused without being read: ``attn_core.limits.read_file``)."""
    try:
        return limits.read_file(path, limit, str(path))
    except OSError as e:
        raise CheckpointError(str(e)) from None
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def read_model_file(folder: str | Path, name: str, limit: int) -> bytes:
    """The file ``name`` inside the model folder ``folder``, for a name that a card or a config
    gives (a vocabulary, a tokenizer): resolved relative to the folder (symlinks followed), it
    must stay inside the folder, be a regular file and hold at most ``limit`` bytes. Anything
    else, an absolute path or ``..`` leading out included, is a :class:`CheckpointError` and
    nothing outside the folder is opened."""
    return read_bytes(model_file(folder, name), limit)


def model_file(folder: str | Path, name: str) -> Path:
    """Where ``name`` leads inside the model folder: refused, before anything is opened, when it
    leads outside (see :func:`read_model_file`). The one rule for every file of a model folder:
    its own config.json, card.json and weights, and the names a card, a config or an index gives."""
    if not isinstance(name, str) or not name.strip() or "\x00" in name:
        raise CheckpointError(f"{name!r} is not a file name inside the model folder")
    root = limits.real_path(folder)
    target = limits.real_path(root / name)  # an absolute name replaces root here, and is then refused
    if not target.is_relative_to(root) or target == root:
        raise CheckpointError(
            f"{name!r} leads outside the model folder {root.name} (an absolute path, '..' or a link); "
            "only files inside the model folder are read"
        )
    return target


def parse_json(text: str | bytes, what: str, limit: int = MAX_JSON_BYTES):
    """Parse untrusted JSON text: at most ``limit`` bytes and :data:`MAX_JSON_DEPTH` levels of
    nesting (deeper JSON would exhaust the recursion of every reader after this one). Every JSON
    a user gives (configs, cards, uploads, vocabularies) is read through here."""
    if len(text) > limit:
        raise CheckpointError(f"{what} is {limits.size_text(len(text))}; the limit is {limits.size_text(limit)}")
    try:
        obj = json.loads(text)
    except RecursionError:
        obj = None
    except (ValueError, TypeError) as e:  # UnicodeDecodeError, oversized integers included
        raise CheckpointError(f"{what} is not valid JSON ({first_line(e)})") from None
    else:
        if _depth(obj) <= MAX_JSON_DEPTH:
            return obj
    raise CheckpointError(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep")


def _depth(obj) -> int:
    """Nesting depth of parsed JSON (0 for a scalar), without recursion."""
    deepest, stack = 0, [(obj, 0)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, (dict, list)):
            d += 1
            deepest = max(deepest, d)
            if d > MAX_JSON_DEPTH:
                break
            stack.extend((v, d) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def read_json(path: Path, what: str | None = None) -> dict:
    """A JSON object from a file: a regular file, size- and depth-limited (:func:`parse_json`)."""
    return _object(parse_json(read_bytes(Path(path), MAX_JSON_BYTES), what or Path(path).name), what or Path(path).name)


def read_json_bytes(data: bytes, what: str = "card.json") -> dict:
    """A JSON object given as bytes (an uploaded card.json)."""
    return _object(parse_json(data, what), what)


def read_vocab(folder: Path | None, name: str | None, d_vocab: int) -> list[str] | None:
    """Token names from the vocabulary file ``name`` that a card names (``vocab_file``), read
    with :func:`read_model_file` (inside the model folder only) and checked: a JSON object of
    token -> id (ids outside the vocabulary are ignored) or a list of token strings, at most
    ``limits.MAX_TOKENS_FILE`` entries. None when the card names none or the model has no folder
    (a lone weights file, an in-memory model)."""
    if name is None or folder is None or not Path(folder).is_dir():
        return None
    what = f"the vocabulary file {name!r}"
    raw = parse_json(read_model_file(folder, name, MAX_VOCAB_BYTES), what, MAX_VOCAB_BYTES)
    if not isinstance(raw, (dict, list)) or len(raw) > limits.MAX_TOKENS_FILE:
        raise CheckpointError(
            f"{what} must be a JSON object of token -> id or a list of tokens (at most {limits.MAX_TOKENS_FILE:,})"
        )
    names = [str(i) for i in range(d_vocab)]
    pairs = raw.items() if isinstance(raw, dict) else ((word, i) for i, word in enumerate(raw))
    for word, i in pairs:
        if not isinstance(word, str) or not is_int(i):
            raise CheckpointError(f"{what}: entry {word!r}: {i!r} is not a token string with an integer id")
        if 0 <= i < d_vocab:
            names[i] = word
    return names


def _object(obj, what: str) -> dict:
    if not isinstance(obj, dict):
        raise CheckpointError(f"{what} must hold a JSON object, not {_json_type(obj)}")
    return obj


def _json_type(obj) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(obj), "a number")


def first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
