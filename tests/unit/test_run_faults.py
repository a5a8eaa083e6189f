"""Faults around a run, made for real: Ctrl-C (SIGINT) sent to a real `attn-lab retrain`, a corrupt
index (garbage bytes), a read-only store (chmod, and a process that cannot override it), a full
disk (RLIMIT_FSIZE in the child: writes past the limit fail with EFBIG), and destinations that
cannot be written. Each ends with one clear line, the true reason, a non-zero exit where the run
failed, and nothing trained lost."""

import ctypes
import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attn_core import checkpoint, destinations
from attn_core.cli import app
from attn_core.runs import ENV_RUNS, RunStore
from attn_core.sources import resolve
from tests.conftest import make_tiny_model

# prctl(2) and capabilities(7): a process's bounding set, and the capabilities that let root
# ignore file modes
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER = 24, 1, 2, 3


@pytest.fixture
def tiny(tmp_path):
    card = {"task": "reverse", "train": {"batch_size": 8}}
    return str(checkpoint.save(make_tiny_model(), tmp_path / "tiny", card))


def cli(*args, env=None, limit_bytes=None, preexec=None, **kw) -> subprocess.Popen:
    """``python -m attn_core ARGS`` as a user starts it from a shell: SIGINT, SIGTERM and SIGHUP at
    their defaults (a test runner in the background ignores SIGINT, one under ``nohup`` SIGHUP, and
    children inherit what is ignored: the command then rightly ignores it too), optionally with
    RLIMIT_FSIZE."""

    def child():
        for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(stop, signal.SIG_DFL)
        if limit_bytes is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
        if preexec is not None:
            preexec()

    return subprocess.Popen(
        [sys.executable, "-m", "attn_core", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=child,
        **kw,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def last_line(text: str) -> str:
    """The last line a command wrote (a library may print a warning before it)."""
    return text.strip().splitlines()[-1] if text.strip() else ""


def wait_until_stepping(store: RunStore, proc: subprocess.Popen, timeout: float = 180) -> dict:
    """Wait (no fixed sleep) until the process's run is in the store with metrics logged."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        runs = store.list_runs()
        if runs and len(store.metrics(runs[0]["id"])) > 0:
            return runs[0]
        time.sleep(0.1)
    proc.kill()
    pytest.fail("the retraining never logged a step")


# --- Ctrl-C ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "as_json, presses, sig",
    [(False, 1, signal.SIGINT), (True, 1, signal.SIGINT), (False, 5, signal.SIGINT)]
    + [(False, 1, signal.SIGTERM), (True, 2, signal.SIGHUP)],
    ids=["progress bar", "json", "pressed 5 times", "SIGTERM", "SIGHUP twice"],
)
def test_ctrl_c_stops_a_retrain_and_keeps_what_it_trained(tiny, tmp_path, as_json, presses, sig):
    """Ctrl-C, and as it SIGTERM (a kill) and SIGHUP (a closed terminal): the run stops after
    the current step and is saved as stopped; the exit status is 128 + the signal."""
    store = RunStore(tmp_path / "runs")
    proc = cli("retrain", tiny, "--steps", 500_000, *(["--json"] if as_json else []), env={ENV_RUNS: str(store.root)})
    try:
        running = wait_until_stepping(store, proc)
        assert running["status"] == "running"
        for _ in range(presses):  # later presses may land while it saves, reports or exits
            proc.send_signal(sig)
            time.sleep(0.02)
        code, out, err = finish(proc)
    finally:
        proc.kill()
    assert code == 128 + sig, err
    name = "Ctrl-C" if sig == signal.SIGINT else sig.name
    assert f"{name}: stopping after the current step and saving" in err
    assert "terminate called" not in err and "Traceback" not in err
    [run] = store.list_runs()
    assert run["id"] == running["id"] and run["status"] == "stopped" and run["has_weights"]
    assert run["message"].startswith("stopped at step ")
    if as_json:
        doc = json.loads(out)
        assert doc["status"] == "stopped" and doc["run_id"] == run["id"] and doc["steps"] > 0
    else:
        assert f"run {run['id']}: stopped" in out
    loaded = resolve(f"run:{run['id']}", store=store)  # the weights so far load
    assert loaded.card.status == "stopped" and 0 < loaded.card.steps < 500_000
    # the raw index says stopped too (not only the listing's view of a dead process)
    with sqlite3.connect(store.db_path) as con:
        assert con.execute("SELECT status FROM runs").fetchone()[0] == "stopped"


def test_a_run_started_without_a_handler_keeps_its_weights_on_keyboard_interrupt(tiny, tmp_path):
    """TrainingJob.run() in a script's main thread: Ctrl-C (KeyboardInterrupt) still saves the
    run as stopped, then propagates."""
    code = (
        "import os, signal, threading\n"
        "from attn_core.runs import RunStore\n"
        "from attn_core.training.config import JobConfig\n"
        "from attn_core.retraining.job import TrainingJob\n"
        f"job = TrainingJob.open(JobConfig({tiny!r}, steps=500_000, device='cpu'), store=RunStore({str(tmp_path / 'r')!r}))\n"
        "def ctrl_c():\n"
        "    while job.snapshot().step < 5: pass\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "threading.Thread(target=ctrl_c, daemon=True).start()\n"
        "try:\n"
        "    job.run()\n"
        "except KeyboardInterrupt:\n"
        "    print('status', job.status)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.returncode == 0 and "status stopped" in proc.stdout, proc.stderr
    [run] = RunStore(tmp_path / "r").list_runs()
    assert run["status"] == "stopped" and "interrupted at step" in run["message"] and run["has_weights"]


# --- a corrupt, read-only or full store -------------------------------------------------------------------------


def test_a_corrupt_index_is_one_clear_line_and_is_left_as_it_is(tiny, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    garbage = os.urandom(4096)
    (root / "index.sqlite").write_bytes(garbage)
    env = {ENV_RUNS: str(root)}
    for args in (["runs"], ["runs", "--json"], ["runs", "show", "abc"], ["retrain", tiny, "--steps", 5]):
        res = CliRunner().invoke(app, args, env=env)
        assert res.exit_code == 2, (args, res.output)
        assert "is not a SQLite database" in last_line(res.stderr) and str(root) in last_line(res.stderr)
        assert "Traceback" not in res.output
    assert (root / "index.sqlite").read_bytes() == garbage  # nothing was written over it
    assert sorted(p.name for p in root.iterdir()) == ["index.sqlite"]  # and nothing trained or saved


def test_listing_never_writes(tmp_path):
    """Listing shows a run of a dead process as failed without writing that (or anything) into
    the index: no WAL pragma, no clean-up UPDATE."""
    store = RunStore(tmp_path / "runs")
    run_id = store.create("p", "reverse", {})
    with sqlite3.connect(store.db_path) as con:
        con.execute("UPDATE runs SET pid = ? WHERE id = ?", (dead_pid(), run_id))
    store.close()
    with sqlite3.connect(store.db_path) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = {p.name: p.read_bytes() for p in store.root.iterdir() if p.is_file()}
    reader = RunStore(store.root)
    [row] = reader.list_runs()
    assert row["status"] == "failed" and "interrupted" in row["message"]
    reader.close()
    assert {p.name: p.read_bytes() for p in store.root.iterdir() if p.is_file() and p.name in before} == before
    with sqlite3.connect(store.db_path) as con:
        assert con.execute("SELECT status FROM runs").fetchone()[0] == "running"
    store.create("p", "reverse", {})  # the next writer records it
    with sqlite3.connect(store.db_path) as con:
        assert con.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0] == "failed"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def as_a_user_file_modes_apply_to() -> None:
    """In a child about to exec: root ignores file modes (CAP_DAC_OVERRIDE and friends); drop
    those capabilities from its bounding set so that, after exec, the modes apply to it too."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            os._exit(77)  # cannot drop them here: the test is skipped, with the reason


@pytest.mark.parametrize("with_wal", [True, False], ids=["WAL pending", "checkpointed"])
def test_a_read_only_store_lists_and_refuses_to_train(tiny, tmp_path, with_wal):
    """chmod -R a-w on the store, and commands run by a process the modes apply to (as root:
    without the capabilities that override them). Listing works; retrain refuses before training."""
    store = RunStore(tmp_path / "runs")
    run_id = store.create("p", "reverse", {"steps": 2})
    store.finish(run_id, "completed", make_tiny_model(), {"task": "reverse"}, message="done")
    if with_wal:  # what a killed writer leaves: commits still in the -wal file
        pending = sqlite3.connect(store.db_path)
        pending.execute("PRAGMA wal_autocheckpoint = 0")
        pending.execute("UPDATE runs SET message = 'done, then noted' WHERE id = ?", (run_id,))
        pending.commit()
    store.close()
    if not with_wal:
        with sqlite3.connect(store.db_path) as con:
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for extra in ("-wal", "-shm"):
            Path(str(store.db_path) + extra).unlink(missing_ok=True)
    files = {p.name: p.read_bytes() for p in store.root.iterdir() if p.is_file()}
    subprocess.run(["chmod", "-R", "a-w", str(store.root)], check=True)
    env = {ENV_RUNS: str(store.root)}
    try:

        def run(*args):
            proc = cli(*args, env=env, preexec=as_a_user_file_modes_apply_to)
            code, out, err = finish(proc)
            if code == 77:
                pytest.skip("running as root without CAP_SETPCAP: file modes cannot be made to apply")
            return code, out, err

        code, out, err = run("runs", "--json")
        assert code == 0, err
        [row] = json.loads(out)
        assert row["id"] == run_id and row["status"] == "completed"
        assert row["message"] == ("done, then noted" if with_wal else "done")
        code, out, err = run("runs", "show", run_id, "--json")
        assert code == 0 and json.loads(out)["status"] == "completed", err
        code, out, err = run("retrain", tiny, "--steps", "5", "--json")
        assert code == 2, (out, err)
        assert "cannot be written" in last_line(err) and str(store.root) in last_line(err)
        assert {p.name: p.read_bytes() for p in store.root.iterdir() if p.is_file() and p.name in files} == files
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(store.root)], check=False)
        if with_wal:
            pending.close()


def test_a_full_disk_fails_the_run_with_its_reason_and_keeps_the_weights(tiny, tmp_path):
    """RLIMIT_FSIZE makes every write past 96 KB fail (EFBIG, as on a full disk): the metric log
    outgrows it mid-run. The run fails (exit 1) with the store's reason, stored as such, and the
    weights trained so far are kept in a rescue folder that the message names."""
    store = RunStore(tmp_path / "runs")
    rescue = tmp_path / "tmp"
    rescue.mkdir()
    env = {ENV_RUNS: str(store.root), "TMPDIR": str(rescue)}
    code, out, err = finish(cli("retrain", tiny, "--steps", 20_000, "--json", env=env, limit_bytes=96 * 1024))
    assert code == 1, err
    doc = json.loads(out)
    assert doc["status"] == "failed" and "cannot be written" in doc["message"]
    assert "interrupted" not in doc["message"]
    assert last_line(err).startswith(f"error: run {doc['run_id']} failed: ") and doc["message"] in last_line(err)
    kept = rescue / "attn-lab-unsaved" / doc["run_id"]
    assert f"its weights were kept in {kept}" in doc["message"]
    loaded = checkpoint.load_path(kept)
    assert loaded.card.status == "failed" and loaded.card.steps > 0
    [run] = store.list_runs()  # the true reason is what the store says (not "interrupted")
    assert run["status"] == "failed" and "cannot be written" in run["message"] and "interrupted" not in run["message"]


def test_a_store_full_from_the_start_refuses_the_job_before_training(tiny, tmp_path):
    store = RunStore(tmp_path / "runs")
    store.create("p", "reverse", {})  # an index exists; any page it writes (4 KB) crosses the limit
    store.close()
    env = {ENV_RUNS: str(store.root), "TMPDIR": str(tmp_path)}
    code, out, err = finish(cli("retrain", tiny, "--steps", 5, "--json", env=env, limit_bytes=1024))
    assert code == 2 and (out == "" or "error" in json.loads(out)), (out, err)
    assert "cannot be written" in last_line(err)
    assert len(store.list_runs()) == 1  # no run was started


# --- destinations checked before the work ------------------------------------------------------------------------


def test_out_destinations_are_checked_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_RUNS, str(tmp_path / "runs"))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    folder = tmp_path / "existing"
    folder.mkdir()
    cases = [
        (["train", "--preset", "reverse-1l", "--out", a_file / "x"], "not a folder"),
        (["train", "--preset", "reverse-1l", "--out", folder], "already exists"),
        (["compare-qk", "--steps", "2", "--seeds", "1", "--out", folder], "already exists"),
        (["compare-qk", "--steps", "2", "--seeds", "1", "--out", a_file / "c.json"], "not a folder"),
    ]
    if Path("/proc/self").is_dir():  # a folder no one can create anything in
        cases.append((["train", "--preset", "reverse-1l", "--out", "/proc/attn-lab-x"], "cannot be written"))
    for args, message in cases:
        res = CliRunner().invoke(app, [str(a) for a in args])
        assert res.exit_code == 2 and message in last_line(res.stderr), (args, res.output)
    assert not (tmp_path / "runs").exists()  # compare-qk stored no run: nothing was trained
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "file"] and not any(folder.iterdir())


def test_check_destination_leaves_nothing_behind(tmp_path):
    target = tmp_path / "a" / "b" / "model"
    assert destinations.check_destination(target) == target
    assert list(tmp_path.iterdir()) == []  # not even the parents


@pytest.mark.parametrize("shape", ["store is a file", "index is a folder"])
def test_a_store_of_the_wrong_kind_is_one_clear_line(tmp_path, shape):
    root = tmp_path / "runs"
    if shape == "store is a file":
        root.write_text("")
        message = "is not a folder"
    else:
        (root / "index.sqlite").mkdir(parents=True)
        message = "index.sqlite is not a file"
    for args in (["runs"], ["runs", "--json"], ["retrain", "reverse-1l", "--steps", "2"]):
        res = CliRunner().invoke(app, args, env={ENV_RUNS: str(root)})
        assert res.exit_code == 2 and message in last_line(res.stderr), (args, res.output)
