"""A sweep in a user's own store on a shared server (attn_core.runs.users): its trials are Ray
worker processes where no one is logged in, so they read the sweep's model (``run:<id>``) from
the store the sweep was given, never the machine's; and a waiting sweep of a server that is gone,
adopted by a new server's queue keeper (a thread of no session), runs in its owner's store."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from attn_core import checkpoint
from attn_core.retraining.job import TrainingJob
from attn_core.runs import RunStore, RunStoreError, users
from attn_core.runs.names import scope_roots
from attn_core.training.config import JobConfig
from attn_core.training.queue import JobQueue
from tests.conftest import make_tiny_model

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # starts a local Ray: one test worker runs these in turn (tests/conftest.py)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.fixture
def alice(tmp_path, monkeypatch):
    """Alice's store on a shared server, with a run of hers to sweep; every store call outside her
    session refuses, as the dashboard's shared mode makes it (ui/access.py)."""
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "machine"))
    monkeypatch.setenv("ATTN_LAB_MAX_JOBS", "1")
    folder = users.open_store({"iss": "https://id.lab.example", "sub": "alice"})
    tiny = checkpoint.save(make_tiny_model(), tmp_path / "tiny", {"task": "reverse", "train": {"batch_size": 8}})
    parent = TrainingJob.open(JobConfig(str(tiny), {}, steps=2, device="cpu"), store=RunStore(folder)).start()
    assert parent.join(120) and parent.snapshot().status == "completed"
    yield folder, parent.run_id
    scope_roots(None)


def nobody():
    raise RunStoreError("no logged-in user acts here: on a shared server every run store belongs to one user")


def test_a_sweep_of_a_users_own_run_trains_its_trials_from_her_store(local_ray, alice):
    from attn_core.sweep import grid_plan, run_sweep, start_sweep

    folder, run_id = alice
    scope_roots(lambda: folder)  # her session: every RunStore() is hers (not in the Ray workers)
    store = RunStore()
    sweep_id, _ = start_sweep(grid_plan(f"run:{run_id}", ["entropy=0.5"], baseline=False, steps=2), store)
    result = run_sweep(None, RunStore(folder), sweep_id=sweep_id, keep_ray=True)
    sweep = store.get_sweep(sweep_id)
    assert sweep["status"] == "completed", sweep["message"]
    assert result["trials"] and all(t["status"] == "completed" for t in result["trials"]), result["trials"]


def test_a_waiting_sweep_adopted_after_a_restart_runs_in_its_owners_store(local_ray, alice):
    from attn_core.sweep import grid_plan, start_sweep
    from attn_core.training import queue_keeper

    folder, run_id = alice
    scope_roots(lambda: folder)
    sweep_id, _ = start_sweep(grid_plan(f"run:{run_id}", ["entropy=0.5"], baseline=False, steps=2), RunStore())
    scope_roots(nobody)  # the server restarted: no one is logged in where the keeper runs
    queue = JobQueue()
    spec = {"sweep_id": sweep_id, "store": str(folder), "cpus": 1.0}
    entry = queue.submit(user=folder.name, kind="sweep", device="cpu", spec=spec, steps=2, target=sweep_id)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(60)
    with queue.index.writer() as con:  # the server that submitted it is gone
        con.execute("UPDATE queue SET pid = ? WHERE id = ?", (gone.pid, entry))
    keeper = threading.Thread(target=queue_keeper.serve, args=(JobQueue(), 0.2))
    keeper.start()
    keeper.join(60)
    end = time.monotonic() + 300
    while queue.get(entry, folder.name)["status"] in ("waiting", "running", "stopping") and time.monotonic() < end:
        time.sleep(0.2)
    done = queue.get(entry, folder.name)
    assert done["status"] == "completed", done["message"]
    sweep = RunStore(folder).get_sweep(sweep_id)
    assert sweep["status"] == "completed", sweep["message"]
    assert RunStore(tmp_machine(folder)).list_sweeps() == []


def tmp_machine(folder):
    return folder.parent.parent  # <machine store>/users/<id>
