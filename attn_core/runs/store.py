"""The run store's core: :class:`RunStore`, the SQLite index and the checkpoint folders of runs
(writing, reading, reaping the runs of killed processes). The layout and atomicity rules are in
``attn_core.runs``; the sweep methods come from ``attn_core.runs.sweeps``."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pandas as pd

from attn_core import checkpoint
from attn_core.card import Card
from attn_core.checkpoint import CARD, WEIGHTS, CheckpointError, LoadedModel
from attn_core.model import Transformer
from attn_core.runs.names import FINAL, RUN_PREFIX, check_run_id, default_root, iso, new_run_id, pid_alive
from attn_core.runs.sweeps import SWEEP_SCHEMA, SweepsMixin

INDEX = "index.sqlite"
STALE_TMP_S = 3600  # hidden temporary folders older than this are left-overs of a killed save

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, parent TEXT, task TEXT, status TEXT NOT NULL, message TEXT DEFAULT '',
    config TEXT NOT NULL, summary TEXT DEFAULT '{}', created REAL NOT NULL, updated REAL NOT NULL,
    finished REAL, pid INTEGER, host TEXT
);
CREATE TABLE IF NOT EXISTS metrics (run TEXT NOT NULL, step INTEGER NOT NULL, name TEXT NOT NULL, value REAL);
CREATE INDEX IF NOT EXISTS metrics_run ON metrics (run, step);
"""
# Columns added to runs after the first release: older index files get them on open (ALTER TABLE).
_RUN_COLUMNS = {"sweep": "TEXT", "trial": "TEXT"}


class RunStore(SweepsMixin):
    """The index and checkpoints of runs under ``root`` (default ``$ATTN_LAB_RUNS`` or ./runs).

    Safe to use from several threads and processes: every call opens its own SQLite connection
    (WAL journal, so readers never wait for a writing job)."""

    _init_lock = threading.Lock()

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.db_path = self.root / INDEX
        self._ready = False
        self._local = threading.local()

    # --- plumbing -------------------------------------------------------------------------------
    @contextmanager
    def _db(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        if write or self._exists():
            self._ensure()
        con = getattr(self._local, "con", None)
        if con is None:
            # One connection per thread, kept open: closing the last connection checkpoints the
            # WAL with an fsync, which would cost a training job tens of ms per flush.
            con = sqlite3.connect(self.db_path, timeout=30)
            con.row_factory = sqlite3.Row
            # WAL + synchronous=NORMAL: each commit is atomic and survives a killed process (only
            # a power cut may lose the last commits, never corrupt the index)
            con.execute("PRAGMA synchronous=NORMAL")
            self._local.con = con
        with con:  # one transaction: committed on success, rolled back on error
            yield con

    def close(self) -> None:
        """Close this thread's connection (others close when the store is collected)."""
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None

    def _ensure(self) -> None:
        if self._ready:
            return
        with self._init_lock:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ValueError(f"cannot create the run store {self.root}: {e.strerror}") from None
            with closing(sqlite3.connect(self.db_path, timeout=30)) as con:
                con.execute("PRAGMA journal_mode=WAL")
                con.executescript(_SCHEMA + SWEEP_SCHEMA)
                have = {r[1] for r in con.execute("PRAGMA table_info(runs)")}
                for name, kind in _RUN_COLUMNS.items():
                    if name not in have:
                        con.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")
                con.execute("CREATE INDEX IF NOT EXISTS runs_sweep ON runs (sweep)")
                con.commit()
            self._ready = True

    def _exists(self) -> bool:
        return self.db_path.is_file()

    def path(self, run_id: str) -> Path:
        """The run's checkpoint folder (it exists once the run has finished)."""
        return self.root / check_run_id(run_id)

    # --- writing (the training job) ---------------------------------------------------------------
    def create(self, parent: str, task: str | None, config: dict, run_id: str | None = None) -> str:
        """A new run in status ``running``, owned by this process; returns its id."""
        run_id = check_run_id(run_id or new_run_id())
        now = time.time()
        with self._db(write=True) as con:
            con.execute(
                "INSERT INTO runs (id, parent, task, status, config, created, updated, pid, host) "
                "VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?)",
                (run_id, parent, task, json.dumps(config, default=str), now, now, os.getpid(), socket.gethostname()),
            )
        return run_id

    def log_metrics(self, run_id: str, rows: Iterable[tuple[int, str, float]]) -> None:
        """Append (step, name, value) rows in one transaction."""
        rows = [(run_id, int(s), str(n), float(v)) for s, n, v in rows]
        if rows:
            with self._db(write=True) as con:
                con.executemany("INSERT INTO metrics (run, step, name, value) VALUES (?, ?, ?, ?)", rows)
                con.execute("UPDATE runs SET updated = ? WHERE id = ?", (time.time(), run_id))

    def finish(
        self,
        run_id: str,
        status: str,
        model: Transformer | None,
        card: Card | dict,
        message: str = "",
        summary: dict | None = None,
    ) -> Path | None:
        """Save the weights (atomically, if given) and then mark the run finished."""
        if status not in FINAL:
            raise ValueError(f"a finished run's status is one of {', '.join(FINAL)}, not {status!r}")
        folder = None
        if model is not None:
            card = dataclasses.replace(Card.from_dict(card), run_id=run_id, status=status, message=message)
            folder = checkpoint.save(model, self.path(run_id), card, overwrite=True)
        now = time.time()
        with self._db(write=True) as con:
            con.execute(
                "UPDATE runs SET status = ?, message = ?, summary = ?, updated = ?, finished = ? WHERE id = ?",
                (status, message, json.dumps(summary or {}, default=str), now, now, run_id),
            )
        self._sweep_tmp()
        return folder

    def add_run(
        self,
        parent: str | None,
        task: str | None,
        config: dict,
        status: str,
        message: str = "",
        model: Transformer | None = None,
        card: Card | dict | None = None,
        summary: dict | None = None,
        metrics: Iterable[tuple[int, str, float]] = (),
        sweep: str | None = None,
        trial: str | None = None,
    ) -> str:
        """A run made elsewhere (a sweep's trial on a Ray worker), written in one go: the weights
        folder first (atomically), then its row, already finished, and its metrics in one
        transaction; returns the new run id."""
        if status not in FINAL:
            raise ValueError(f"a finished run's status is one of {', '.join(FINAL)}, not {status!r}")
        run_id = new_run_id()
        if model is not None:
            card = dataclasses.replace(
                Card.from_dict(card), name=RUN_PREFIX + run_id, run_id=run_id, status=status, message=message
            )
            checkpoint.save(model, self.path(run_id), card, overwrite=True)
        now = time.time()
        rows = [(run_id, int(s), str(n), float(v)) for s, n, v in metrics]
        with self._db(write=True) as con:
            con.execute(
                "INSERT INTO runs (id, parent, task, status, message, config, summary, created, updated, "
                "finished, pid, host, sweep, trial) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    parent,
                    task,
                    status,
                    message,
                    json.dumps(config, default=str),
                    json.dumps(summary or {}, default=str),
                    now,
                    now,
                    now,
                    os.getpid(),
                    socket.gethostname(),
                    sweep,
                    trial,
                ),
            )
            con.executemany("INSERT INTO metrics (run, step, name, value) VALUES (?, ?, ?, ?)", rows)
        return run_id

    def delete(self, run_id: str) -> None:
        """Remove a finished run (index rows and folder). A running run cannot be deleted."""
        run = self.get(run_id)
        if run["status"] == "running":
            raise ValueError(f"run {run_id} is still running; stop it first")
        with self._db(write=True) as con:
            con.execute("DELETE FROM metrics WHERE run = ?", (run["id"],))
            con.execute("DELETE FROM runs WHERE id = ?", (run["id"],))
        shutil.rmtree(self.path(run["id"]), ignore_errors=True)

    # --- reading (CLI, dashboard) ---------------------------------------------------------------------
    def list_runs(self) -> list[dict]:
        """Every run, newest first: id, parent, task, status, message, created, finished (ISO
        times), config (dict), summary (dict: before/after metrics), has_weights."""
        if not self._exists():
            return []
        self._reap()
        with self._db() as con:
            rows = con.execute("SELECT * FROM runs ORDER BY created DESC, id DESC").fetchall()
        return [self._row(r) for r in rows]

    def get(self, run_id: str) -> dict:
        """One run's record (as in :meth:`list_runs`) plus its ``card`` when it has weights."""
        run_id = check_run_id(run_id)
        if self._exists():
            self._reap()
            with self._db() as con:
                row = con.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        else:
            row = None
        if row is None:
            known = [r["id"] for r in self.list_runs()[:5]]
            raise ValueError(
                f"no run {run_id!r} in {self.root}"
                + (f"; recent runs: {', '.join(known)}" if known else " (the store is empty)")
            )
        out = self._row(row)
        card_path = self.path(run_id) / CARD
        out["card"] = json.loads(card_path.read_text()) if card_path.is_file() else None
        return out

    def metrics(self, run_id: str, names: Iterable[str] | None = None) -> pd.DataFrame:
        """The run's logged metrics: columns step, name, value (names: attn_core.training.telemetry.MetricKey)."""
        run_id = check_run_id(run_id)
        cols = ["step", "name", "value"]
        if not self._exists():
            return pd.DataFrame(columns=cols)
        with self._db() as con:
            rows = con.execute(
                "SELECT step, name, value FROM metrics WHERE run = ? ORDER BY rowid", (run_id,)
            ).fetchall()
        df = pd.DataFrame([tuple(r) for r in rows], columns=cols)
        if names is not None:
            df = df[df["name"].isin(list(names))].reset_index(drop=True)
        return df

    def load_model(self, run_id: str, device: str = "cpu") -> LoadedModel:
        """A run's weights as a :class:`LoadedModel` named ``run:<id>``; its card holds task,
        parent, regularizers, metrics (after), before, status. (Callers use
        ``attn_core.sources.resolve("run:<id>", store=...)``, which comes here.)"""
        run = self.get(run_id)
        folder = self.path(run["id"])
        if not (folder / WEIGHTS).is_file():
            raise CheckpointError(
                f"run {run['id']} ({run['status']}) has no saved weights"
                + (f": {run['message']}" if run["message"] else "")
            )
        loaded = checkpoint.load_path(folder, device=device)
        loaded.name = RUN_PREFIX + run["id"]
        return loaded

    # --- internals ----------------------------------------------------------------------------------
    def _row(self, r: sqlite3.Row) -> dict:
        return {
            "id": r["id"],
            "parent": r["parent"],
            "task": r["task"],
            "status": r["status"],
            "message": r["message"] or "",
            "created": iso(r["created"]),
            "finished": iso(r["finished"]),
            "config": json.loads(r["config"] or "{}"),
            "summary": json.loads(r["summary"] or "{}"),
            "has_weights": (self.root / r["id"] / WEIGHTS).is_file(),
            "sweep": r["sweep"],
            "trial": r["trial"],
        }

    def _reap(self) -> None:
        """Runs left 'running' by a process of this host that is gone: take the status from the
        card if the checkpoint was written, else mark them failed."""
        host = socket.gethostname()
        with self._db() as con:
            orphans = [
                r
                for r in con.execute("SELECT id, pid, host FROM runs WHERE status = 'running'")
                if r["host"] == host and not pid_alive(r["pid"])
            ]
        for r in orphans:
            card_path = self.root / r["id"] / CARD
            status, message = "failed", f"interrupted: process {r['pid']} ended before the run finished"
            if card_path.is_file():
                try:
                    card = json.loads(card_path.read_text())
                    status, message = card.get("status", status), card.get("message", message)
                except ValueError:
                    pass
            with self._db(write=True) as con:
                con.execute(
                    "UPDATE runs SET status = ?, message = ?, updated = ? WHERE id = ? AND status = 'running'",
                    (status if status in FINAL else "failed", message, time.time(), r["id"]),
                )

    def _sweep_tmp(self) -> None:
        """Remove hidden temporary folders that a killed save left behind (old ones only: a young
        one may belong to a save in progress in another process)."""
        now = time.time()
        for p in self.root.glob(".*"):
            try:
                if p.is_dir() and now - p.stat().st_mtime > STALE_TMP_S:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass
