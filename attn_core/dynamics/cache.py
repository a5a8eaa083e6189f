"""The per-checkpoint cache of :func:`attn_core.dynamics.dynamics`: one JSON file per (member,
inputs, settings) key, read as untrusted input.

An entry is read only when it is a regular file (not a link: one is refused unread and
untouched) of at most :data:`MAX_ENTRY_BYTES` (a FIFO, a
device, a folder or a link to one is refused without being opened: ``limits.read_file``), its
JSON is within ``untrusted.parse_json``'s size and depth, its numbers are finite (null marks a
metric that is not measured, never a number that is not finite), its K-composition matrix is
square of the series' head count, and its ``sha256`` matches the SHA-256 of the key it was
computed for and its payload. Anything else is *refused*: counted, its reason kept, and the
checkpoint measured again (the new result replaces the entry). Writes go to a fresh temporary
file (``mkstemp``: a name planted in advance is never opened) renamed into place.

The checksum finds a damaged, truncated, hand-edited or misfiled entry (an entry copied under
another key fails too, since the key is hashed with its payload); it is not a signature: who can
write the cache folder can also write a matching checksum, as they can edit the checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

from attn_core import limits, untrusted
from attn_core.dynamics.metrics import Measured
from attn_core.runs import default_root

CACHE_DIR = "dynamics-cache"  # in the run store's folder: $ATTN_LAB_RUNS, else the user data folder
FORMAT = 2  # of an entry's JSON; entries of another format are refused (and measured again)
MAX_ENTRY_BYTES = 8 * 2**20  # K-composition of 1,024 heads is ~20 MB: larger entries are refused, never read
MAX_REASONS = 5
RECOUNT = 256  # writes between two listings of the folder


def checksum(key: str, value: Measured) -> str:
    """SHA-256 of the key and the entry's payload (canonical JSON; refuses non-finite numbers)."""
    payload = json.dumps(
        [FORMAT, key, value.values, value.k_composition], sort_keys=True, allow_nan=False, separators=(",", ":")
    )
    return hashlib.sha256(payload.encode()).hexdigest()


class EntryError(ValueError):
    """A cache entry that is not what :class:`MetricCache` wrote for its key."""


def _finite_or_null(v, where: str) -> float | None:
    if v is None:
        return None
    try:
        x = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
    except OverflowError:
        x = math.nan
    if not math.isfinite(x):
        raise EntryError(f"{where} is {str(v)[:40]}, not a finite number or null")
    return x


def parse_entry(data: bytes, key: str, n_heads: int | None = None) -> Measured:
    """The :class:`Measured` an entry's bytes hold for ``key``; an :class:`EntryError` for anything
    that is not exactly what :meth:`MetricCache.put` wrote (see the module doc)."""
    try:
        raw = untrusted.parse_json(data, "the entry", MAX_ENTRY_BYTES)
    except ValueError as e:
        raise EntryError(str(e)) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise EntryError(f"not an entry of format {FORMAT}")
    if raw.get("key") != key:
        raise EntryError("it was written for another key")
    values, k = raw.get("values"), raw.get("k_composition")
    if not isinstance(values, dict) or not all(isinstance(n, str) for n in values):
        raise EntryError("its values are not an object of metric names")
    found = {n: _finite_or_null(v, f"metric {n[:60]!r}") for n, v in values.items()}
    if not isinstance(k, list) or not all(isinstance(row, list) and len(row) == len(k) for row in k):
        raise EntryError("its K-composition is not a square matrix")
    if n_heads is not None and len(k) != n_heads:
        raise EntryError(f"its K-composition has {len(k)} heads, the series {n_heads}")
    rows = [[_finite_or_null(v, "a K-composition score") for v in row] for row in k]
    measured = Measured(found, rows)
    if raw.get("sha256") != checksum(key, measured):
        raise EntryError("its checksum does not match its numbers")
    return measured


class MetricCache:
    """One JSON file per key under ``folder`` (default: the data directory's ``dynamics-cache``),
    at most ``max_bytes`` in all: a write that goes over removes the least recently used entries
    (a hit marks its entry used) until the folder is at 3/4 of it. ``hits``, ``misses`` and
    ``refused`` count this object's lookups (``reasons``: why the first few were refused). A
    folder that takes no write makes the cache read-only (``write_errors`` counts the failed
    writes)."""

    MAX_BYTES = 64 * 2**20

    def __init__(self, folder: str | Path | None = None, max_bytes: int = MAX_BYTES):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be a whole number of bytes >= 1, got {max_bytes!r}")
        self.folder = Path(folder) if folder is not None else default_root() / CACHE_DIR
        self.max_bytes = max_bytes
        self.hits = self.misses = self.refused = self.write_errors = self.evicted = 0
        self.reasons: list[str] = []
        self._total: int | None = None  # bytes in the folder as last counted, plus what this object wrote since
        self._puts = 0

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str, n_heads: int | None = None) -> Measured | None:
        """The entry of ``key`` (checked: see the module doc), None when there is none or it is
        refused; ``n_heads``: the series' head count, the size its K-composition must have."""
        path = self._path(key)
        if path.is_symlink():  # never read through (a file outside the store), nor touched on a hit
            return self._refuse(f"{path.name} is a link to {os.readlink(path)[:200]}; an entry is never a link")
        try:
            data = limits.read_file(path, MAX_ENTRY_BYTES, path.name)
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, ValueError) as e:  # not a regular file, too large, unreadable
            return self._refuse(str(e))
        try:
            found = parse_entry(data, key, n_heads)
        except EntryError as e:
            return self._refuse(f"{path.name}: {e}")
        self.hits += 1
        try:
            os.utime(path, follow_symlinks=False)  # used now: the last to go when the folder is trimmed
        except OSError:
            pass
        return found

    def _refuse(self, reason: str) -> None:
        self.misses += 1
        self.refused += 1
        if len(self.reasons) < MAX_REASONS:
            self.reasons.append(untrusted.first_line(Exception(reason)))
        return None

    def put(self, key: str, value: Measured) -> None:
        """Write the entry of ``key`` (replacing whatever is there); a value holding a number that
        is not finite is never written."""
        try:
            entry = {"format": FORMAT, "key": key, "sha256": checksum(key, value)}
        except ValueError:  # a NaN or Inf: measured again next time, never cached
            return
        entry |= {"values": value.values, "k_composition": value.k_composition}
        tmp = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=self.folder)
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, allow_nan=False)
                size = f.tell()
            os.replace(tmp, self._path(key))
        except OSError:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            self.write_errors += 1
            return
        # the folder is counted again (one listing) only when this object's count passes the bound,
        # and every RECOUNT writes (other processes write too): a long series costs no listing per write
        self._puts += 1
        if self._total is not None and self._puts % RECOUNT:
            self._total += size
            if self._total <= self.max_bytes:
                return
        self._total = self._trim(keep=self._path(key))

    def _trim(self, keep: Path) -> int:
        """Remove the least recently used entries (never ``keep``, the one just written) while
        the folder holds more than ``max_bytes``, down to 3/4 of it; returns the bytes left."""
        entries = []
        for path in self.folder.glob("*.json"):
            try:
                st = path.lstat()
            except OSError:  # removed meanwhile (another process trims too)
                continue
            entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        if total <= self.max_bytes:
            return total
        for _, size, path in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes * 3 // 4:
                break
            if path == keep:
                continue
            try:
                path.unlink()
            except OSError:
                continue
            total -= size
            self.evicted += 1
        return total
