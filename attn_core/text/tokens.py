"""A corpus tokenized once into a memory-mapped token file, cached next to the run store.

:func:`tokenize` streams a :class:`~attn_core.text.corpus.Corpus` through a model folder's own
``tokenizer.json`` (the ``tokenizers`` library; truncation and padding switched off) and
appends the ids, with the end-of-text token between documents when the model has one, to a
flat little-endian file (uint16 when the vocabulary fits, else uint32). The entry is keyed by
SHA-256 of the tokenizer file, the separator and the corpus (every file's name, size and bytes):
the same text and tokenizer are never tokenized twice, and any change makes a new entry.

An entry is a folder ``<cache>/<key>/`` holding ``tokens.bin`` and ``meta.json``, written into
a temporary sibling and renamed into place (a failure or Ctrl-C leaves nothing; a killed
process's left-over is removed by the next writer). Memory stays bounded whatever the corpus
size: at most :data:`BATCH_CHARS` characters of text and their ids are held at once, and readers
map the file (:meth:`TokenFile.array`) instead of loading it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attn_core.destinations import remove_stale_tmp, tmp_prefix
from attn_core.runs import default_root
from attn_core.text.corpus import Corpus, TextError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

FORMAT = 1  # of the cache entries; a new format makes new keys
CACHE = "text-cache"  # the cache's folder in the run store's data directory
TOKENS, META = "tokens.bin", "meta.json"
BATCH_CHARS = 2**19  # characters tokenized in one encode_batch call (8 pieces: both cores busy)

# progress(phase, done, total): phase "hashing" or "tokenizing", bytes of the corpus
Progress = Callable[[str, int, int], None]


def cache_dir(root: str | Path | None = None) -> Path:
    """Where token files are kept: ``<run store root>/text-cache``."""
    return Path(root if root is not None else default_root()) / CACHE


@dataclass(frozen=True)
class TokenFile:
    """A tokenized corpus in the cache: its folder and what ``meta.json`` says (tokens,
    dtype, documents, files, bytes, key, seconds to tokenize, ...). ``cached`` is True when it
    was found rather than made by this call."""

    folder: Path
    meta: dict
    cached: bool = False

    @property
    def n_tokens(self) -> int:
        return int(self.meta["tokens"])

    def array(self) -> np.ndarray:
        """The tokens as a read-only memory map (nothing is read until indexed)."""
        return np.memmap(self.folder / TOKENS, dtype=np.dtype(self.meta["dtype"]), mode="r", shape=(self.n_tokens,))


def tokenizer_key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prepare(tok: Tokenizer) -> Tokenizer:
    """The tokenizer with truncation and padding off (a tokenizer.json may set them: a corpus
    piece must never be cut to a model's context or padded)."""
    tok.no_truncation()
    tok.no_padding()
    return tok


def dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def _find(directory: Path, key: str) -> TokenFile | None:
    folder = directory / key
    try:
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
        if (folder / TOKENS).stat().st_size == int(meta["tokens"]) * np.dtype(meta["dtype"]).itemsize:
            return TokenFile(folder, meta, cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def tokenize(
    corpus: Corpus,
    tok: Tokenizer,
    tokenizer_sha: str,
    eos: int | None = None,
    directory: str | Path | None = None,
    progress: Progress | None = None,
) -> TokenFile:
    """The corpus's tokens, from the cache or tokenized now (see the module). ``tokenizer_sha``
    is :func:`tokenizer_key` of the tokenizer.json bytes ``tok`` was read from; ``eos`` the id
    put after every document (None: none). Raises :class:`TextError` on bad text (nothing is
    left behind) and when the corpus holds no token."""
    directory = cache_dir() if directory is None else Path(directory)
    hashing = None if progress is None else (lambda done, total: progress("hashing", done, total))
    fingerprint = corpus.fingerprint(hashing)
    key = hashlib.sha256(f"{FORMAT}\n{tokenizer_sha}\n{eos}\n{fingerprint}".encode()).hexdigest()[:40]
    found = _find(directory, key)
    if found is not None:
        return found
    try:
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale_tmp(directory, key)
        tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix(key), dir=directory))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like the run store
    except OSError as e:
        raise OSError(f"the token cache {directory} cannot be written ({e.strerror or e})") from None
    try:
        meta = _write(corpus, prepare(tok), eos, tmp / TOKENS, progress)
        if meta["tokens"] == 0:
            raise TextError(f"{corpus.path} holds no text to tokenize (only whitespace)")
        meta.update(
            key=key,
            format=FORMAT,
            tokenizer_sha256=tokenizer_sha,
            eos=eos,
            corpus_sha256=fingerprint,
            path=str(corpus.path),
            files=corpus.names(),
            field=corpus.field,
            bytes=corpus.bytes,
            created=time.strftime("%Y-%m-%d %H:%M:%S"),
        )
        (tmp / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        try:
            tmp.rename(directory / key)
        except OSError:  # another process made the same entry meanwhile: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
            found = _find(directory, key)
            if found is None:
                raise
            return found
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return TokenFile(directory / key, meta)


def _write(corpus: Corpus, tok: Tokenizer, eos: int | None, out: Path, progress: Progress | None) -> dict:
    """Tokenize the corpus into ``out``; returns the counts (tokens, documents, dtype, max id,
    seconds, characters)."""
    dtype = dtype_for(tok.get_vocab_size(with_added_tokens=True))
    reading = None if progress is None else (lambda done, total: progress("tokenizing", done, total))
    started = time.perf_counter()
    counts = {"tokens": 0, "documents": 0, "characters": 0, "max_id": -1}
    batch: list[tuple[str, bool]] = []
    size = 0

    def flush(fh) -> None:
        encodings = tok.encode_batch_fast([text for text, _ in batch], add_special_tokens=False)
        for enc, (_, ends) in zip(encodings, batch):
            ids = enc.ids + ([eos] if ends and eos is not None else [])
            if ids:
                arr = np.asarray(ids, dtype=np.int64)
                counts["max_id"] = max(counts["max_id"], int(arr.max()))
                if counts["max_id"] > np.iinfo(dtype).max:
                    raise TextError(f"the tokenizer produced id {counts['max_id']}, beyond its own vocabulary")
                fh.write(arr.astype(dtype).tobytes())
                counts["tokens"] += len(arr)
            counts["documents"] += bool(ends)
        batch.clear()

    with open(out, "wb") as fh:
        for text, ends in corpus.pieces(reading):
            batch.append((text, ends))
            size += len(text)
            counts["characters"] += len(text)
            if size >= BATCH_CHARS:
                flush(fh)
                size = 0
        if batch:
            flush(fh)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - started
    return {**counts, "dtype": dtype.str, "seconds": round(seconds, 3)}
