"""The line of training jobs of one process (a dashboard server): at most ATTN_LAB_MAX_JOBS train
at once, the others wait first come first served and say how many jobs are ahead; a job stopped
while it waits ends without training; a mis-set limit is one clear error."""

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attn_core import checkpoint
from attn_core.retraining.job import TrainingJob
from attn_core.runs import RunStore
from attn_core.training.config import JobConfig
from attn_core.training.slots import ENV_MAX_JOBS, JobSlots, max_jobs, queued_message
from tests.conftest import make_tiny_model


@pytest.fixture
def tiny_folder(tmp_path):
    return checkpoint.save(make_tiny_model(), tmp_path / "tiny", {"task": "reverse", "train": {"batch_size": 8}})


@pytest.mark.parametrize("raw", ["0", "-1", "65", "two", "1.5", "1e3", "nan"])
def test_a_mis_set_limit_is_one_clear_error(monkeypatch, raw):
    monkeypatch.setenv(ENV_MAX_JOBS, raw)
    with pytest.raises(ValueError, match=f"{ENV_MAX_JOBS} must be a whole number from 1 to 64.*{raw!r}"):
        max_jobs()
    with pytest.raises(ValueError, match=ENV_MAX_JOBS):
        JobSlots().ticket()


def test_the_limit_follows_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_MAX_JOBS, " 3 ")
    assert max_jobs() == 3
    monkeypatch.setenv(ENV_MAX_JOBS, "")
    assert max_jobs() == 1


@given(limit=st.integers(1, 4), jobs=st.integers(1, 9))
def test_jobs_ahead_first_come_first_served(limit, jobs):
    slots = JobSlots(limit=lambda: limit)
    tickets = [slots.ticket() for _ in range(jobs)]
    assert [slots.ahead(t) for t in tickets] == [max(0, i - limit + 1) for i in range(jobs)]
    for t in tickets[:limit]:  # the first ones take their slots at once
        assert slots.wait(t, cancelled=lambda: False)
    assert slots.counts() == (min(limit, jobs), max(0, jobs - limit))
    if jobs > limit:  # one ends: every waiting job moves up one place
        slots.release(tickets[0])
        assert [slots.ahead(t) for t in tickets[limit:]] == [i for i in range(jobs - limit)]


def test_a_waiting_job_starts_when_one_ends_and_a_cancelled_one_leaves():
    slots = JobSlots(limit=lambda: 1)
    first, second, third = slots.ticket(), slots.ticket(), slots.ticket()
    assert slots.wait(first, cancelled=lambda: False)
    seen, got = [], {}
    stop_third = threading.Event()

    def waiter(name, ticket, cancelled):
        got[name] = slots.wait(ticket, cancelled, on_wait=seen.append, poll_s=0.01)

    t2 = threading.Thread(target=waiter, args=("second", second, lambda: False))
    t3 = threading.Thread(target=waiter, args=("third", third, stop_third.is_set))
    t2.start()
    t3.start()
    stop_third.set()
    t3.join(30)
    assert got["third"] is False and slots.counts() == (1, 1)
    slots.release(first)
    t2.join(30)
    assert got["second"] is True and slots.counts() == (1, 0)
    assert 1 in seen  # the second was told it had one job ahead
    assert queued_message(1).startswith("queued: 1 job ahead") and queued_message(2).startswith("queued: 2 jobs")


def test_a_job_queued_behind_another_waits_then_trains(tmp_path, tiny_folder):
    """Two real jobs in one line of one slot: the second says it is queued with one job ahead,
    then trains once the first has ended; a third stopped while queued ends stopped, untrained."""
    store = RunStore(tmp_path / "runs")
    slots = JobSlots(limit=lambda: 1)
    cfg = JobConfig(str(tiny_folder), {"entropy": 0.1}, steps=10**6, device="cpu")
    first = TrainingJob.open(cfg, store=store, slots=slots).start()
    second = TrainingJob.open(JobConfig(str(tiny_folder), {}, steps=3, device="cpu"), store=store, slots=slots).start()
    third = TrainingJob.open(JobConfig(str(tiny_folder), {}, steps=3, device="cpu"), store=store, slots=slots).start()
    try:
        snap = second.snapshot()
        assert snap.status == "queued" and snap.message.startswith("queued: 1 job ahead")
        assert third.snapshot().message.startswith("queued: 2 jobs ahead")
        third.stop()
        assert third.join(60)
        assert third.snapshot().status == "stopped" and "while queued" in third.snapshot().message
        assert third.run_id is None and third.snapshot().step == 0
        assert not second.join(0.5) and second.snapshot().status == "queued"
    finally:
        first.stop()
        assert first.join(120)
    assert second.join(120)
    assert second.result()["status"] == "completed" and second.result()["steps"] == 3
    assert {r["id"] for r in store.list_runs()} == {first.run_id, second.run_id}
