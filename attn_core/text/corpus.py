"""What a user's text is: a ``.txt`` file or a folder of them, ``.jsonl`` with a text field, or
Parquet with a text column (what ``datasets`` exports), read as a stream of documents.

:func:`open_corpus` checks the path before anything is read (regular files only, sizes within
:data:`MAX_CORPUS_BYTES`, a folder that holds a readable file); :meth:`Corpus.pieces` then yields
its text in pieces of at most :data:`PIECE_CHARS` characters, cut between words, each marked when
it ends a document (a file, a JSON line, a Parquet row), never holding more than a piece (or one
JSON line, at most :data:`MAX_LINE_BYTES`) in memory. Bad text is found while it streams and
is one :class:`TextError` sentence naming the file and where: not UTF-8, binary (a NUL byte), a
JSON line that is no object or lacks the field, a column that does not exist or holds no strings.

Any other file name is read as plain text when given alone; in a folder only ``.txt``, ``.jsonl``
and ``.parquet`` files count (hidden files and folders are skipped). A folder is read as a model
folder is (``attn_core.untrusted.model_file``): a link leading out of it is refused, a link to a
folder inside it is skipped (its files are read where they are), and a subfolder that cannot be
read, a link loop or a dangling link is refused like an unreadable file.

The corpus is hostile input that may change while it is read: :meth:`Corpus.pieces` hashes what it
reads (the algorithm of :meth:`Corpus.fingerprint`) and checks each file's size, inode and
change time (which no user can set back) again after reading it; with ``expect`` given, text
that is not the text fingerprinted ends as a :class:`TextError` (the token cache then keeps
nothing, :mod:`attn_core.text.tokens`).
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from attn_core import limits
from attn_core.limits import MAX_CORPUS_BYTES, TEXT_LIMIT  # noqa: F401 -- the corpus's bound, one in the lab

MAX_WORDS_BYTES = 4 * 2**20  # a text of a task's token names, read whole and split at spaces (dynamics)
MAX_FILES = 100_000  # files in a folder
MAX_LINE_BYTES = 64 * 2**20  # one JSON line
READ_BYTES = 2**20  # bytes read from a plain-text file at a time
PIECE_CHARS = 64 * 2**10  # characters handed to the tokenizer at a time (cut at a line end when one is near)
SUFFIXES = {".txt": "text", ".jsonl": "jsonl", ".parquet": "parquet"}
DEFAULT_FIELD = "text"

Progress = Callable[[int, int], None]  # (bytes read so far, bytes in all)
_FINGERPRINTS: dict[tuple, str] = {}  # (field, (path, size, mtime) of every file) -> fingerprint


class TextError(ValueError):
    """Text that cannot be used: one sentence naming the file and what is wrong."""


@dataclass(frozen=True)
class Corpus:
    """A checked path: its files (sorted), their kinds and sizes, and the JSON/Parquet field."""

    path: Path
    files: tuple[Path, ...]
    kinds: tuple[str, ...]
    sizes: tuple[int, ...]
    field: str = DEFAULT_FIELD

    @property
    def bytes(self) -> int:
        return sum(self.sizes)

    def names(self) -> list[str]:
        """Each file's name relative to the corpus path (its own name for a single file)."""
        if self.path.is_dir():
            return [str(f.relative_to(self.path)) for f in self.files]
        return [self.path.name]

    def fingerprint(self, progress: Progress | None = None) -> str:
        """SHA-256 over every file's name, kind, size and content (and the field name): the
        corpus half of the token cache's key. Reads the files once, in blocks (once per process
        while no file's inode, size, modification or change time changes)."""
        try:
            stamp = (self.field, tuple((str(f), *_stamp(os.stat(f))) for f in self.files))
        except OSError:
            stamp = None
        if stamp is not None and stamp in _FINGERPRINTS:
            return _FINGERPRINTS[stamp]
        h = _hasher(self.field)
        done = 0
        for name, f, kind, size in zip(self.names(), self.files, self.kinds, self.sizes):
            h.update(_header(name, kind, size))
            with _open_regular(f) as fh:
                while block := fh.read(8 * READ_BYTES):
                    h.update(block)
                    done += len(block)
                    if progress is not None:
                        progress(done, self.bytes)
        if stamp is not None:
            if len(_FINGERPRINTS) >= 64:
                _FINGERPRINTS.clear()
            _FINGERPRINTS[stamp] = h.hexdigest()
        return h.hexdigest()

    def pieces(self, progress: Progress | None = None, expect: str | None = None) -> Iterator[tuple[str, bool]]:
        """(text, ends a document) in reading order; raises :class:`TextError` on bad text, and
        on a file that changed while it was read (its size, inode or change time, checked on the
        open file after reading it). With ``expect`` (a :meth:`fingerprint`), what was read must
        hash to it: else a TextError after the last piece (a caller keeps nothing it made)."""
        done = 0
        h = _hasher(self.field)
        for name, f, kind, size in zip(self.names(), self.files, self.kinds, self.sizes):
            reader = {"text": _text_pieces, "jsonl": _jsonl_pieces, "parquet": _parquet_pieces}[kind]
            h.update(_header(name, kind, size))
            start = done
            with _open_regular(f) as fh:
                before = _stamp(os.fstat(fh.fileno()))
                seen = _Seen(h)
                for piece, end, read in reader(fh, f, self.field, seen):
                    if progress is not None and read:
                        done = min(done + read, start + size)
                        progress(done, self.bytes)
                    yield piece, end
                if before != _stamp(os.fstat(fh.fileno())) or seen.bytes != size or before[2] != size:
                    raise _changed(f)
            done = start + size
            if progress is not None:
                progress(done, self.bytes)
        if expect is not None and h.hexdigest() != expect:
            raise _changed(self.path)


class _Seen:
    """What a reader read of a file, hashed into the corpus's fingerprint as it goes."""

    def __init__(self, h) -> None:
        self.h, self.bytes = h, 0

    def __call__(self, data: bytes) -> None:
        self.h.update(data)
        self.bytes += len(data)


def _hasher(field: str):
    return hashlib.sha256(f"field={field}\n".encode())


def _header(name: str, kind: str, size: int) -> bytes:
    return f"{name}\0{kind}\0{size}\n".encode()


def _stamp(st: os.stat_result) -> tuple:
    """What changes whenever a file is written: its inode, size and modification and change
    times (the change time cannot be set back by a user, unlike the modification time)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _changed(path: Path) -> TextError:
    return TextError(
        f"{path} changed while it was read (written, truncated or replaced meanwhile); nothing was kept: "
        "run again once it is no longer being written"
    )


def kind_of(path: Path) -> str:
    return SUFFIXES.get(path.suffix.lower(), "text")


def open_corpus(path: str | Path, field: str | None = None, what: str = "--text") -> Corpus:
    """The corpus at ``path``: a file, or a folder (searched recursively) of ``.txt``, ``.jsonl``
    and ``.parquet`` files. Checked here, before anything is read: every file is a regular file
    (a FIFO or a device is refused without being opened), the folder holds one, and all of them
    together are at most :data:`MAX_CORPUS_BYTES`."""
    if not isinstance(path, (str, Path)) or not str(path).strip() or "\x00" in str(path):
        raise TextError(f"{what} needs a path to a text file or a folder of them")
    if field is not None and (not isinstance(field, str) or not field.strip() or not _is_text(field)):
        raise TextError("--text-field must name a field (a JSON key or a Parquet column)")
    path = Path(path).expanduser()
    if not os.path.exists(path):
        broken = os.path.lexists(path)
        raise TextError(f"{what} {path} " + ("is a dangling link or a link loop" if broken else "does not exist"))
    if path.is_dir():  # else a file, checked below: a FIFO or a device is refused unopened
        files = _folder_files(path, what)
        if not files:
            raise TextError(f"{what} {path} holds no .txt, .jsonl or .parquet file to read")
    else:
        files = [path]
    sizes = []
    for f in files:
        try:
            sizes.append(limits.regular_file_size(f, str(f)))
        except (OSError, ValueError) as e:
            raise TextError(f"{what}: {e}") from None
    total = sum(sizes)
    if total > MAX_CORPUS_BYTES:
        raise limits.LimitError(
            f"{what} {path} is {limits.size_text(total)}; the limit of one corpus is {limits.size_text(MAX_CORPUS_BYTES)}"
        )
    if total == 0:
        raise TextError(f"{what} {path} is empty")
    return Corpus(path, tuple(files), tuple(kind_of(f) for f in files), tuple(sizes), field or DEFAULT_FIELD)


def _folder_files(folder: Path, what: str = "--text") -> list[Path]:
    """The text files under ``folder`` (see the module: links leading out refused, links to
    folders inside skipped, an unreadable subfolder refused), sorted, at most :data:`MAX_FILES`."""
    root = _real(folder, what)
    found: list[Path] = []

    def unreadable(e: OSError) -> None:
        raise TextError(f"{what}: the folder {e.filename} cannot be read ({e.strerror or e}); nothing was read")

    for here, dirs, names in os.walk(folder, onerror=unreadable):
        keep = []
        for d in sorted(dirs):
            if not d.startswith(".") and not (Path(here) / d).is_symlink():
                keep.append(d)
            elif not d.startswith("."):
                _inside(Path(here) / d, root, folder, what)  # a link to a folder inside: read where it is
        dirs[:] = keep
        for name in sorted(names):
            if not name.startswith(".") and Path(name).suffix.lower() in SUFFIXES:
                path = Path(here) / name
                if path.is_symlink():
                    _inside(path, root, folder, what)
                found.append(path)
                if len(found) > MAX_FILES:
                    raise limits.LimitError(f"{folder} holds more than {MAX_FILES:,} text files, the limit")
    return found


def _real(path: Path, what: str) -> Path:
    """``path`` with every link resolved; a loop or a dangling link is a TextError."""
    try:
        return Path(os.path.realpath(path, strict=True))
    except OSError as e:
        why = "a link loop" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise TextError(f"{what}: {path} cannot be read ({why})") from None


def _inside(link: Path, root: Path, folder: Path, what: str) -> None:
    """Refuse a link in the text folder that leads out of it (the model folder's rule)."""
    if not _real(link, what).is_relative_to(root):
        raise TextError(
            f"{what}: {link} is a link leading outside the folder {folder}; only files inside it are read "
            "(copy the file in, or give its own path)"
        )


def _is_text(value: str) -> bool:
    """Whether ``value`` is text that can be written as UTF-8 (no lone surrogate, which JSON's
    \\ud800 escapes and undecodable command-line bytes make)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _open_regular(path: Path):
    """``path`` opened for reading in binary, once it is known to be a regular file (checked
    again on the open descriptor: it may have been swapped since the corpus was checked)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise TextError(f"{path} cannot be read ({e.strerror or e})") from None
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
        fh.close()
        raise TextError(f"{path} is not a regular file; only regular files are read")
    return fh


def _decode_error(path: Path, offset: int, e: UnicodeDecodeError) -> TextError:
    return TextError(f"{path} is not UTF-8 text (byte {offset + e.start:,} cannot be decoded); save it as UTF-8")


def _binary(path: Path, offset: int) -> TextError:
    return TextError(f"{path} looks like a binary file, not text (a NUL byte at byte {offset:,})")


def _cut(text: str) -> int:
    """Where to end a piece of ``text`` (longer than PIECE_CHARS): before the last space of its
    second half (the next piece starts " word", as the word would be tokenized inside the whole
    text), else after its last line end, else at PIECE_CHARS (a line without spaces)."""
    space = text.rfind(" ", PIECE_CHARS // 2, PIECE_CHARS)
    if space > 0:
        return space
    return text.rfind("\n", PIECE_CHARS // 2, PIECE_CHARS) + 1 or PIECE_CHARS


def _split(text: str) -> Iterator[tuple[str, bool]]:
    """A document's text as pieces of at most PIECE_CHARS (cut by :func:`_cut`), the last marked."""
    while len(text) > PIECE_CHARS:
        cut = _cut(text)
        yield text[:cut], False
        text = text[cut:]
    yield text, True


def _text_pieces(fh, path: Path, field: str, seen: _Seen) -> Iterator[tuple[str, bool, int]]:
    """A plain-text file as pieces of at most :data:`PIECE_CHARS` characters cut between words
    (:func:`_cut`); the whole file is one document."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    buffer, offset, pending_bytes = "", 0, 0
    while True:
        raw = fh.read(READ_BYTES)
        seen(raw)
        final = not raw
        nul = raw.find(b"\0")
        if nul >= 0:
            raise _binary(path, offset + nul)
        held = len(decoder.getstate()[0])  # bytes of a character cut by the last read
        try:
            buffer += decoder.decode(raw, final=final)
        except UnicodeDecodeError as e:
            raise _decode_error(path, offset - held, e) from None
        offset += len(raw)
        pending_bytes += len(raw)
        while len(buffer) >= PIECE_CHARS:
            cut = _cut(buffer)
            yield buffer[:cut], False, pending_bytes
            buffer, pending_bytes = buffer[cut:], 0
        if final:
            break
    yield buffer, True, pending_bytes


def _jsonl_pieces(fh, path: Path, field: str, seen: _Seen) -> Iterator[tuple[str, bool, int]]:
    """One document per line: the line's JSON object's ``field`` (a string). Blank lines are
    skipped; a line that is no object, lacks the field or holds no text there (a lone surrogate,
    ``\\ud800``, is no text) is refused."""
    from attn_core.untrusted import CheckpointError, parse_json

    offset = 0
    for number, line in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), start=1):
        seen(line)
        if len(line) > MAX_LINE_BYTES:
            raise limits.LimitError(
                f"{path}: line {number:,} is longer than {limits.size_text(MAX_LINE_BYTES)}, the limit of one line"
            )
        nul = line.find(b"\0")
        if nul >= 0:
            raise _binary(path, offset + nul)
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _decode_error(path, offset, e) from None
        offset += len(line)
        if not text.strip():
            continue
        try:
            obj = parse_json(text, f"{path} line {number:,}", MAX_LINE_BYTES)
        except CheckpointError as e:
            raise TextError(str(e)) from None
        if not isinstance(obj, dict):
            raise TextError(f"{path} line {number:,} is not a JSON object (each line must be one)")
        if field not in obj:
            keys = ", ".join(repr(k) for k in list(obj)[:8]) or "none"
            raise TextError(
                f"{path} line {number:,} has no field {field!r} (its fields: {keys}); name the text with --text-field"
            )
        value = obj[field]
        if value is None:
            continue
        if not isinstance(value, str):
            raise TextError(f"{path} line {number:,}: field {field!r} holds {type(value).__name__}, not text")
        if not _is_text(value):
            raise TextError(
                f"{path} line {number:,}: field {field!r} holds a lone surrogate (a \\ud800-\\udfff escape "
                "without its pair), which is not text"
            )
        read = len(line)
        for piece, last in _split(value):
            yield piece, last, read
            read = 0


def _parquet_pieces(fh, path: Path, field: str, seen: _Seen) -> Iterator[tuple[str, bool, int]]:
    from attn_core.text.parquet import parquet_pieces  # pyarrow loads only for a Parquet file

    return parquet_pieces(fh, path, field, seen, _split, TextError, 8 * READ_BYTES)
