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
and ``.parquet`` files count (hidden files and folders are skipped).
"""

from __future__ import annotations

import codecs
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from attn_core import limits

MAX_CORPUS_BYTES = 16 * 2**30  # all the files of one corpus together
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
        while no file's size or modification time changes)."""
        try:
            stamp = (
                self.field,
                tuple((str(f.resolve()), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in self.files),
            )
        except OSError:
            stamp = None
        if stamp is not None and stamp in _FINGERPRINTS:
            return _FINGERPRINTS[stamp]
        h = hashlib.sha256(f"field={self.field}\n".encode())
        done = 0
        for name, f, kind, size in zip(self.names(), self.files, self.kinds, self.sizes):
            h.update(f"{name}\0{kind}\0{size}\n".encode())
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

    def pieces(self, progress: Progress | None = None) -> Iterator[tuple[str, bool]]:
        """(text, ends a document) in reading order; raises :class:`TextError` on bad text."""
        done = 0
        for f, kind, size in zip(self.files, self.kinds, self.sizes):
            reader = {"text": _text_pieces, "jsonl": _jsonl_pieces, "parquet": _parquet_pieces}[kind]
            start = done
            for piece, end, read in reader(f, self.field):
                if progress is not None and read:
                    done = min(done + read, start + size)
                    progress(done, self.bytes)
                yield piece, end
            done = start + size
            if progress is not None:
                progress(done, self.bytes)


def kind_of(path: Path) -> str:
    return SUFFIXES.get(path.suffix.lower(), "text")


def open_corpus(path: str | Path, field: str | None = None, what: str = "--text") -> Corpus:
    """The corpus at ``path``: a file, or a folder (searched recursively) of ``.txt``, ``.jsonl``
    and ``.parquet`` files. Checked here, before anything is read: every file is a regular file
    (a FIFO or a device is refused without being opened), the folder holds one, and all of them
    together are at most :data:`MAX_CORPUS_BYTES`."""
    if not isinstance(path, (str, Path)) or not str(path).strip() or "\x00" in str(path):
        raise TextError(f"{what} needs a path to a text file or a folder of them")
    if field is not None and (not isinstance(field, str) or not field.strip()):
        raise TextError("--text-field must name a field (a JSON key or a Parquet column)")
    path = Path(path).expanduser()
    if not os.path.exists(path):
        raise TextError(f"{what} {path} does not exist")
    if path.is_dir():  # else a file, checked below: a FIFO or a device is refused unopened
        files = _folder_files(path)
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


def _folder_files(folder: Path) -> list[Path]:
    found: list[Path] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if not name.startswith(".") and Path(name).suffix.lower() in SUFFIXES:
                found.append(Path(root) / name)
                if len(found) > MAX_FILES:
                    raise limits.LimitError(f"{folder} holds more than {MAX_FILES:,} text files, the limit")
    return found


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


def _text_pieces(path: Path, field: str) -> Iterator[tuple[str, bool, int]]:
    """A plain-text file as pieces of at most :data:`PIECE_CHARS` characters cut between words
    (:func:`_cut`); the whole file is one document."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
    buffer, offset, pending_bytes = "", 0, 0
    with _open_regular(path) as fh:
        while True:
            raw = fh.read(READ_BYTES)
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


def _jsonl_pieces(path: Path, field: str) -> Iterator[tuple[str, bool, int]]:
    """One document per line: the line's JSON object's ``field`` (a string). Blank lines are
    skipped; a line that is no object, lacks the field or holds no string there is refused."""
    from attn_core.checkpoint import CheckpointError, parse_json

    with _open_regular(path) as fh:
        offset = 0
        for number, line in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), start=1):
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
            read = len(line)
            for piece, last in _split(value):
                yield piece, last, read
                read = 0


def _parquet_pieces(path: Path, field: str) -> Iterator[tuple[str, bool, int]]:
    """One document per row: the string column ``field`` (null cells skipped), read a batch of
    rows at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with _open_regular(path) as fh:
        try:
            pf = pq.ParquetFile(fh)
        except Exception as e:  # pyarrow raises ArrowInvalid and several others
            first = (str(e).splitlines() or [type(e).__name__])[0][:160]
            raise TextError(f"{path} is not a readable Parquet file ({first})") from None
        schema = pf.schema_arrow
        if field not in schema.names:
            columns = ", ".join(repr(n) for n in schema.names[:8]) or "none"
            raise TextError(f"{path} has no column {field!r} (its columns: {columns}); name the text with --text-field")
        kind = schema.field(field).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise TextError(f"{path}: column {field!r} holds {kind}, not text")
        size = os.fstat(fh.fileno()).st_size
        groups = max(pf.num_row_groups, 1)
        try:
            for i in range(pf.num_row_groups):
                first_batch = True
                for batch in pf.iter_batches(batch_size=256, columns=[field], row_groups=[i]):
                    read = size // groups if first_batch else 0
                    first_batch = False
                    for value in batch.column(0).to_pylist():
                        if value is None:
                            continue
                        for piece, last in _split(value):
                            yield piece, last, read
                            read = 0
        except (pa.ArrowException, OSError) as e:
            first = (str(e).splitlines() or [type(e).__name__])[0][:160]
            raise TextError(f"{path} could not be read to the end ({first})") from None
