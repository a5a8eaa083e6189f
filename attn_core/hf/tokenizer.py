"""A Hugging Face folder's tokenizer: ``tokenizer.json`` read by the ``tokenizers`` library (no
pickle, no hub), so a user types text and sees token strings as labels. Without one, a GPT-2
``vocab.json`` names the tokens; without either, token ids do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from attn_core.checkpoint import CheckpointError, read_model_file

if TYPE_CHECKING:  # the Rust library loads only when a folder has a tokenizer.json
    from tokenizers import Tokenizer

TOKENIZER = "tokenizer.json"
VOCAB = "vocab.json"
MAX_TOKENIZER_BYTES = 64 * 2**20  # Llama 3's is 9 MB, Qwen2's 7 MB
MAX_TEXT_CHARS = 200_000


def load_tokenizer(folder: Path) -> Tokenizer | None:
    """The folder's own tokenizer.json (a regular file inside it, of bounded size, read by
    ``checkpoint.read_model_file``), or None when there is none."""
    if not os.path.lexists(folder / TOKENIZER):
        return None
    from tokenizers import Tokenizer

    data = read_model_file(folder, TOKENIZER, MAX_TOKENIZER_BYTES)
    try:
        return Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # the Rust parser raises its own exception type; bad UTF-8 too
        raise CheckpointError(f"{TOKENIZER} could not be read ({str(e).splitlines()[0][:160]})") from None


def token_strings(tok: Tokenizer, d_vocab: int) -> list[str]:
    """A readable, unique label per token id < d_vocab: the token decoded alone (a byte-level
    piece shows as its text), newlines and tabs escaped, a repeated label suffixed with its id,
    and ids the tokenizer does not know as "#id"."""
    decoded = tok.decode_batch([[i] for i in range(d_vocab)], skip_special_tokens=False)
    out, seen = [], set()
    for i, text in enumerate(decoded):
        label = text or tok.id_to_token(i) or f"#{i}"
        label = label.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
        if label in seen:
            label = f"{label}·{i}"
        seen.add(label)
        out.append(label)
    return out


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens added)."""
    if not isinstance(text, str) or not text:
        raise ValueError("type some text to tokenize")
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"the text has {len(text):,} characters; the limit is {MAX_TEXT_CHARS:,}")
    return tok.encode(text, add_special_tokens=False).ids
