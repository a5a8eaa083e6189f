"""The run store's SQLite index: opening it for writing (WAL journal, schema, migrations) or for
reading only, and the one error every failure of the index becomes (:class:`RunStoreError`).

Reading never writes: no journal pragma, no schema, no clean-up; the index is opened with
``mode=ro`` (and, when that fails for want of the WAL's shared-memory file in a folder that
cannot take one, with ``immutable=1``, provided no WAL file holds pending commits), so listing
works on a read-only or full disk. Writing opens it normally, once per thread."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from attn_core.runs.names import RunStoreError, check_root

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, parent TEXT, task TEXT, status TEXT NOT NULL, message TEXT DEFAULT '',
    config TEXT NOT NULL, summary TEXT DEFAULT '{}', created REAL NOT NULL, updated REAL NOT NULL,
    finished REAL, pid INTEGER, host TEXT
);
CREATE TABLE IF NOT EXISTS metrics (run TEXT NOT NULL, step INTEGER NOT NULL, name TEXT NOT NULL, value REAL);
CREATE INDEX IF NOT EXISTS metrics_run ON metrics (run, step);
CREATE TABLE IF NOT EXISTS sweeps (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, status TEXT NOT NULL, message TEXT DEFAULT '',
    config TEXT NOT NULL, info TEXT DEFAULT '{}', created REAL NOT NULL, updated REAL NOT NULL,
    finished REAL, pid INTEGER, host TEXT
);
CREATE TABLE IF NOT EXISTS queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT, user TEXT NOT NULL DEFAULT '', kind TEXT NOT NULL,
    device TEXT NOT NULL, target TEXT, spec TEXT NOT NULL, steps INTEGER, estimate_s REAL,
    status TEXT NOT NULL, message TEXT DEFAULT '', enqueued REAL NOT NULL, started REAL,
    finished REAL, pid INTEGER, host TEXT
);
CREATE INDEX IF NOT EXISTS queue_status ON queue (status, device)
"""
BUSY_S = 30  # how long a connection waits for another process's write lock
# Columns added to runs after the first release: older index files get them on the first write.
RUN_COLUMNS = {"sweep": "TEXT", "trial": "TEXT"}


def store_error(root: Path, e: BaseException, write: bool) -> RunStoreError:
    """The one-line error of a failed read or write of the store at ``root``."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, sqlite3.DatabaseError) and "not a database" in text:
        text = (
            f"{root / 'index.sqlite'} is not a SQLite database (corrupt or overwritten); move it away to start afresh"
        )
    elif isinstance(e, OSError) and e.strerror:
        text = f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
    return RunStoreError(f"the run store {root} cannot be {'written' if write else 'read'}: {text}")


class Index:
    """Per-thread connections to one ``index.sqlite``: :meth:`writer` (created and migrated on
    first use) and :meth:`reader` (read-only). Connections stay open: closing the last one
    checkpoints the WAL with an fsync, which would cost a training job tens of ms per flush."""

    _init_lock = threading.Lock()

    def __init__(self, root: Path):
        self.root = root
        self.path = root / "index.sqlite"
        self._ready = False
        self._local = threading.local()

    def writer(self) -> sqlite3.Connection:
        con = getattr(self._local, "rw", None)
        if con is None:
            self._ensure()
            con = sqlite3.connect(self.path, timeout=BUSY_S)
            con.row_factory = sqlite3.Row
            # WAL + synchronous=NORMAL: each commit is atomic and survives a killed process (only
            # a power cut may lose the last commits, never corrupt the index)
            con.execute("PRAGMA synchronous=NORMAL")
            self._local.rw = con
        return con

    def reader(self) -> sqlite3.Connection:
        con = getattr(self._local, "ro", None)
        if con is None:
            try:
                con = self._open_ro(immutable=False)
            except sqlite3.Error:
                # a WAL index without its -shm file, in a folder that cannot take one: readable as
                # immutable, provided no -wal file holds commits not yet in the index itself
                wal = self.path.with_name(self.path.name + "-wal")
                if wal.exists() and wal.stat().st_size > 0:
                    raise
                con = self._open_ro(immutable=True)
            self._local.ro = con
        return con

    def _open_ro(self, immutable: bool) -> sqlite3.Connection:
        uri = self.path.resolve().as_uri() + "?mode=ro" + ("&immutable=1" if immutable else "")
        con = sqlite3.connect(uri, uri=True, timeout=BUSY_S)
        con.row_factory = sqlite3.Row
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()  # a garbage file fails here
        except sqlite3.Error:
            con.close()
            raise
        return con

    def tables(self, con: sqlite3.Connection) -> set[str]:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def columns(self, con: sqlite3.Connection, table: str) -> set[str]:
        return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}

    def _migrate(self, con: sqlite3.Connection) -> None:
        """The schema and its migrations in one write transaction, taken before the columns are
        read: two processes opening a new or old store at once (a dashboard and its job, two
        jobs) would otherwise both find a column missing and both add it."""
        con.execute("BEGIN IMMEDIATE")
        try:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    con.execute(statement)
            have = self.columns(con, "runs")
            for name, kind in RUN_COLUMNS.items():
                if name not in have:
                    con.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")
            con.execute("CREATE INDEX IF NOT EXISTS runs_sweep ON runs (sweep)")
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise

    def close(self) -> None:
        for name in ("rw", "ro"):
            con = getattr(self._local, name, None)
            if con is not None:
                con.close()
                setattr(self._local, name, None)

    def _ensure(self) -> None:
        if self._ready:
            return
        with self._init_lock:
            check_root(self.root)  # never in a model folder or the shipped assets/: refused before it is made
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise RunStoreError(f"cannot create the run store {self.root}: {e.strerror}") from None
            # autocommit mode, so the one explicit transaction of _migrate is the only one
            con = sqlite3.connect(self.path, timeout=BUSY_S, isolation_level=None)
            try:
                deadline = time.monotonic() + BUSY_S
                while True:
                    try:
                        con.execute("PRAGMA journal_mode=WAL")
                        self._migrate(con)
                        break
                    except sqlite3.OperationalError as e:
                        # SQLite answers "locked" at once, without waiting, where waiting could
                        # deadlock: switching a rollback-journal index to WAL while another process
                        # holds its write lock. Nothing was written: try again until the deadline.
                        if "locked" not in str(e) or time.monotonic() > deadline:
                            raise
                        time.sleep(0.02)
            finally:
                con.close()
            self._ready = True
