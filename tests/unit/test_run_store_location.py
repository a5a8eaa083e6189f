"""One run store per user: the default follows the user (the platform's user data folder), not the
current folder; $ATTN_LAB_RUNS overrides it; `attn-lab runs` says where it is; the `runs/`
folders of older releases are found, offered and copied in by `attn-lab runs import`, never
changed or lost."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attn_core.cli import app
from attn_core.runs import ENV_RUNS, RunStore, default_root, migrate
from attn_core.sources import resolve
from tests.conftest import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def user_data(tmp_path, monkeypatch):
    """No $ATTN_LAB_RUNS; the platform's user data folder under tmp_path."""
    monkeypatch.delenv(ENV_RUNS, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "attn-lab" / "runs"


def a_run(store: RunStore, steps: int = 3) -> str:
    card = {"task": "reverse", "description": "a finished run"}
    return store.add_run(
        "reverse-1l",
        "reverse",
        {"steps": steps, "regularizers": ["entropy=0.1"]},
        "completed",
        "completed 3 steps",
        model=make_tiny_model("reverse"),
        card=card,
        summary={"after": {"accuracy": 0.5}},
        metrics=[(0, "loss", 1.0), (1, "loss", 0.5)],
    )


def cli(*args, cwd, env=None):
    """``attn-lab ARGS`` run in folder ``cwd`` (in this process: the CLI's own code path)."""
    here = Path.cwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, [str(a) for a in args], env={ENV_RUNS: None, **(env or {})})
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(args, res.exit_code, res.stdout, res.stderr)


def test_the_default_store_is_the_users_whatever_the_folder(user_data, tmp_path, monkeypatch):
    for folder in (tmp_path / "a", tmp_path / "b"):
        folder.mkdir()
        monkeypatch.chdir(folder)
        assert default_root() == user_data and RunStore().root == user_data
    monkeypatch.setenv(ENV_RUNS, str(tmp_path / "elsewhere"))
    assert RunStore().root == tmp_path / "elsewhere"


def test_runs_made_from_one_folder_are_listed_from_another(user_data, tmp_path):
    run_id = a_run(RunStore())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg")}
    for folder in ("a", "b"):  # real processes started in two folders
        proc = subprocess.run(
            [sys.executable, "-m", "attn_core", "runs", "--json"],
            cwd=tmp_path / folder,
            env={**{k: v for k, v in os.environ.items() if k != ENV_RUNS}, **env, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        assert [r["id"] for r in json.loads(proc.stdout)] == [run_id]
    human = cli("runs", cwd=tmp_path / "a", env=env).stdout
    assert human.splitlines()[0] == f"run store: {user_data} (this user's default; ${ENV_RUNS} chooses another)"
    custom = cli("runs", cwd=tmp_path / "a", env={**env, ENV_RUNS: str(tmp_path / "mine")}).stdout
    assert custom.splitlines()[0] == f"run store: {tmp_path / 'mine'} (set by ${ENV_RUNS})"


def _fingerprint(folder: Path) -> dict:
    """Every file's hash, but SQLite's -wal/-shm files, which any reader of a WAL index makes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*")
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


def test_an_old_runs_folder_is_offered_and_imported_never_changed(user_data, tmp_path):
    work = tmp_path / "work"
    old = RunStore(work / "runs")  # where an older release kept the runs made from this folder
    ids = [a_run(old), a_run(old)]
    old.close()
    (work / "runs" / "uploads" / "mine-abc").mkdir(parents=True)
    (work / "runs" / "uploads" / "mine-abc" / "model.safetensors").write_bytes(b"x")
    before = _fingerprint(work / "runs")
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg")}

    listing = cli("runs", cwd=work, env=env).stdout
    assert f"note: 2 run(s) in {work / 'runs'}" in listing and f"attn-lab runs import {work / 'runs'}" in listing

    proc = cli("runs", "import", "runs", "--json", cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["runs"], doc["uploads"], doc["skipped"], doc["store"]) == (2, 1, 0, str(user_data))
    store = RunStore()
    assert sorted(r["id"] for r in store.list_runs()) == sorted(ids)
    assert list(store.metrics(ids[0])["value"]) == [1.0, 0.5]
    assert resolve(f"run:{ids[0]}").config == make_tiny_model("reverse").cfg  # the weights came too
    assert (user_data / "uploads" / "mine-abc" / "model.safetensors").read_bytes() == b"x"
    assert "note:" not in cli("runs", cwd=work, env=env).stdout  # nothing left to offer

    again = json.loads(cli("runs", "import", "runs", "--json", cwd=work, env=env).stdout)
    assert (again["runs"], again["skipped"]) == (0, 2)
    assert _fingerprint(work / "runs") == before  # the old store is only read


def test_import_never_overwrites_a_run_already_here(user_data, tmp_path):
    old = RunStore(tmp_path / "old")
    run_id = a_run(old)
    store = RunStore()
    store.root.mkdir(parents=True)
    (store.root / run_id).mkdir()
    (store.root / run_id / "keep.txt").write_text("mine")
    counts = migrate.import_store(tmp_path / "old", store)
    assert counts["runs"] == 1
    assert (store.root / run_id / "keep.txt").read_text() == "mine"  # the folder here is kept as it was
    with pytest.raises(ValueError, match="current run store"):
        migrate.import_store(store.root, store)
    with pytest.raises(ValueError, match="not a run store"):
        migrate.import_store(tmp_path, store)


def test_import_of_a_missing_store_is_one_line(user_data, tmp_path):
    proc = cli("runs", "import", tmp_path / "nowhere", cwd=tmp_path, env={"XDG_DATA_HOME": str(tmp_path / "xdg")})
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and len(proc.stderr.splitlines()) == 1
