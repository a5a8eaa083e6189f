"""Where the dashboard's text comes from: an upload (size-bounded, kept by the hash of its bytes in
the run store's data directory) or a file or folder under the folder the server names in
``$ATTN_LAB_DATA`` -- never any other path a browser could type.

:func:`data_files` lists what ``$ATTN_LAB_DATA`` holds (relative names); :func:`data_path`
turns such a name back into a path, refusing one that leads outside the folder (``..``, an
absolute path, a link; a link loop is one sentence too); :func:`save_upload` keeps an upload's
bytes under the SHA-256 of its content (a name the browser sends is never part of a path);
:func:`page_message` says an error of the text's reading in the page's words (the upload's own
name for the kept file's path, the page's labels for the command line's options).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from attn_core import limits
from attn_core.runs import default_root
from attn_core.text.corpus import SUFFIXES, TextError

ENV_DATA = "ATTN_LAB_DATA"
UPLOADS = "text-uploads"  # under the run store's data directory
MAX_UPLOAD_MB = 200  # Streamlit's own default upload limit
MAX_LISTED = 2000  # names listed from $ATTN_LAB_DATA


def data_root() -> Path | None:
    """The folder ``$ATTN_LAB_DATA`` names, when it is set and is a folder."""
    raw = os.environ.get(ENV_DATA)
    if not raw:
        return None
    root = Path(raw).expanduser()
    return root if root.is_dir() else None


def data_files(root: Path | None = None) -> list[str]:
    """Text files (.txt, .jsonl, .parquet) and the folders holding them under ``root`` (default
    ``$ATTN_LAB_DATA``), as names relative to it (folders end in ``/``), sorted; hidden ones and
    links leading out are left out; at most :data:`MAX_LISTED`."""
    root = data_root() if root is None else Path(root)
    if root is None:
        return []
    base = limits.real_path(root)
    found: set[str] = set()
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            path = Path(folder) / name
            if name.startswith(".") or path.suffix.lower() not in SUFFIXES:
                continue
            if not limits.real_path(path).is_relative_to(base) or not path.is_file():
                continue
            rel = path.relative_to(root)
            found.add(str(rel))
            found.update(f"{p}/" for p in rel.parents if str(p) != ".")
            if len(found) >= MAX_LISTED:
                return sorted(found)
    return sorted(found)


def data_path(name: str, root: Path | None = None) -> Path:
    """The path of ``name`` (as :func:`data_files` lists it) under ``root`` (default
    ``$ATTN_LAB_DATA``); a TextError for a name that leads outside it or names nothing."""
    root = data_root() if root is None else Path(root)
    if root is None:
        raise TextError(f"no data folder: set ${ENV_DATA} to a folder of text files on the server")
    if not isinstance(name, str) or not name.strip() or "\x00" in name or Path(name).is_absolute():
        raise TextError(f"{name!r} is not a name inside the data folder")
    path, base = limits.real_path(root / name.rstrip("/")), limits.real_path(root)
    if not path.is_relative_to(base) or path == base:
        raise TextError(f"{name!r} leads outside the data folder ${ENV_DATA}; only files inside it are read")
    if not path.exists():
        if os.path.lexists(root / name.rstrip("/")):
            raise TextError(f"{name!r} in the data folder ${ENV_DATA} is a dangling link or a link loop")
        raise TextError(f"{name!r} is not in the data folder ${ENV_DATA}")
    return path


def upload_name(name: object) -> str:
    """The name an upload is shown by: the browser's file name without folders, refused when
    it is empty, holds a NUL or another control character, or is not a .txt, .jsonl or .parquet
    file."""
    text = str(name) if isinstance(name, str) else ""
    shown = text.replace("\\", "/").rsplit("/", 1)[-1].strip()
    if not shown or any(ord(c) < 32 or ord(c) == 127 for c in shown) or not _printable(shown):
        raise TextError("the uploaded file has no usable name; rename it (letters, digits, .txt, .jsonl or .parquet)")
    if Path(shown).suffix.lower() not in SUFFIXES:
        raise TextError(f"upload a .txt, .jsonl or .parquet file, not {shown[:80]!r}")
    return shown


def _printable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def save_upload(name: str, data: bytes, root: str | Path | None = None) -> Path:
    """Keep an uploaded text file: ``<data dir>/text-uploads/<sha256 of its bytes>/upload<suffix>``
    (the same bytes are kept once; a kept file whose bytes are no longer those is written
    again). Refused: a name :func:`upload_name` refuses, and more than :data:`MAX_UPLOAD_MB` MB."""
    shown = upload_name(name)
    suffix = Path(shown).suffix.lower()
    if not isinstance(data, (bytes, bytearray)):
        raise TextError(f"{shown} could not be read from the upload")
    if len(data) > MAX_UPLOAD_MB * 10**6:
        raise limits.LimitError(
            f"the upload is {limits.size_text(len(data))}; the limit is {MAX_UPLOAD_MB} MB "
            f"(a larger text goes in the server's data folder, ${ENV_DATA})"
        )
    if not data:
        raise TextError(f"{shown} is empty")
    digest = hashlib.sha256(data).hexdigest()
    folder = Path(root if root is not None else default_root()) / UPLOADS / digest[:32]
    path = folder / f"upload{suffix}"
    try:
        if path.is_file() and not path.is_symlink() and _sha256(path) == digest:
            return path
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".upload{suffix}.{os.getpid()}"
        tmp.write_bytes(data)
        tmp.replace(path)
    except OSError as e:
        raise OSError(f"the upload {shown} could not be kept ({e.strerror or e})") from None
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(2**22):
            h.update(block)
    return h.hexdigest()


# the command line's words in an error, and the page's (the Retrain page's Text section), in order
PAGE_WORDS = (
    (r"\(--block (\d+) \+ 1\)", r"(\1 tokens + 1)"),
    (r"a smaller --block", "a smaller Block (tokens)"),
    (r"a held-out text with --eval-text", "another held-out text"),
    (r"the held-out text \(--eval-text\)", "the held-out text"),
    (r"name the text with --text-field", "name it in the Text field box"),
    (r"--text-field", "the Text field"),
    (r"--eval-text", "the held-out text"),
    (r"--text\b:?", "the text"),
    (r"--block", "Block (tokens)"),
)


def page_message(error: BaseException | str, uploads: dict[Path, str] | None = None) -> str:
    """An error of reading or tokenizing a text in the page's words: each kept upload's path
    (``uploads``: path -> the name it was uploaded as) said as that name, the run store's
    folders not named, the command line's options said as the page's labels."""
    import re

    text = str(error)
    for path, shown in (uploads or {}).items():
        text = text.replace(str(path), shown)
    for pattern, words in PAGE_WORDS:
        text = re.sub(pattern, words, text)
    store = str(Path(default_root()) / UPLOADS)
    return text.replace(store, "the uploads")
