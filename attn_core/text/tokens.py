"""A corpus tokenized once into a memory-mapped token file, cached next to the run store.

:func:`tokenize` has a :class:`~attn_core.text.corpus.Corpus` tokenized by a model folder's own
``tokenizer.json`` in a bounded child process (:mod:`attn_core.text.child`: a panic, a crash,
memory or time beyond its bounds are one sentence) into a flat little-endian token file (uint16
when the vocabulary fits, else uint32), the end-of-text token between documents when the model
has one. The entry is keyed by SHA-256 of the tokenizer.json, the separator and the corpus (every
file's name, size and bytes): the same text and tokenizer are never tokenized twice, and any
change makes a new entry. The child hashes what it reads and checks each file again after, so
an entry describes exactly the bytes its key names (a file changed meanwhile keeps nothing).

An entry is a folder ``<cache>/<key>/`` holding ``tokens.bin`` and ``meta.json``, written into a
temporary sibling and renamed into place. The cache is untrusted input like any file:
:func:`read_entry` is its one reader (regular files only, never through a link; meta.json of
bounded size, every field of its type; the dtype and the count follow from the tokenizer and the
file's size; the tokens' SHA-256 and largest id checked once per process and file version). A
damaged entry is removed and made again; the temporary folders of a killed tokenization are
removed by the next one (their process gone, or older than :data:`STALE_S`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attn_core import limits
from attn_core.destinations import remove_stale_tmp, tmp_prefix
from attn_core.runs import default_root
from attn_core.text import child
from attn_core.text.child import dtype_for  # noqa: F401 -- the token file's dtype, one rule
from attn_core.text.corpus import Corpus, TextError
from attn_core.untrusted import parse_json

if TYPE_CHECKING:
    from tokenizers import Tokenizer

FORMAT = 2  # of the cache entries; a new format makes new keys (2: the tokens' checksum)
CACHE = "text-cache"  # the cache's folder in the run store's data directory
TOKENS, META = "tokens.bin", "meta.json"
MAX_META_BYTES = 2**20
STALE_S = 2 * 86400  # a temporary folder of another host (or of no known process) this old is removed
DTYPES = ("<u2", "<u4")
_HEX = re.compile(r"^[0-9a-f]{64}$")
_VERIFIED: dict[str, tuple] = {}  # entry folder -> the stamps of its files when their checksum was checked

# progress(phase, done, total): phase "hashing" or "tokenizing", bytes of the corpus
Progress = Callable[[str, int, int], None]


class DamagedEntry(TextError):
    """A cache entry that is not what its key says (see :func:`read_entry`)."""


def cache_dir(root: str | Path | None = None) -> Path:
    """Where token files are kept: ``<run store root>/text-cache``."""
    return Path(root if root is not None else default_root()) / CACHE


@dataclass(frozen=True)
class TokenFile:
    """A tokenized corpus in the cache: its folder and what ``meta.json`` says (tokens,
    dtype, documents, files, bytes, key, seconds to tokenize, ...), checked by
    :func:`read_entry`. ``cached`` is True when it was found rather than made by this call."""

    folder: Path
    meta: dict
    cached: bool = False

    @property
    def n_tokens(self) -> int:
        return int(self.meta["tokens"])

    def array(self) -> np.ndarray:
        """The tokens as a read-only memory map (nothing is read until indexed)."""
        if self.n_tokens == 0:
            return np.zeros(0, dtype=np.dtype(self.meta["dtype"]))
        return np.memmap(self.folder / TOKENS, dtype=np.dtype(self.meta["dtype"]), mode="r", shape=(self.n_tokens,))


def tokenizer_key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prepare(tok: Tokenizer) -> Tokenizer:
    """The tokenizer with truncation and padding off (a tokenizer.json may set them: a corpus
    piece must never be cut to a model's context or padded)."""
    tok.no_truncation()
    tok.no_padding()
    return tok


def entry_key(tokenizer_sha: str, eos: int | None, fingerprint: str) -> str:
    return hashlib.sha256(f"{FORMAT}\n{tokenizer_sha}\n{eos}\n{fingerprint}".encode()).hexdigest()[:40]


def _regular(path: Path, what: str) -> os.stat_result:
    """The stat of ``path`` when it is a regular file itself (not a link, a FIFO, a device)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise DamagedEntry(f"its {what} cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise DamagedEntry(f"its {what} is not a regular file")
    return st


def _integer(meta: dict, name: str, lo: int = 0) -> int:
    value = meta.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise DamagedEntry(f"meta.json's {name!r} is {value!r}, not an integer of at least {lo}")
    return value


def read_entry(folder: Path, want: dict) -> TokenFile:
    """The cache entry ``folder``, checked as untrusted input against what its key was made of
    (``want``: key, tokenizer_sha256, eos, corpus_sha256, dtype): a real folder (not a link)
    holding regular files; meta.json a JSON object of at most :data:`MAX_META_BYTES` whose
    fields say what ``want`` says and have their types; tokens.bin exactly ``tokens`` values of
    ``dtype``, whose SHA-256 and largest id are meta.json's (read once per process while the
    files do not change). Raises :class:`DamagedEntry` saying what is wrong."""
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise DamagedEntry("it is not a folder")
    meta_st = _regular(folder / META, META)
    if meta_st.st_size > MAX_META_BYTES:
        raise DamagedEntry(f"its {META} is {limits.size_text(meta_st.st_size)}")
    try:
        meta = parse_json(limits.read_file(folder / META, MAX_META_BYTES, META), META, MAX_META_BYTES)
    except (OSError, ValueError) as e:  # CheckpointError and LimitError are ValueErrors
        raise DamagedEntry(str(e)) from None
    if not isinstance(meta, dict):
        raise DamagedEntry(f"its {META} is not a JSON object")
    for name, value in want.items():
        if meta.get(name) != value or type(meta.get(name)) is not type(value):
            raise DamagedEntry(f"{META}'s {name!r} is {meta.get(name)!r}, not {value!r}")
    n, max_id = _integer(meta, "tokens"), _integer(meta, "max_id", -1)
    for name in ("documents", "characters"):
        _integer(meta, name)
    if not isinstance(meta.get("tokens_sha256"), str) or not _HEX.match(meta["tokens_sha256"]):
        raise DamagedEntry(f"{META} has no checksum of {TOKENS}")
    dtype = np.dtype(want["dtype"])
    tokens_st = _regular(folder / TOKENS, TOKENS)
    if tokens_st.st_size != n * dtype.itemsize:
        raise DamagedEntry(f"{TOKENS} holds {tokens_st.st_size:,} bytes, not {n:,} tokens of {dtype.itemsize} bytes")
    stamps = (_stamp(meta_st), _stamp(tokens_st))
    if _VERIFIED.get(str(folder)) != stamps:
        digest, top = _checksum(folder / TOKENS, dtype, n)
        if digest != meta["tokens_sha256"] or top != max_id:
            raise DamagedEntry(f"{TOKENS} is not the file that was written (its checksum or largest id differs)")
        if len(_VERIFIED) >= 256:
            _VERIFIED.clear()
        _VERIFIED[str(folder)] = stamps
    return TokenFile(folder, meta, cached=True)


def _stamp(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _checksum(path: Path, dtype: np.dtype, n: int) -> tuple[str, int]:
    """(SHA-256, largest id) of the token file, read in blocks from one descriptor."""
    h, top, block = hashlib.sha256(), -1, 2**22 * dtype.itemsize
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise DamagedEntry(f"{TOKENS} is not a regular file")
        read = 0
        while data := fh.read(block):
            h.update(data)
            read += len(data)
            ids = np.frombuffer(data[: len(data) - len(data) % dtype.itemsize], dtype=dtype)
            if len(ids):
                top = max(top, int(ids.max()))
    if read != n * dtype.itemsize:
        raise DamagedEntry(f"{TOKENS} changed while it was checked")
    return h.hexdigest(), top


def _remove(entry: Path, why: str) -> None:
    """Move a damaged entry aside and delete it; if that fails, say which folder to delete."""
    aside = entry.with_name(f"{tmp_prefix(entry.name)}damaged-old")
    try:
        if entry.is_symlink() or not entry.is_dir():
            entry.unlink()
        else:
            entry.rename(aside)
            shutil.rmtree(aside)
    except OSError as e:
        raise OSError(
            f"the token cache entry {entry} is damaged ({why}) and cannot be removed ({e.strerror or e}); "
            "delete that folder and run again"
        ) from None


def find(directory: Path, want: dict) -> TokenFile | None:
    """The valid entry ``want["key"]`` of the cache, or None; a damaged one is removed."""
    entry = directory / want["key"]
    if not os.path.lexists(entry):
        return None
    try:
        return read_entry(entry, want)
    except DamagedEntry as e:
        _remove(entry, str(e))
    except OSError as e:
        _remove(entry, e.strerror or str(e))
    return None


def tokenize(
    corpus: Corpus,
    tok: Tokenizer,
    tokenizer_sha: str,
    eos: int | None = None,
    directory: str | Path | None = None,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
) -> TokenFile:
    """The corpus's tokens, from the cache or tokenized now (see the module). ``tokenizer_sha``
    is :func:`tokenizer_key` of the tokenizer ``tok``; ``eos`` the id put after every document
    (None: none). Raises :class:`TextError` on bad text, a tokenizer that fails on it
    (``child.TokenizerError``) and a corpus that changed while it was read; nothing is left
    behind then, nor on Ctrl-C (or ``stop()``)."""
    directory = cache_dir() if directory is None else Path(directory)
    hashing = None if progress is None else (lambda done, total: progress("hashing", done, total))
    fingerprint = corpus.fingerprint(hashing)
    key = entry_key(tokenizer_sha, eos, fingerprint)
    dtype = dtype_for(tok.get_vocab_size(with_added_tokens=True))
    want = dict(key=key, format=FORMAT, tokenizer_sha256=tokenizer_sha, eos=eos, corpus_sha256=fingerprint, dtype=dtype)
    found = find(directory, want)
    if found is not None:
        return found
    try:
        directory.mkdir(parents=True, exist_ok=True)
        remove_stale_tmp(directory, max_age_s=STALE_S)  # every key's: a killed tokenization's left-overs
        tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix(key), dir=directory))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like the run store
    except OSError as e:
        raise OSError(f"the token cache {directory} cannot be written ({e.strerror or e})") from None
    try:
        meta = child.tokenize_in_child(corpus, tok.to_str(), eos, tmp / TOKENS, fingerprint, progress, stop)
        if meta["dtype"] != dtype:
            raise TextError(f"the tokenizer's vocabulary changed while it was read ({meta['dtype']} ids)")
        meta.update(
            want,
            path=str(corpus.path),
            files=corpus.names(),
            field=corpus.field,
            bytes=corpus.bytes,
            created=time.strftime("%Y-%m-%d %H:%M:%S"),
        )
        (tmp / META).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        return _install(tmp, directory / key, want, meta)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _install(tmp: Path, entry: Path, want: dict, meta: dict) -> TokenFile:
    """Rename the new entry into place; one made meanwhile by another process is used when it
    is valid, replaced when it is damaged."""
    for _ in range(2):
        try:
            tmp.rename(entry)
            _VERIFIED[str(entry)] = (_stamp(os.lstat(entry / META)), _stamp(os.lstat(entry / TOKENS)))
            return TokenFile(entry, meta)
        except OSError:
            found = find(entry.parent, want)  # another process made it meanwhile: theirs, if valid
            if found is not None:
                return found
    raise OSError(f"the token cache entry {entry} could not be written; delete that folder and run again")
