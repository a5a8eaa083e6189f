"""Run stores from before there was one per user: finding them and copying their runs in.

Until this release the default store was ``./runs`` of the folder a command ran in, so runs made
from one folder were invisible from another. Now the default is one store per user (``names.
default_root``); the old ``runs/`` folders are still found (:func:`legacy_stores`: the current
folder's and the repository's), said by ``attn-lab runs`` and the Runs page, and copied in on
request (:func:`import_store`, ``attn-lab runs import PATH``, the Runs page's button). Copying
never deletes or changes the old store, and never overwrites a run: a run (or sweep, or upload)
whose id is already in the store is skipped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from attn_core import destinations
from attn_core.runs.names import ENV_RUNS, RunStoreError, check_run_id

REPO_RUNS = Path(__file__).resolve().parents[2] / "runs"  # where the dashboard, run from the repository, kept them
UPLOADS = "uploads"


def candidates() -> list[Path]:
    """Where an old store may be: ``./runs`` of the current folder and the repository's ``runs``."""
    return list(dict.fromkeys(p.absolute() for p in (Path.cwd() / "runs", REPO_RUNS)))


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def pending(source: Path, store) -> list[str]:
    """Ids of the runs in the store at ``source`` that ``store`` lacks (unreadable: none)."""
    from attn_core.runs.store import RunStore

    try:
        theirs = [r["id"] for r in RunStore(source).list_runs()]
        mine = {r["id"] for r in store.list_runs()}
    except (RunStoreError, OSError):
        return []
    return [i for i in theirs if i not in mine]


def legacy_stores(store) -> list[dict]:
    """Old stores (:func:`candidates` holding an ``index.sqlite``) that are not ``store`` and
    hold runs it lacks: ``[{"path": Path, "runs": count}]``."""
    found = []
    for path in candidates():
        if (path / "index.sqlite").is_file() and not _same(path, store.root):
            n = len(pending(path, store))
            if n:
                found.append({"path": path, "runs": n})
    return found


def import_store(source: str | Path, store) -> dict:
    """Copy every run (its row, metrics and weights folder), sweep and upload of the store at
    ``source`` into ``store`` that ``store`` does not have yet; returns the counts
    ``{"source", "runs", "sweeps", "uploads", "skipped"}``. The source is only read. Runs still
    training there (their process alive) are skipped: import again once they end."""
    from attn_core.runs.store import RunStore

    source = Path(source).expanduser()
    if not (source / "index.sqlite").is_file():
        raise ValueError(f"{source} is not a run store (it has no index.sqlite)")
    if _same(source, store.root):
        raise ValueError(f"{source} is the current run store (${ENV_RUNS} or the default); nothing to import")
    old = RunStore(source)
    with old._db() as con:
        tables = old.index.tables(con)
        runs = con.execute("SELECT * FROM runs").fetchall() if "runs" in tables else []
        sweeps = con.execute("SELECT * FROM sweeps").fetchall() if "sweeps" in tables else []
    mine = {r["id"] for r in store.list_runs()}
    my_sweeps = {s["id"] for s in store.list_sweeps()}
    counts = {"source": str(source), "runs": 0, "sweeps": 0, "uploads": 0, "skipped": 0}
    store.check_writable()
    with store._db(write=True) as con:
        run_cols = store.index.columns(con, "runs")
        sweep_cols = store.index.columns(con, "sweeps")
    for s in sweeps:
        if s["id"] in my_sweeps:
            continue
        _insert(store, "sweeps", {k: s[k] for k in s.keys() if k in sweep_cols})
        counts["sweeps"] += 1
    for r in runs:
        row = old._row(r)  # an orphan of a dead process reads as it ended
        if r["id"] in mine or row["status"] == "running":
            counts["skipped"] += 1
            continue
        run_id = check_run_id(r["id"])
        if (source / run_id).is_dir():
            _copy_folder(source / run_id, store.root / run_id)
        values = {k: r[k] for k in r.keys() if k in run_cols}
        values.update(status=row["status"], message=row["message"])
        with old._db() as con:
            metrics = con.execute("SELECT step, name, value FROM metrics WHERE run = ?", (run_id,)).fetchall()
        _insert(store, "runs", values, [(run_id, *tuple(m)) for m in metrics])
        counts["runs"] += 1
    counts["uploads"] = _copy_uploads(source / UPLOADS, store.root / UPLOADS)
    return counts


def _insert(store, table: str, values: dict, metrics: list[tuple] = ()) -> None:
    cols = list(values)
    with store._db(write=True) as con:
        con.execute(
            f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})",
            [values[c] for c in cols],
        )
        con.executemany("INSERT INTO metrics (run, step, name, value) VALUES (?, ?, ?, ?)", metrics)


def _copy_folder(src: Path, dest: Path) -> None:
    """``src`` copied to ``dest`` through a temporary sibling renamed into place; an existing
    ``dest`` is kept (never overwritten)."""
    if dest.exists():
        return
    tmp = dest.with_name(destinations.tmp_prefix(dest.name) + "import")
    try:
        shutil.copytree(src, tmp, symlinks=False)
        tmp.rename(dest)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunStoreError(f"the run store {dest.parent} cannot be written: {e.strerror or e}") from None


def _copy_uploads(src: Path, dest: Path) -> int:
    if not src.is_dir():
        return 0
    n = 0
    for folder in sorted(src.iterdir()):
        if folder.is_dir() and not folder.name.startswith(".") and not (dest / folder.name).exists():
            dest.mkdir(parents=True, exist_ok=True)
            _copy_folder(folder, dest / folder.name)
            n += 1
    return n
