"""Sweeps: groups of runs (``attn_core.sweep`` writes them from the driver), a table of the run
store and the :class:`RunStore` methods that read and write it (see ``attn_core.runs``)."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time

from attn_core.runs.names import SWEEP_STATUSES, check_run_id, iso, new_run_id, pid_alive

_GONE = "interrupted: the driver ended before every trial was recorded"


class SweepsMixin:
    """The sweep methods of :class:`attn_core.runs.RunStore` (which provides ``root``, ``_db``,
    ``_exists``, ``_has`` and ``_row``); a run joins a sweep through its ``sweep`` and ``trial`` columns."""

    def create_sweep(self, name: str, config: dict, info: dict | None = None) -> str:
        """A new sweep in status ``running``, owned by this process; returns its id."""
        sweep_id = "sweep-" + new_run_id()
        self._reap_sweeps()
        now = time.time()
        with self._db(write=True) as con:
            con.execute(
                "INSERT INTO sweeps (id, name, status, config, info, created, updated, pid, host) "
                "VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?)",
                (
                    sweep_id,
                    name,
                    json.dumps(config, default=str),
                    json.dumps(info or {}, default=str),
                    now,
                    now,
                    os.getpid(),
                    socket.gethostname(),
                ),
            )
        return sweep_id

    def update_sweep(self, sweep_id: str, status: str, message: str = "", info: dict | None = None) -> None:
        """Mark a sweep ``running`` again (a resume) or finished (``completed``/``interrupted``)."""
        if status not in SWEEP_STATUSES:
            raise ValueError(f"a sweep's status is one of {', '.join(SWEEP_STATUSES)}, not {status!r}")
        sweep = self.get_sweep(sweep_id)
        self._reap_sweeps()
        now = time.time()
        with self._db(write=True) as con:
            con.execute(
                "UPDATE sweeps SET status = ?, message = ?, info = ?, updated = ?, finished = ?, pid = ?, "
                "host = ? WHERE id = ?",
                (
                    status,
                    message,
                    json.dumps({**sweep["info"], **(info or {})}, default=str),
                    now,
                    None if status == "running" else now,
                    os.getpid(),
                    socket.gethostname(),
                    sweep["id"],
                ),
            )

    def list_sweeps(self) -> list[dict]:
        """Every sweep, newest first: id, name, status, message, created, finished, info, and
        ``trials`` (how many the plan has) and ``counts`` (recorded runs per status)."""
        if not self._exists():
            return []
        with self._db() as con:
            if not self._has(con, "sweeps"):
                return []
            rows = con.execute("SELECT * FROM sweeps ORDER BY created DESC, id DESC").fetchall()
            counts: dict[str, dict] = {}
            for r in con.execute(
                "SELECT sweep, status, COUNT(*) FROM runs WHERE sweep IS NOT NULL GROUP BY sweep, status"
            ):
                counts.setdefault(r[0], {})[r[1]] = r[2]
        return [{**self._sweep_row(r), "counts": counts.get(r["id"], {})} for r in rows]

    def get_sweep(self, sweep_id: str) -> dict:
        """One sweep (as in :meth:`list_sweeps`) with its ``config`` (the plan) and ``runs`` (its
        recorded runs, oldest first, each with its ``trial`` key)."""
        sweep_id = check_run_id(sweep_id)
        row = None
        if self._exists():
            with self._db() as con:
                if not self._has(con, "sweeps"):
                    return self._no_sweep(sweep_id)
                row = con.execute("SELECT * FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
                runs = con.execute("SELECT * FROM runs WHERE sweep = ? ORDER BY created, id", (sweep_id,)).fetchall()
        if row is None:
            return self._no_sweep(sweep_id)
        out = self._sweep_row(row)
        out["config"] = json.loads(row["config"] or "{}")
        out["runs"] = [self._row(r) for r in runs]
        out["counts"] = {}
        for r in out["runs"]:
            out["counts"][r["status"]] = out["counts"].get(r["status"], 0) + 1
        return out

    def _no_sweep(self, sweep_id: str):
        known = [s["id"] for s in self.list_sweeps()[:5]]
        raise ValueError(
            f"no sweep {sweep_id!r} in {self.root}"
            + (f"; recent sweeps: {', '.join(known)}" if known else " (no sweeps yet)")
        )

    def _sweep_row(self, r: sqlite3.Row) -> dict:
        config = json.loads(r["config"] or "{}")
        gone = self._sweep_gone(r)
        return {
            "id": r["id"],
            "name": r["name"],
            "status": "interrupted" if gone else r["status"],
            "message": _GONE if gone else (r["message"] or ""),
            "created": iso(r["created"]),
            "finished": iso(r["finished"]),
            "info": json.loads(r["info"] or "{}"),
            "trials": len(config.get("trials", ())),
        }

    @staticmethod
    def _sweep_gone(r: sqlite3.Row) -> bool:
        """A sweep left 'running' by a process of this host that is gone (listing shows it
        interrupted; a writer records it so, :meth:`_reap_sweeps`)."""
        return r["status"] == "running" and r["host"] == socket.gethostname() and not pid_alive(r["pid"])

    def _reap_sweeps(self) -> None:
        """Sweeps left 'running' by a process of this host that is gone are ``interrupted``."""
        with self._db(write=True) as con:
            gone = [
                r["id"] for r in con.execute("SELECT * FROM sweeps WHERE status = 'running'") if self._sweep_gone(r)
            ]
            for sweep_id in gone:
                con.execute(
                    "UPDATE sweeps SET status = 'interrupted', message = ? WHERE id = ? AND status = 'running'",
                    (_GONE, sweep_id),
                )
