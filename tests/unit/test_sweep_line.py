"""One sweep at a time in a process (attn_core.sweep.line): Ray Tune's registry and runner are
process-wide, and two sweeps of the Sweeps page at once broke each other ("dictionary changed size
during iteration", the sweep ``interrupted`` with 0 trials). A second sweep now waits in line (its
record says so), then runs to the end; one stopped while it waits ends ``interrupted``, nothing run.
Real Ray with 2 CPUs, started and shut down by the test."""

from __future__ import annotations

import threading
import time

import pytest

from attn_core.runs import RunStore
from attn_core.sweep import SweepInterrupted, grid_plan, run_sweep, start_sweep
from attn_core.sweep.line import LINE

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # starts a local Ray: one test worker runs these in turn (tests/conftest.py)
MODEL = "reverse-1l"


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def wait_until(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_second_sweep_waits_for_the_first_then_runs(local_ray):
    store = RunStore()
    plan = grid_plan(MODEL, ["entropy=0.5"], baseline=False, steps=2, measure_samples=64)  # one trial each
    ids = {name: start_sweep(plan, store)[0] for name in "abc"}
    results: dict = {}
    gate, stop_c = threading.Event(), threading.Event()

    def sweep(name: str, **kwargs) -> None:
        try:
            results[name] = run_sweep(None, RunStore(store.root), sweep_id=ids[name], cpus_per_trial=1, **kwargs)
        except BaseException as e:  # noqa: BLE001 -- checked below
            results[name] = e

    # the first sweep holds Tune (its first recorded trial waits on the gate) while two more arrive
    a = threading.Thread(target=sweep, args=("a",), kwargs={"on_trial": lambda run_id, payload: gate.wait(120)})
    b = threading.Thread(target=sweep, args=("b",))
    c = threading.Thread(target=sweep, args=("c",), kwargs={"stop": stop_c.is_set})
    a.start()
    try:
        wait_until(lambda: LINE.counts() == (1, 0), "the first sweep to take its place")
        b.start()
        wait_until(lambda: store.get_sweep(ids["b"])["message"].startswith("queued: 1 sweep "), "b to wait")
        c.start()
        wait_until(lambda: store.get_sweep(ids["c"])["message"].startswith("queued: 2 sweeps "), "c to wait")
        assert store.get_sweep(ids["b"])["status"] == "running" and not store.get_sweep(ids["b"])["runs"]

        stop_c.set()  # Ctrl-C (or the page's stop) while it waits: nothing run, resumable
        c.join(60)
        assert isinstance(results["c"], SweepInterrupted), results.get("c")
        stopped = store.get_sweep(ids["c"])
        assert stopped["status"] == "interrupted" and "waited" in stopped["message"] and not stopped["runs"]
    finally:
        gate.set()
        a.join(180)
        b.join(180)
    for name in "ab":
        assert not isinstance(results[name], BaseException), results[name]
        assert results[name]["status"] == "completed", results[name]["message"]
        assert [t["status"] for t in results[name]["trials"]] == ["completed"]
    assert LINE.counts() == (0, 0)  # every place left
