"""The first N tokens of a text, tokenized by the model folder's own tokenizer.json: the input of
``attn-lab scores --text FILE --length N`` (a long input for the blocked scores).

The text is read as every corpus is (``corpus.open_corpus``: a .txt, .jsonl or .parquet file or a
folder of them, checked before it is read; documents end with a line break), only up to
:data:`hf.tokenizer.MAX_TEXT_CHARS` characters (far more than a context's tokens), and tokenized
in a bounded child (``hf.tokenizer.encode``).
"""

from __future__ import annotations

from pathlib import Path

from attn_core.bilinear.tokens import tokenizer
from attn_core.checkpoint import LoadedModel
from attn_core.hf import tokenizer as hf_tokenizer
from attn_core.text.corpus import open_corpus


def read_prefix(path: str | Path, chars: int, field: str | None = None) -> tuple[str, bool]:
    """(the first ``chars`` characters of the corpus at ``path``, whether it has more)."""
    parts: list[str] = []
    have = 0
    for piece, end in open_corpus(path, field).pieces():
        piece = piece + ("\n" if end and not piece.endswith("\n") else "")
        parts.append(piece)
        have += len(piece)
        if have >= chars:
            return "".join(parts)[:chars], True
    return "".join(parts), False


def text_tokens(loaded: LoadedModel, path: str | Path, length: int | None, field: str | None = None) -> list[int]:
    """The first ``length`` tokens of the text at ``path`` (default: as many as the model's
    context holds), by the model folder's tokenizer.json; a ValueError of one sentence when the
    model has no tokenizer or the text has fewer tokens."""
    n_ctx = loaded.model.cfg.n_ctx
    want = n_ctx if length is None else length
    tok = tokenizer(loaded)
    if tok is None:
        raise ValueError("--text needs the model folder's tokenizer.json; this model has none (give --tokens)")
    text, more = read_prefix(path, hf_tokenizer.MAX_TEXT_CHARS, field)
    if not text.strip():
        raise ValueError(f"--text {path} holds no text")
    ids = hf_tokenizer.encode(tok, text)
    if more:  # the last token may be a word cut at the character limit
        ids = ids[:-1]
    if length is not None and len(ids) < want:
        where = f"its first {len(text):,} characters give" if more else "it has"
        raise ValueError(f"--length {want} is beyond the text: {where} {len(ids)} tokens")
    return ids[:want]
