"""The run store: index and checkpoints, the data directory, atomic writes and what a killed
process leaves behind."""

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attn_core import checkpoint, destinations
from attn_core.runs import ENV_RUNS, RunStore
from attn_core.sources import LoadedModel, resolve
from attn_core.tasks import get_task
from tests.conftest import make_tiny_model

TASK = get_task("reverse")
ROOT = Path(__file__).resolve().parents[2]
# the runs table of an index written before sweeps (no sweep and trial columns)
OLD_RUNS = """CREATE TABLE runs (id TEXT PRIMARY KEY, parent TEXT, task TEXT, status TEXT NOT NULL,
    message TEXT DEFAULT '', config TEXT NOT NULL, summary TEXT DEFAULT '{}', created REAL NOT NULL,
    updated REAL NOT NULL, finished REAL, pid INTEGER, host TEXT)"""


def finished_run(store: RunStore, status="completed", parent="reverse-1l") -> str:
    run_id = store.create(parent, "reverse", {"regularizers": ["entropy=0.1"], "steps": 2})
    store.log_metrics(run_id, [(1, "loss", 2.5), (2, "loss", 2.0), (2, "entropy_data:L0H1", 0.4)])
    store.finish(
        run_id,
        status,
        make_tiny_model(),
        {"task": "reverse", "parent": parent},
        message=f"{status} for a test",
        summary={"after": {"accuracy": 0.5}},
    )
    return run_id


def test_empty_store_lists_nothing_and_creates_nothing(tmp_path):
    store = RunStore(tmp_path / "nowhere")
    assert store.list_runs() == []
    assert store.metrics("abc").empty
    assert not (tmp_path / "nowhere").exists()
    with pytest.raises(ValueError, match="no run 'abc'.*empty"):
        store.get("abc")


def test_default_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_RUNS, str(tmp_path / "elsewhere"))
    assert RunStore().root == tmp_path / "elsewhere"
    monkeypatch.delenv(ENV_RUNS)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))  # the user's data folder (test_run_store_location.py)
    assert RunStore().root == tmp_path / "xdg" / "attn-lab" / "runs"


def test_round_trip(tmp_path):
    store = RunStore(tmp_path / "runs")
    run_id = finished_run(store)
    [row] = store.list_runs()
    assert row["id"] == run_id and row["parent"] == "reverse-1l" and row["status"] == "completed"
    assert row["config"]["regularizers"] == ["entropy=0.1"] and row["summary"]["after"]["accuracy"] == 0.5
    assert row["created"] and row["finished"] and row["has_weights"]
    df = store.metrics(run_id)
    assert list(df.columns) == ["step", "name", "value"] and len(df) == 3
    assert list(store.metrics(run_id, names=["loss"])["value"]) == [2.5, 2.0]
    loaded = resolve(f"run:{run_id}", store=RunStore(tmp_path / "runs"))
    assert isinstance(loaded, LoadedModel) and loaded.name == f"run:{run_id}"
    assert loaded.card.parent == "reverse-1l" and loaded.card.status == "completed"
    assert loaded.task is TASK
    for k, v in make_tiny_model().state_dict().items():
        assert torch.equal(loaded.model.state_dict()[k], v)
    assert store.get(f"run:{run_id}")["id"] == run_id  # "run:<id>" is accepted where an id is


def test_newest_first_and_delete(tmp_path):
    store = RunStore(tmp_path)
    a = finished_run(store)
    time.sleep(0.01)
    b = finished_run(store, status="stopped")
    assert [r["id"] for r in store.list_runs()] == [b, a]
    store.delete(a)
    assert [r["id"] for r in store.list_runs()] == [b]
    assert not (tmp_path / a).exists() and store.metrics(a).empty


@pytest.mark.parametrize("bad", ["../etc", "a/b", "", ".hidden", "x" * 80])
def test_run_ids_are_checked(tmp_path, bad):
    with pytest.raises(ValueError, match="is not a run id"):
        RunStore(tmp_path).get(bad)


def test_finish_refuses_a_non_final_status(tmp_path):
    store = RunStore(tmp_path)
    run_id = store.create("p", "reverse", {})
    with pytest.raises(ValueError, match="finished run's status"):
        store.finish(run_id, "running", None, {})


def test_run_without_weights_says_why(tmp_path):
    store = RunStore(tmp_path)
    run_id = store.create("p", "reverse", {})
    store.finish(run_id, "failed", None, {}, message="failed at step 1: boom")
    with pytest.raises(ValueError, match="has no saved weights: failed at step 1: boom"):
        resolve(f"run:{run_id}", store=store)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _set_pid(store: RunStore, run_id: str, pid: int) -> None:
    with sqlite3.connect(store.db_path) as con:
        con.execute("UPDATE runs SET pid = ? WHERE id = ?", (pid, run_id))


def test_half_written_run_does_not_break_listing(tmp_path):
    """A save killed mid-way leaves a hidden temporary folder (checkpoint.save writes there,
    then renames) and a row in status 'running' whose process is gone."""
    store = RunStore(tmp_path)
    good = finished_run(store)
    orphan = store.create("reverse-1l", "reverse", {"steps": 100})
    dead = _dead_pid()
    _set_pid(store, orphan, dead)
    tag = destinations._HOST
    half = tmp_path / f".{orphan}{destinations.TMP_MARK}{tag}-{dead}-k1ll3d"  # what save names it
    half.mkdir()
    (half / checkpoint.WEIGHTS).write_bytes(checkpoint.to_safetensors_bytes(make_tiny_model())[:100])  # truncated
    (half / checkpoint.CONFIG).write_text('{"n_layers": 1, ')
    rows = {r["id"]: r for r in store.list_runs()}
    assert set(rows) == {good, orphan}
    assert rows[orphan]["status"] == "failed" and "interrupted" in rows[orphan]["message"]
    assert not rows[orphan]["has_weights"]
    assert resolve(f"run:{good}", store=store).card.status == "completed"
    with pytest.raises(ValueError, match="no saved weights"):
        resolve(f"run:{orphan}", store=store)
    # the next save removes: at once the folder of a dead process of this host; after an hour
    # one named the old way (its process unknown). It keeps a young one of unknown origin (maybe
    # a save in progress elsewhere), one of a live process, and hidden folders that are not ours.
    legacy = tmp_path / f".{orphan}.a1b2c3d4"
    legacy.mkdir()
    notes = tmp_path / ".notes"
    notes.mkdir()
    old = time.time() - 2 * 3600
    for p in (legacy, notes):
        os.utime(p, (old, old))
    young = tmp_path / ".another.tmp123"
    young.mkdir()
    live = tmp_path / f".x{destinations.TMP_MARK}{tag}-{os.getppid()}-abc"
    live.mkdir()
    finished_run(store)
    assert not half.exists() and not legacy.exists()
    assert young.exists() and live.exists() and notes.exists()


def test_a_killed_save_is_cleaned_by_the_next_save_of_that_folder(tmp_path):
    """``train --out X`` killed during its save, then run again: the left-over goes at once."""
    dead = _dead_pid()
    left = tmp_path / f".model{destinations.TMP_MARK}{destinations._HOST}-{dead}-zz"
    left.mkdir()
    checkpoint.save(make_tiny_model(), tmp_path / "model", {"task": "reverse"})
    assert not left.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_killed_after_the_checkpoint_keeps_the_card_status(tmp_path):
    store = RunStore(tmp_path)
    run_id = store.create("reverse-1l", "reverse", {})
    checkpoint.save(make_tiny_model(), store.path(run_id), {"status": "stopped", "message": "stopped at step 7"})
    _set_pid(store, run_id, _dead_pid())
    [row] = store.list_runs()
    assert row["status"] == "stopped" and row["message"] == "stopped at step 7" and row["has_weights"]


def test_killed_training_process(tmp_path):
    """A real process killed (SIGKILL) while it trains: the listing still works, the run is
    reported failed, and nothing half-written is loadable."""
    folder = checkpoint.save(make_tiny_model(), tmp_path / "tiny", {"task": "reverse"})
    env = {**os.environ, ENV_RUNS: str(tmp_path / "runs")}
    code = (
        "from attn_core.training.config import JobConfig\n"
        "from attn_core.retraining.job import TrainingJob\n"
        f"TrainingJob.open(JobConfig({str(folder)!r}, {{'entropy': 0.1}}, steps=10**7, device='cpu')).run()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    store = RunStore(tmp_path / "runs")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            runs = store.list_runs()
            if runs and len(store.metrics(runs[0]["id"])) > 0:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.2)
        else:
            pytest.fail("the training process never logged a metric")
        assert store.list_runs()[0]["status"] == "running"
    finally:
        proc.kill()
        proc.wait()
    [row] = store.list_runs()
    assert row["status"] == "failed" and "interrupted" in row["message"]
    assert len(store.metrics(row["id"])) > 0  # what was flushed is kept
    with pytest.raises(ValueError, match="no saved weights"):
        resolve(f"run:{row['id']}", store=store)


def test_an_index_from_before_sweeps_still_opens(tmp_path):
    """An index.sqlite written before sweeps existed (no sweeps table, no sweep/trial columns) opens:
    the columns and table are added on open, old runs list with sweep None."""
    import sqlite3

    from attn_core.runs import RunStore

    root = tmp_path / "old"
    root.mkdir()
    con = sqlite3.connect(root / "index.sqlite")
    con.executescript(
        OLD_RUNS
        + """;
    CREATE TABLE metrics (run TEXT NOT NULL, step INTEGER NOT NULL, name TEXT NOT NULL, value REAL);
    INSERT INTO runs (id, parent, task, status, config, created, updated, finished)
        VALUES ('old-run', 'reverse-1l', 'reverse', 'completed', '{}', 1, 1, 1);
    """
    )
    con.commit()
    con.close()
    store = RunStore(root)
    (run,) = store.list_runs()
    assert run["id"] == "old-run" and run["sweep"] is None and store.list_sweeps() == []
    sweep_id = store.create_sweep("reverse-1l", {"trials": [{}]})
    rid = store.add_run("reverse-1l", "reverse", {}, "failed", "boom", sweep=sweep_id, trial="t0")
    got = store.get_sweep(sweep_id)
    assert [r["id"] for r in got["runs"]] == [rid] and got["counts"] == {"failed": 1} and got["status"] == "running"
    store.update_sweep(sweep_id, "completed", info={"wall_s": 1.0})
    assert store.list_sweeps()[0]["status"] == "completed" and store.get(rid)["trial"] == "t0"


OPEN_AT_ONCE = """
import os, sys, time
from attn_core.runs import RunStore
root, go, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
open(go + "." + str(os.getpid()), "w").close()  # imported: ready
while not os.path.exists(go):
    time.sleep(0.001)
for i in range(n):  # the processes walk the stores in step: each store is opened by all at once
    RunStore(os.path.join(root, str(i))).check_writable()
"""
STORES = 30


@pytest.mark.parametrize("old", [False, True], ids=["new store", "store from before sweeps"])
def test_processes_opening_a_store_at_once_all_write(tmp_path, old):
    """Processes that open one store at the same moment (a dashboard and the job it starts, two
    jobs) all get it: the schema and its migration are one transaction, so no two of them both
    find the ``sweep`` column missing and both add it ("duplicate column name: sweep"), and the
    switch of an old rollback-journal index to WAL, which SQLite refuses at once ("database is
    locked") while another process holds the write lock, is tried again."""
    root = tmp_path / "runs"
    for i in range(STORES if old else 0):
        (root / str(i)).mkdir(parents=True)
        con = sqlite3.connect(root / str(i) / "index.sqlite")
        con.execute(OLD_RUNS)
        con.commit()
        con.close()
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AT_ONCE, str(root), str(go), str(STORES)],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for _ in range(6)
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.*"))) < len(procs) and time.monotonic() < deadline:
        time.sleep(0.05)  # until every process has imported and waits for the file
    go.touch()
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, "\n".join(errors)
    for i in range(STORES):
        store = RunStore(root / str(i))
        with store._db() as con:
            assert {"sweep", "trial"} <= store.index.columns(con, "runs") and "sweeps" in store.index.tables(con)
