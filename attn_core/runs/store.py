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
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from attn_core import checkpoint, destinations
from attn_core.card import Card
from attn_core.checkpoint import CARD, CHECKPOINTS, WEIGHTS, CheckpointError, LoadedModel
from attn_core.model import Transformer
from attn_core.runs.db import Index, store_error
from attn_core.runs.names import (
    ENV_RUNS,
    FINAL,
    RUN_PREFIX,
    RunStoreError,
    check_root,
    check_run_id,
    default_root,
    iso,
    new_run_id,
    pid_alive,
)
from attn_core.runs.sweeps import SweepsMixin

INDEX = "index.sqlite"
# hidden folders older than this are left-overs of a killed save even when their process cannot
# be checked (another host, an older version); those of a dead process of this host go at once
STALE_TMP_S = 3600


class RunStore(SweepsMixin):
    """The index and checkpoints of runs under ``root`` (default ``$ATTN_LAB_RUNS``, else this
    user's data folder: ``attn_core.runs.default_root``).

    Safe to use from several threads and processes: every call opens its own SQLite connection
    (WAL journal, so readers never wait for a writing job)."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.db_path = self.root / INDEX
        self.index = Index(self.root)

    # --- plumbing -------------------------------------------------------------------------------
    @contextmanager
    def _db(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        """One transaction (committed on success, rolled back on error) on this thread's
        connection: read-only unless ``write``. Any SQLite error becomes a :class:`RunStoreError`."""
        try:
            con = self.index.writer() if write else self.index.reader()
            with con:
                yield con
        except sqlite3.Error as e:
            raise store_error(self.root, e, write) from None

    def close(self) -> None:
        """Close this thread's connections (others close when the store is collected)."""
        self.index.close()

    def _exists(self) -> bool:
        """Whether the index exists (a store never written to has none: nothing to read)."""
        if self.root.exists() and not self.root.is_dir():
            raise RunStoreError(f"the run store {self.root} is not a folder (set ${ENV_RUNS} to a folder)")
        if self.db_path.exists() and not self.db_path.is_file():
            raise RunStoreError(f"the run store {self.root} cannot be read: {self.db_path} is not a file")
        return self.db_path.is_file()

    def _has(self, con: sqlite3.Connection, table: str) -> bool:
        """Whether the index has ``table`` (an index written before it existed, read without
        migrating, or an empty file, lacks it)."""
        return table in self.index.tables(con)

    def check_writable(self) -> None:
        """Raise :class:`RunStoreError` unless the store takes a write now (one tiny commit: the
        index's header), so a job refuses to start instead of training for nothing on a
        read-only, full or corrupt store, or one in a model folder or the shipped assets/
        (:func:`~attn_core.runs.names.check_root`, before anything of it is created)."""
        check_root(self.root)
        self._reap()
        with self._db(write=True) as con:
            version = con.execute("PRAGMA user_version").fetchone()[0]
            con.execute(f"PRAGMA user_version = {int(version)}")
        if not os.access(self.root, os.W_OK):
            raise store_error(self.root, PermissionError(13, "Permission denied", str(self.root)), write=True)

    def path(self, run_id: str) -> Path:
        """The run's checkpoint folder (it exists once the run has finished)."""
        return self.root / check_run_id(run_id)

    # --- writing (the training job) ---------------------------------------------------------------
    def create(self, parent: str, task: str | None, config: dict, run_id: str | None = None) -> str:
        """A new run in status ``running``, owned by this process; returns its id."""
        run_id = check_run_id(run_id or new_run_id())
        self._reap()  # a writer marks the runs of dead processes (listing only shows them so)
        self._sweep_tmp()  # and removes what their killed saves left
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
        files: dict[str, bytes] | None = None,
    ) -> Path | None:
        """Save the weights (atomically, if given, with ``files`` beside them) and then mark the run finished."""
        if status not in FINAL:
            raise ValueError(f"a finished run's status is one of {', '.join(FINAL)}, not {status!r}")
        folder = None
        if model is not None:
            card = dataclasses.replace(Card.from_dict(card), run_id=run_id, status=status, message=message)
            folder = self._save(model, run_id, card, files=files)
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
        include: dict[str, Path] | None = None,
        files: dict[str, bytes] | None = None,
    ) -> str:
        """A run made elsewhere (a sweep's trial on a Ray worker), written in one go: the weights
        folder first (atomically, with the folders of ``include``: its checkpoints), then its row,
        already finished, and its metrics in one transaction; returns the new run id."""
        if status not in FINAL:
            raise ValueError(f"a finished run's status is one of {', '.join(FINAL)}, not {status!r}")
        run_id = new_run_id()
        if model is not None:
            card = dataclasses.replace(
                Card.from_dict(card), name=RUN_PREFIX + run_id, run_id=run_id, status=status, message=message
            )
            self._save(model, run_id, card, include, files)
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
        with self._db() as con:
            if not self._has(con, "runs"):
                return []
            rows = con.execute("SELECT * FROM runs ORDER BY created DESC, id DESC").fetchall()
        return [self._row(r) for r in rows]

    def get(self, run_id: str) -> dict:
        """One run's record (as in :meth:`list_runs`) plus its ``card`` when it has weights."""
        run_id = check_run_id(run_id)
        row = None
        if self._exists():
            with self._db() as con:
                if self._has(con, "runs"):
                    row = con.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            known = [r["id"] for r in self.list_runs()[:5]]
            raise ValueError(
                f"no run {run_id!r} in {self.root}"
                + (f"; recent runs: {', '.join(known)}" if known else " (the store is empty)")
            )
        out = self._row(row)
        out["card"] = self._card(run_id)
        return out

    def metrics(self, run_id: str, names: Iterable[str] | None = None) -> pd.DataFrame:
        """The run's logged metrics: columns step, name, value (names: attn_core.training.telemetry.MetricKey)."""
        run_id = check_run_id(run_id)
        cols = ["step", "name", "value"]
        if not self._exists():
            return pd.DataFrame(columns=cols)
        with self._db() as con:
            if not self._has(con, "metrics"):
                return pd.DataFrame(columns=cols)
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
        folder = self.model_folder(run_id)
        loaded = checkpoint.load_path(folder, device=device)
        loaded.name = RUN_PREFIX + folder.name
        return loaded

    def model_folder(self, run_id: str) -> Path:
        """The folder of a run that has saved weights (else a CheckpointError saying why not)."""
        run = self.get(run_id)
        folder = self.path(run["id"])
        if not (folder / WEIGHTS).is_file():
            raise CheckpointError(
                f"run {run['id']} ({run['status']}) has no saved weights"
                + (f": {run['message']}" if run["message"] else "")
            )
        return folder

    # --- internals ----------------------------------------------------------------------------------
    def _save(
        self,
        model: Transformer,
        run_id: str,
        card: Card,
        include: dict[str, Path] | None = None,
        files: dict[str, bytes] | None = None,
    ) -> Path:
        """Save the run's folder; checkpoints written into it while it trained (``CHECKPOINTS``)
        are carried into the new folder, as are the folders of ``include``; ``files`` (a
        tokenizer) are written beside the weights."""
        own = self.path(run_id) / CHECKPOINTS
        include = {**({CHECKPOINTS: own} if own.is_dir() else {}), **(include or {})}
        try:
            return checkpoint.save(model, self.path(run_id), card, overwrite=True, include=include, files=files)
        except OSError as e:
            raise store_error(self.root, e, write=True) from None

    def _card(self, run_id: str) -> dict | None:
        """The run's card.json as saved, None when there is none (or it cannot be read)."""
        try:
            return checkpoint.read_json(self.path(run_id) / CARD)
        except (OSError, ValueError):
            return None

    def _row(self, r: sqlite3.Row) -> dict:
        keys = r.keys()
        status, message = r["status"], r["message"] or ""
        if status == "running" and self._orphan(r):
            status, message = self._orphan_outcome(r)
        return {
            "id": r["id"],
            "parent": r["parent"],
            "task": r["task"],
            "status": status,
            "message": message,
            "created": iso(r["created"]),
            "finished": iso(r["finished"]),
            "config": json.loads(r["config"] or "{}"),
            "summary": json.loads(r["summary"] or "{}"),
            "has_weights": (self.root / r["id"] / WEIGHTS).is_file(),
            "sweep": r["sweep"] if "sweep" in keys else None,
            "trial": r["trial"] if "trial" in keys else None,
        }

    @staticmethod
    def _orphan(r: sqlite3.Row) -> bool:
        """A row left 'running' by a process of this host that is gone."""
        return r["status"] == "running" and r["host"] == socket.gethostname() and not pid_alive(r["pid"])

    def _orphan_outcome(self, r: sqlite3.Row) -> tuple[str, str]:
        """How an orphaned run ended: the status in its card if the checkpoint was written, else
        failed (its process could not record why: killed, or the store could not be written)."""
        card = self._card(r["id"]) or {}
        status = card.get("status")
        if status in FINAL and isinstance(card.get("message", ""), str):
            return status, card.get("message", "")
        return "failed", (
            f"interrupted: process {r['pid']} ended before the run finished "
            "(killed, or it could not write its outcome to the run store)"
        )

    def _reap(self) -> None:
        """Write the outcome of orphaned runs (see :meth:`_orphan_outcome`) into the index; only
        writers call this (listing shows orphans so without writing)."""
        if not self._exists():
            return
        with self._db() as con:
            if not self._has(con, "runs"):
                return
            orphans = [r for r in con.execute("SELECT * FROM runs WHERE status = 'running'") if self._orphan(r)]
        for r in orphans:
            status, message = self._orphan_outcome(r)
            with self._db(write=True) as con:
                con.execute(
                    "UPDATE runs SET status = ?, message = ?, updated = ? WHERE id = ? AND status = 'running'",
                    (status, message, time.time(), r["id"]),
                )

    def _sweep_tmp(self) -> None:
        """Remove the temporary folders that killed saves left behind: at once when their process
        (on this host) is gone, after STALE_TMP_S otherwise (a young one may be a save in progress
        on another host)."""
        destinations.remove_stale_tmp(self.root, max_age_s=STALE_TMP_S)
