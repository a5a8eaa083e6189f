"""A Hugging Face folder's tokenizer: ``tokenizer.json`` read by the ``tokenizers`` library (no
pickle, no hub), so a user types text and sees token strings as labels. Without one, a GPT-2
``vocab.json`` names the tokens; without either, token ids do.

A tokenizer.json is untrusted code of a kind: its pre-tokenizer is a regular expression that can
backtrack for ever, and the Rust library panics (``pyo3_runtime.PanicException``, a
``BaseException``) on a regex error. So typed text is tokenized in a forked child process that
is killed after :data:`TOKENIZE_TIMEOUT_S` (:func:`encode`), and every panic is one
:class:`CheckpointError` sentence.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from attn_core.checkpoint import CheckpointError, read_model_file
from attn_core.limits import LimitError

if TYPE_CHECKING:  # the Rust library loads only when a folder has a tokenizer.json
    from tokenizers import Tokenizer

TOKENIZER = "tokenizer.json"
VOCAB = "vocab.json"
MAX_TOKENIZER_BYTES = 64 * 2**20  # Llama 3's is 9 MB, Qwen2's 7 MB
MAX_TEXT_CHARS = 200_000
TOKENIZE_TIMEOUT_S = 5.0  # a text of MAX_TEXT_CHARS takes well under a second with a sane tokenizer
# After fork, tokenizers warns on stderr unless the setting is made; encode uses no parallelism.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


def _rust_failure(e: BaseException, what: str) -> CheckpointError:
    """The one sentence of an error or a panic of the Rust library (a BaseException)."""
    if isinstance(e, (KeyboardInterrupt, SystemExit)):
        raise e
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
    return CheckpointError(f"{TOKENIZER}: {what} failed ({first})")


def load_tokenizer(folder: Path) -> Tokenizer | None:
    """The folder's own tokenizer.json (a regular file inside it, of bounded size, read by
    ``checkpoint.read_model_file``; parsed once in a bounded child first, :func:`bounded`, so a
    panic or a parser that never ends stays there), or None when there is none."""
    if not os.path.lexists(folder / TOKENIZER):
        return None
    from tokenizers import Tokenizer

    data = read_model_file(folder, TOKENIZER, MAX_TOKENIZER_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _rust_failure(e, "reading it") from None
    # read first in a child: a panic prints its backtrace on stderr even when it is caught
    bounded(lambda: Tokenizer.from_str(text).get_vocab_size(with_added_tokens=True), TOKENIZE_TIMEOUT_S, "reading it")
    try:
        return Tokenizer.from_str(text)
    except BaseException as e:  # the Rust parser raises its own types and may panic
        raise _rust_failure(e, "reading it") from None


def token_strings(tok: Tokenizer, d_vocab: int) -> list[str]:
    """A readable, unique label per token id < d_vocab: the token decoded alone (a byte-level
    piece shows as its text), newlines and tabs escaped, a token of spaces only as ␣ (one per
    space), a repeated label suffixed with its id, and ids the tokenizer does not know as "#id"."""
    try:
        decoded = tok.decode_batch([[i] for i in range(d_vocab)], skip_special_tokens=False)
    except BaseException as e:  # a panic of the Rust library
        raise _rust_failure(e, "decoding its tokens") from None
    out, seen = [], set()
    for i, text in enumerate(decoded):
        label = text or tok.id_to_token(i) or f"#{i}"
        label = label.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
        if not label.strip():  # a token of spaces only: visible ("7:␣", not "7:")
            label = label.replace(" ", "␣") if label.strip(" ") == "" else repr(label)[1:-1]
        if label in seen:
            label = f"{label}·{i}"
        seen.add(label)
        out.append(label)
    return out


def unknown_token(tok: Tokenizer) -> tuple[str, int] | None:
    """(the token, its id) a tokenizer puts for a piece it does not know (WordLevel, WordPiece, a
    BPE without byte fallback), None when it has none (byte-level BPE knows every piece)."""
    name = getattr(tok.model, "unk_token", None)
    found = tok.token_to_id(name) if isinstance(name, str) and name else None
    return (name, found) if found is not None else None


def encode(tok: Tokenizer, text: str, timeout_s: float = TOKENIZE_TIMEOUT_S) -> list[int]:
    """Token ids of ``text`` (no special tokens added), in at most ``timeout_s`` seconds: a
    LimitError beyond (a pre-tokenizer pattern that backtracks), a CheckpointError sentence for
    a panic of the tokenizer."""
    if not isinstance(text, str) or not text:
        raise ValueError("type some text to tokenize")
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"the text has {len(text):,} characters; the limit is {MAX_TEXT_CHARS:,}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: undecodable bytes of a command line, a JSON escape
        raise ValueError(
            f"the text is not UTF-8 (character {e.start + 1:,} is a lone surrogate, {text[e.start]!r}); type it as UTF-8"
        ) from None
    ids = bounded(lambda: tok.encode(text, add_special_tokens=False).ids, timeout_s, "tokenizing the text")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise CheckpointError(f"{TOKENIZER}: tokenizing the text gave no list of token ids")
    return ids


def bounded(fn: Callable[[], object], timeout_s: float, what: str):
    """``fn()`` (its result JSON) run in a forked child that is killed after ``timeout_s``: a
    computation in a library that cannot be interrupted (the Rust tokenizer) is bounded in time,
    and its panic, with the backtrace it prints, stays in the child. Where there is no fork, it
    runs here (its panics still one sentence)."""
    if not hasattr(os, "fork"):
        try:
            return fn()
        except BaseException as e:
            raise _rust_failure(e, what) from None
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only this thread exists here; it never returns into the caller
        code = 1
        try:
            os.close(read_end)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)  # a panic's backtrace
            try:
                out = {"ok": fn()}
            except BaseException as e:  # noqa: BLE001 -- reported to the parent, whatever it is
                out = {"error": (str(e).strip().splitlines() or [type(e).__name__])[0][:160]}
            data = json.dumps(out).encode()
            while data:
                data = data[os.write(write_end, data) :]
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                raise LimitError(
                    f"{what} took longer than {timeout_s:g} s, the limit (the {TOKENIZER} pre-tokenizer "
                    "pattern may backtrack without end on this text); nothing was computed"
                )
            ready, _, _ = select.select([read_end], [], [], left)
            if ready:
                chunk = os.read(read_end, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:  # answered, timed out, or Ctrl-C while waiting: the child is gone either way
        os.close(read_end)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
    try:
        out = json.loads(b"".join(chunks))
    except ValueError:
        raise CheckpointError(f"{TOKENIZER}: {what} failed (the tokenizer ended without an answer)") from None
    if "error" in out:
        raise CheckpointError(f"{TOKENIZER}: {what} failed ({out['error']})")
    return out["ok"]
