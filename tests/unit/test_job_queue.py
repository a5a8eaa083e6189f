"""The server's durable job queue (attn_core/training/queue.py), in the run store's SQLite: fair
between users (hypothesis properties of the order), per-device bound, per-user limits refused
with one sentence, owner checks, cancel while waiting and while running, the wall time limit,
a restart (a new queue object; a real server process killed with jobs queued: its running entry
becomes interrupted, its waiting one runs once in the next process), and no double claim by
threads or processes racing on one store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_core import checkpoint
from attn_core.retraining.job import TrainingJob
from attn_core.runs import RunStore, RunStoreError
from attn_core.training.config import JobConfig
from attn_core.training.queue import JobQueue
from attn_core.training.queue_rules import ENV_JOB_WALL_S, ENV_USER_JOBS, ENV_USER_STEPS, fair_order
from attn_core.training.slots import running_jobs
from tests.conftest import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]


def wait_for(pred, timeout=120.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def tiny(tmp_path):
    return str(checkpoint.save(make_tiny_model(), tmp_path / "tiny", {"task": "reverse", "train": {"batch_size": 8}}))


def ended(queue, entry, user=""):
    """The entry once its job has written its outcome (just after the job's own end)."""
    assert wait_for(lambda: queue.get(entry, user, admin=True)["status"] not in ("waiting", "running", "stopping"))
    return queue.get(entry, user)


def q(tmp_path, limit=1) -> JobQueue:
    return JobQueue(tmp_path / "runs", limit=lambda: limit)


def submit(queue, user="", device="cpu", **kw) -> int:
    return queue.submit(user=user, kind="retrain", device=device, spec={"n": 1}, **kw)


# --- the order ------------------------------------------------------------------------------------
entries_st = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 5)), min_size=0, max_size=25)
running_st = st.dictionaries(st.sampled_from("abcd"), st.integers(0, 3))


def as_entries(raw):
    return [{"id": i, "user": u, "enqueued": float(t)} for i, (u, t) in enumerate(raw)]


def turns(entries, running):
    """Each entry's turn: its owner's running jobs plus its rank among the owner's waiting entries."""
    seen, out = Counter(), {}
    for e in sorted(entries, key=lambda e: (e["enqueued"], e["id"])):
        out[e["id"]] = running.get(e["user"], 0) + seen[e["user"]]
        seen[e["user"]] += 1
    return out


@given(raw=entries_st, running=running_st)
def test_the_order_is_every_waiting_entry_each_users_own_first_come_first_served(raw, running):
    entries = as_entries(raw)
    order = fair_order(entries, running)
    assert sorted(e["id"] for e in order) == [e["id"] for e in entries]
    for user in "abcd":
        mine = [e for e in order if e["user"] == user]
        assert mine == sorted(mine, key=lambda e: (e["enqueued"], e["id"]))


@given(raw=entries_st, running=running_st)
def test_no_entry_waits_behind_one_of_a_later_turn(raw, running):
    entries = as_entries(raw)
    order, turn = fair_order(entries, running), turns(entries, running)
    assert [turn[e["id"]] for e in order] == sorted(turn[e["id"]] for e in order)


@given(raw=entries_st, running=running_st, newcomer=st.sampled_from("abcd"), late=st.integers(0, 10))
def test_a_users_first_job_waits_behind_at_most_one_of_each_other_user(raw, running, newcomer, late):
    """One user's ten jobs do not wait ahead of another's first: a user with nothing running
    or waiting who submits one job has at most one job of each other user ahead of it."""
    entries = [e for e in as_entries(raw) if e["user"] != newcomer]
    running = {u: n for u, n in running.items() if u != newcomer}
    mine = {"id": 99, "user": newcomer, "enqueued": 5.0 + late}
    order = fair_order([*entries, mine], running)
    ahead = order[: order.index(mine)]
    assert all(n <= 1 for n in Counter(e["user"] for e in ahead).values())
    assert all(running.get(e["user"], 0) == 0 for e in ahead)


def test_ten_jobs_of_one_user_do_not_wait_ahead_of_anothers_first(tmp_path):
    queue = q(tmp_path)
    alice = [submit(queue, "alice") for _ in range(10)]
    bob = submit(queue, "bob")
    assert queue.claim(alice[0])  # alice trains one; bob's first is next, then alice's others
    assert queue.get(bob, "bob")["ahead"] == 1 and queue.get(bob, "bob")["place"] == 1
    assert [e["id"] for e in queue.entries("", admin=True) if e["status"] == "waiting"][:2] == [bob, alice[1]]


def test_the_bound_is_per_device(tmp_path):
    queue = q(tmp_path, limit=1)
    cpu, gpu, cpu2 = submit(queue), submit(queue, device="cuda"), submit(queue)
    assert queue.claim(cpu) and queue.claim(gpu)  # "cuda" is cuda:0, a device of its own
    assert not queue.claim(cpu2) and queue.get(cpu2, "")["ahead"] == 1
    assert queue.get(gpu, "")["device"] == "cuda:0"
    queue.release(cpu)
    assert queue.claim(cpu2)


def test_the_wait_is_said_as_a_range_from_the_estimates_ahead(tmp_path):
    queue = q(tmp_path)
    first = submit(queue, estimate_s=60.0)
    second, third = submit(queue, estimate_s=60.0), submit(queue, estimate_s=30.0)
    assert queue.claim(first)
    low, high = queue.get(third, "")["wait"]
    assert 0 < low < high
    assert queue.get(second, "")["wait"][0] < low  # one job fewer ahead: a shorter wait (low: load-free)
    text = queue.describe(third)
    assert text.startswith("queued: 2 jobs ahead, 2nd in line") and "ATTN_LAB_MAX_JOBS" in text
    assert "estimated wait" in text and "a range" in text
    unknown = submit(queue)  # no estimate of its own, but those ahead have one
    assert queue.get(unknown, "")["wait"] is not None
    after = submit(queue)
    assert queue.get(after, "")["wait"] is None and "estimated wait" not in queue.describe(after)


# --- limits and owners ------------------------------------------------------------------------------
def test_per_user_limits_refuse_at_submit_naming_the_setting(tmp_path, monkeypatch):
    queue = q(tmp_path)
    monkeypatch.setenv(ENV_USER_JOBS, "2")
    monkeypatch.setenv(ENV_USER_STEPS, "1000")
    with pytest.raises(
        ValueError, match=rf"^steps 1,001 is over the limit of 1,000 steps per job \({ENV_USER_STEPS}\)$"
    ):
        submit(queue, "ann", steps=1001)
    first, _ = submit(queue, "ann", steps=1000), submit(queue, "ann")
    with pytest.raises(ValueError, match=rf"you already have 2 jobs waiting or running.*\({ENV_USER_JOBS}=2\)"):
        submit(queue, "ann")
    submit(queue, "ben")  # another user's count is their own
    queue.cancel(first, "ann")
    submit(queue, "ann")  # a cancelled job no longer counts
    monkeypatch.setenv(ENV_USER_JOBS, "lots")
    with pytest.raises(ValueError, match=f"^{ENV_USER_JOBS} must be a whole number from 1 to"):
        submit(queue, "ann")


def test_bad_arguments_are_one_sentence(tmp_path):
    queue = q(tmp_path)
    with pytest.raises(ValueError, match="kind must be one of retrain, sweep"):
        queue.submit(user="", kind="other", device="cpu", spec={})
    with pytest.raises(TypeError, match="user must be a string"):
        queue.submit(user=None, kind="retrain", device="cpu", spec={})
    with pytest.raises(TypeError):
        queue.submit(user="", kind="retrain", device="cpu", spec={"f": object()})  # JSON only, never pickle
    with pytest.raises(KeyError, match="there is no queue entry 12345"):
        queue.get(12345, "")


def test_another_users_entry_is_refused_unless_admin(tmp_path):
    queue = q(tmp_path)
    ann, ben = submit(queue, "ann"), submit(queue, "ben")
    with pytest.raises(PermissionError, match=f"^queue entry {ann} belongs to another user"):
        queue.cancel(ann, "ben")
    with pytest.raises(PermissionError, match="belongs to another user"):
        queue.get(ann, "ben")
    assert [e["id"] for e in queue.entries("ben")] == [ben]
    assert {e["id"] for e in queue.entries("eve", admin=True)} == {ann, ben}
    assert queue.get(ann, "ann")["status"] == "waiting"
    assert queue.cancel(ann, "root", admin=True) == "cancelled"
    assert queue.get(ann, "ann")["message"] == "cancelled by an admin while it waited"


# --- cancel and the wall time -------------------------------------------------------------------------
def test_cancel_while_waiting_ends_the_wait_and_while_running_stops_the_job(tmp_path):
    queue = q(tmp_path)
    first, second = submit(queue, "ann"), submit(queue, "ann")
    assert queue.claim(first)
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("w", queue.wait(second, lambda: False, poll_s=0.01)))
    waiter.start()
    assert queue.cancel(second, "ann") == "cancelled"
    waiter.join(60)
    assert got["w"] is False and queue.get(second, "ann")["status"] == "cancelled"
    stopped, done = [], threading.Event()
    queue.watch(first, lambda why: (stopped.append(why), done.set()), done.is_set)
    assert JobQueue(tmp_path / "runs").cancel(first, "ann") == "stopping"  # from any queue object
    assert wait_for(done.is_set) and stopped[0] == "cancelled by its owner"
    queue.release(first, "stopped", "stopped at step 3 of 10 (cancelled by its owner)")
    assert queue.get(first, "ann")["status"] == "stopped"
    with pytest.raises(ValueError, match=f"queue entry {first} has already ended \\(stopped\\)"):
        queue.cancel(first, "ann")


def test_a_real_job_cancelled_while_waiting_never_trains_and_one_cancelled_running_stops(tmp_path, tiny):
    queue, store = q(tmp_path), RunStore(tmp_path / "runs")
    first = TrainingJob.open(JobConfig(tiny, {}, steps=10**6, device="cpu"), store=store, slots=queue).start()
    second = TrainingJob.open(JobConfig(tiny, {}, steps=3, device="cpu"), store=store, slots=queue, user="").start()
    try:
        assert second.snapshot().status == "queued" and second.snapshot().message.startswith("queued: 1 job ahead")
        assert queue.cancel(second._ticket, "") == "cancelled"
        assert second.join(60) and second.snapshot().status == "stopped" and second.run_id is None
        assert "cancelled while queued" in second.snapshot().message
        assert wait_for(lambda: first.snapshot().step > 0)
        assert queue.cancel(first._ticket, "") == "stopping"  # running: it stops after its step
        assert first.join(120)
        assert first.snapshot().status == "stopped" and "(cancelled by its owner)" in first.snapshot().message
    finally:
        first.stop()
        assert first.join(120)
    entry = ended(queue, first._ticket)
    assert entry["status"] == "stopped" and entry["target"] == first.run_id
    assert [r["id"] for r in store.list_runs()] == [first.run_id]


def test_the_wall_time_limit_stops_a_running_job_and_says_so(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv(ENV_JOB_WALL_S, "1")
    queue, store = q(tmp_path), RunStore(tmp_path / "runs")
    job = TrainingJob.open(JobConfig(tiny, {}, steps=10**6, device="cpu"), store=store, slots=queue).start()
    assert job.join(120)
    snap = job.snapshot()
    assert (
        snap.status == "stopped" and f"the wall time limit of 1 s per job was reached, {ENV_JOB_WALL_S}" in snap.message
    )
    assert ended(queue, job._ticket)["status"] == "stopped"
    assert store.get(job.run_id)["status"] == "stopped"


# --- restarts and races --------------------------------------------------------------------------------
def test_waiting_entries_survive_a_new_queue_object(tmp_path):
    queue = q(tmp_path)
    first, second = submit(queue, "ann", estimate_s=5.0), submit(queue, "ben")
    assert queue.claim(first)
    again = JobQueue(tmp_path / "runs", limit=lambda: 1)
    assert again.get(second, "ben")["status"] == "waiting" and again.get(second, "ben")["ahead"] == 1
    assert again.reap() == [] and again.adopt() == []  # this process lives: nothing is taken over
    assert not again.claim(second)
    again.release(first)
    assert again.claim(second) and not queue.claim(second)


SERVER = """
import sys, time
from attn_core.runs import RunStore, RunStoreError
from attn_core.training.config import JobConfig
from attn_core.retraining.job import TrainingJob
from attn_core.training.queue import JobQueue
root, tiny = sys.argv[1], sys.argv[2]
queue, store = JobQueue(root), RunStore(root)
long = TrainingJob.open(JobConfig(tiny, {}, steps=10**6, device="cpu"), store=store, slots=queue, user="ann").start()
short = TrainingJob.open(JobConfig(tiny, {}, steps=4, device="cpu"), store=store, slots=queue, user="ben").start()
while long.snapshot().step < 2:
    time.sleep(0.05)
print(long._ticket, short._ticket, long.run_id, flush=True)
time.sleep(600)
"""


def test_a_server_killed_with_jobs_queued_loses_none_and_runs_none_twice(tmp_path, tiny, monkeypatch):
    """A real server process trains one job with another queued and is killed (SIGKILL): in the
    next process the running entry is interrupted (never run again), the waiting one is rebuilt
    from its JSON spec and trains once; a second adopter finds nothing to take."""
    monkeypatch.setenv("ATTN_LAB_MAX_JOBS", "1")
    root = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(root), tiny], stdout=subprocess.PIPE, text=True, env=env)
    try:
        long_entry, short_entry, long_run = proc.stdout.readline().split()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    queue = JobQueue(root)
    assert queue.get(int(short_entry), "ben")["status"] == "waiting"
    spec = json.loads(queue.index.writer().execute("SELECT spec FROM queue WHERE id = ?", (short_entry,)).fetchone()[0])
    assert spec["config"]["steps"] == 4 and spec["store"] == str(root)
    assert queue.reap() == [int(long_entry)]
    long = queue.get(int(long_entry), "ann")
    assert long["status"] == "interrupted" and "not run again by itself" in long["message"]
    (job,) = queue.adopt()
    assert JobQueue(root).adopt() == []  # taken once: another server finds nothing
    assert job.join(120) and job.snapshot().status == "completed" and job.snapshot().step == 4
    short = ended(queue, int(short_entry), "ben")
    assert short["status"] == "completed" and short["target"] == job.run_id and short["pid"] == os.getpid()
    store = RunStore(root)
    statuses = {r["id"]: r["status"] for r in store.list_runs()}
    assert statuses.keys() == {long_run, job.run_id} and statuses[job.run_id] == "completed"
    assert statuses[long_run] not in ("running", "completed")  # the killed run is not shown as live
    assert queue.reap() == [] and queue.adopt() == []  # nothing runs again


def test_threads_racing_for_one_slot_claim_it_once(tmp_path):
    queue = q(tmp_path)
    entries = [submit(queue) for _ in range(3)]
    barrier, won = threading.Barrier(6), []

    def racer():
        mine = JobQueue(tmp_path / "runs", limit=lambda: 1)
        barrier.wait()
        won.extend(e for e in entries for _ in [0] if mine.claim(e))

    threads = [threading.Thread(target=racer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert won == [entries[0]]  # one slot: the first entry, by one thread


CLAIMER = """
import sys
from attn_core.training.queue import JobQueue
queue = JobQueue(sys.argv[1], limit=lambda: 64)
print(" ".join(str(e) for e in map(int, sys.argv[2:]) if queue.claim(e)), flush=True)
"""


def test_processes_racing_on_one_store_claim_each_entry_once(tmp_path):
    queue = q(tmp_path, limit=64)
    entries = [str(submit(queue, user=f"u{i % 3}")) for i in range(24)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(tmp_path / "runs"), *(entries if k % 2 else entries[::-1])],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for k in range(4)
    ]
    claimed = [e for p in procs for e in p.communicate(timeout=120)[0].split()]
    assert sorted(claimed, key=int) == entries  # every entry once, none twice


def test_a_broken_store_is_one_sentence(tmp_path):
    root = tmp_path / "broken"
    root.mkdir()
    (root / "index.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(RunStoreError, match="is not a SQLite database"):
        JobQueue(root).entries("")


def test_a_dropped_session_finds_its_job_again_and_no_one_elses(tmp_path, tiny):
    """The job of a session that went away waits (or trains) on in the server: a new session of
    its user finds it (running_jobs), another user's does not, an admin's does."""
    queue = q(tmp_path)
    other = submit(queue)
    assert queue.claim(other)  # the slot is taken: the job waits
    job = TrainingJob.open(JobConfig(tiny, {}, steps=3, device="cpu"), store=False, slots=queue, user="ann").start()
    try:
        assert job in running_jobs("ann") and job not in running_jobs("ben") and job in running_jobs("", admin=True)
        assert [e["id"] for e in queue.entries("ann")] == [job._ticket]
    finally:
        job.stop()
        assert job.join(60)
    assert job not in running_jobs("ann")
    assert ended(queue, job._ticket, "ann")["status"] == "cancelled"


def test_a_sweep_waits_in_the_queue_saying_its_place_and_a_cancel_ends_it_unrun(tmp_path):
    """A sweep of the Sweeps page waits for its queue entry before Ray starts: its record says its
    place; cancelled by its owner, it ends interrupted with nothing run, its entry cancelled."""
    pytest.importorskip("ray")
    from attn_core.sweep import SweepInterrupted, grid_plan, run_sweep, start_sweep

    store, queue = RunStore(tmp_path / "runs"), q(tmp_path)
    assert queue.claim(submit(queue))  # another job holds the CPU
    sweep_id, _ = start_sweep(grid_plan("reverse-1l", ["entropy=0.5"], baseline=False, steps=2), store)
    entry = queue.submit(user="ann", kind="sweep", device="cpu", spec={"sweep_id": sweep_id}, target=sweep_id)
    got = {}

    def sweep():
        try:
            run_sweep(None, RunStore(store.root), sweep_id=sweep_id, queue=queue, entry=entry)
        except BaseException as e:  # noqa: BLE001 -- checked below
            got["error"] = e

    thread = threading.Thread(target=sweep)
    thread.start()
    assert wait_for(lambda: store.get_sweep(sweep_id)["message"].startswith("queued: 1 job ahead, 1st in line"))
    assert queue.cancel(entry, "ann") == "cancelled"
    thread.join(120)
    assert isinstance(got["error"], SweepInterrupted) and "nothing was run" in str(got["error"])
    assert store.get_sweep(sweep_id)["status"] == "interrupted" and queue.get(entry, "ann")["status"] == "cancelled"


def test_a_shared_servers_waiting_entry_adopted_after_a_restart_trains_in_its_owners_store(tmp_path, tiny, monkeypatch):
    """Shared mode: every store call outside a logged-in session refuses (the dashboard's scope).
    A waiting entry of user A, left by a server that is gone, is adopted by a new keeper thread
    where no one is logged in: its job is rebuilt in A's store (its parent ``run:<id>`` found
    there, not in the machine's store), trains once and lands in A's store alone."""
    from attn_core.runs import users
    from attn_core.runs.names import scope_roots
    from attn_core.training import queue_keeper

    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "machine"))
    monkeypatch.setenv("ATTN_LAB_MAX_JOBS", "1")
    alice = users.open_store({"iss": "https://id.lab.example", "sub": "alice"})
    mine = RunStore(alice)
    parent = TrainingJob.open(JobConfig(tiny, {}, steps=2, device="cpu"), store=mine).start()
    assert parent.join(120) and parent.snapshot().status == "completed"

    def nobody():
        raise RunStoreError("no logged-in user acts here: on a shared server every run store belongs to one user")

    scope_roots(nobody)
    try:
        queue = JobQueue()
        cfg = JobConfig(f"run:{parent.run_id}", {}, steps=3, device="cpu")
        spec = {"config": cfg.to_dict(), "store": str(alice), "process": True, "threads": None, "keep_ray": False}
        entry = queue.submit(user=alice.name, kind="retrain", device="cpu", spec=spec, steps=3)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait(60)
        with queue.index.writer() as con:  # the server that submitted it is gone
            con.execute("UPDATE queue SET pid = ? WHERE id = ?", (gone.pid, entry))
        keeper = threading.Thread(target=queue_keeper.serve, args=(JobQueue(), 0.2))  # a thread of no session
        keeper.start()
        keeper.join(60)
        done = ended(queue, entry, alice.name)
    finally:
        scope_roots(None)
    assert done["status"] == "completed", done["message"]
    assert {r["id"] for r in mine.list_runs()} == {parent.run_id, done["target"]}
    assert mine.get(done["target"])["status"] == "completed"
    assert RunStore(tmp_path / "machine").list_runs() == []
