"""Where the dashboard's text comes from: an upload (size-bounded, kept by the hash of its bytes in
the run store's data directory) or a file or folder under the folder the server names in
``$ATTN_LAB_DATA`` -- never any other path a browser could type.

:func:`data_files` lists what ``$ATTN_LAB_DATA`` holds (relative names); :func:`data_path`
turns such a name back into a path, refusing one that leads outside the folder (``..``, an
absolute path, a link); :func:`save_upload` keeps an upload's bytes.
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
    base = root.resolve()
    found: set[str] = set()
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            path = Path(folder) / name
            if name.startswith(".") or path.suffix.lower() not in SUFFIXES:
                continue
            if not path.resolve().is_relative_to(base) or not path.is_file():
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
    path = (root / name.rstrip("/")).resolve()
    if not path.is_relative_to(root.resolve()) or path == root.resolve():
        raise TextError(f"{name!r} leads outside the data folder ${ENV_DATA}; only files inside it are read")
    if not path.exists():
        raise TextError(f"{name!r} is not in the data folder ${ENV_DATA}")
    return path


def save_upload(name: str, data: bytes, root: str | Path | None = None) -> Path:
    """Keep an uploaded text file: ``<data dir>/text-uploads/<sha256 of its bytes>/upload<suffix>``
    (the same bytes are kept once). Refused: a suffix other than .txt, .jsonl, .parquet, and more
    than :data:`MAX_UPLOAD_MB` MB."""
    suffix = Path(str(name)).suffix.lower()
    if suffix not in SUFFIXES:
        raise TextError(f"upload a {', '.join(SUFFIXES)} file, not {Path(str(name)).name!r}")
    if len(data) > MAX_UPLOAD_MB * 10**6:
        raise limits.LimitError(
            f"the upload is {limits.size_text(len(data))}; the limit is {MAX_UPLOAD_MB} MB (use $ATTN_LAB_DATA for more)"
        )
    if not data:
        raise TextError(f"{Path(str(name)).name} is empty")
    folder = Path(root if root is not None else default_root()) / UPLOADS / hashlib.sha256(data).hexdigest()[:32]
    path = folder / f"upload{suffix}"
    if path.is_file() and path.stat().st_size == len(data):
        return path
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".upload{suffix}.{os.getpid()}"
    tmp.write_bytes(data)
    tmp.replace(path)
    return path
