"""Two sweeps of one process share the local Ray it started (the Sweeps page can start a second
sweep while the first runs): the first to end must not shut Ray down under the other; the last
user shuts it down. Real Ray, started with 2 CPUs and shut down by the test's own sessions."""

from __future__ import annotations

import logging
import os
import threading

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # starts a local Ray: one test worker runs these in turn (tests/conftest.py)

from attn_core import cluster  # noqa: E402
from attn_core.sweep import ray_backend as rb  # noqa: E402


@ray.remote(num_cpus=1)
def _answer() -> int:
    return 42


def test_the_second_sweep_keeps_ray_up_after_the_first_ends():
    if ray.is_initialized():  # pragma: no cover - another test left its Ray up
        pytest.skip("Ray already runs in this process")
    first = cluster.ray_session(num_cpus=2)
    info = first.__enter__()
    second_in, first_out, seen = threading.Event(), threading.Event(), {}

    def second_sweep():
        try:
            with cluster.ray_session(num_cpus=2) as s:
                seen["info"] = s
                second_in.set()
                assert first_out.wait(120)
                seen["alive"] = ray.is_initialized()
                seen["answer"] = ray.get(_answer.remote(), timeout=120)  # Ray still works for it
        except BaseException as e:  # shown by the assertions below
            seen["error"] = repr(e)
            second_in.set()

    thread = threading.Thread(target=second_sweep)
    try:
        assert info["started"] and not info["shared"] and info["cluster"]["CPU"] == 2
        thread.start()
        assert second_in.wait(120) and "error" not in seen, seen
        assert seen["info"]["shared"] and not seen["info"]["started"] and cluster.ray_users() == 2
    finally:
        first.__exit__(None, None, None)  # the first sweep ends while the second runs
    assert ray.is_initialized() and cluster.ray_users() == 1
    first_out.set()
    thread.join(180)
    assert not thread.is_alive() and seen.get("answer") == 42 and seen["alive"], seen
    assert not ray.is_initialized() and cluster.ray_users() == 0  # the last user shut it down


def test_a_ray_the_caller_started_is_left_to_the_caller():
    if ray.is_initialized():  # pragma: no cover
        pytest.skip("Ray already runs in this process")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        with cluster.ray_session() as s:
            assert not s["started"] and not s["shared"] and cluster.ray_users() == 0
        assert ray.is_initialized()  # still the caller's
    finally:
        ray.shutdown()


def test_tune_settings_are_restored_by_the_last_fit_only(monkeypatch):
    monkeypatch.delenv("TUNE_DISABLE_SIGINT_HANDLER", raising=False)
    quiet = logging.getLogger("ray.tune")
    level = quiet.level
    rb._tune_settings(+1)
    rb._tune_settings(+1)  # a second sweep's fit starts
    rb._tune_settings(-1)  # the first ends: the second still runs with Tune's settings
    assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1" and quiet.level == logging.ERROR
    rb._tune_settings(-1)
    assert "TUNE_DISABLE_SIGINT_HANDLER" not in os.environ and quiet.level == level
