"""The duration estimate rests on several timings, not one (issue 37, item 8: one of five
identical retrains said ~1.7 s a step and trained in 6.6 s). The timings here come from a fake
clock: a stall while the speed is measured (here two of the first three timings) does not make
the estimate; no wall time is asserted."""

import pytest

from attn_core.training import estimate
from tests.conftest import make_tiny_model


class Clock:
    """A timer whose k-th timing (two calls: start, end) lasts ``durations[k]`` seconds."""

    def __init__(self, durations):
        self.durations, self.now, self.calls = list(durations), 100.0, 0

    def __call__(self) -> float:
        if self.calls % 2:
            self.now += self.durations[(self.calls // 2) % len(self.durations)]
        self.calls += 1
        return self.now


STALLED = [2.0, 0.002, 2.0] + [0.002] * 20  # two stalls among the first three timings


def test_typical_is_the_lower_quartile():
    assert estimate.typical([5.0, 1.0, 9.0, 2.0, 3.0]) == 2.0
    assert estimate.typical([0.002] * 6 + [2.0] * 3) == 0.002
    assert estimate.typical([7.0]) == 7.0


def test_a_stall_does_not_make_the_fixed_cost_of_a_step():
    clock = Clock(STALLED)
    assert estimate.fixed_seconds(make_tiny_model(), clock=clock) == pytest.approx(3 * 0.002)
    assert clock.calls == 2 * estimate.TIMINGS


def test_a_stall_does_not_make_the_device_rate():
    flops = 2 * 1024 * 512 * 1024
    rate = estimate.device_rate.__wrapped__("cpu", clock=Clock([1.0, 1.0, 0.01] + [0.01] * 40))
    assert rate == pytest.approx(flops / 0.01)


def test_five_identical_estimates_agree_when_one_measurement_stalls():
    """What the user saw: five runs of the same retrain, one estimate 70x off."""
    model = make_tiny_model()
    said = [estimate.fixed_seconds(model, clock=Clock(STALLED if i == 2 else [0.002])) for i in range(5)]
    assert max(said) == min(said)


# --- a range before the run, refined from the measured steps as it goes --------------------------


def test_the_estimate_is_a_range_widened_by_the_load():
    assert estimate.run_range(100.0) == (50.0, 400.0)
    assert estimate.run_range(100.0, load=2.5) == (50.0, 1000.0)  # 2.5 runnable processes per core
    assert estimate.range_text(20, 45) == "20–45 s"
    assert estimate.range_text(120, 420) == "2–7 min"
    assert estimate.range_text(50, 180) == "50 s – 3 min"
    assert estimate.range_text(12.2, 12.4) == "about 12 s"


def test_said_before_a_run_as_a_range(tiny_model):
    line = estimate.duration_line(tiny_model().cfg, 100_000, 16, 8)  # long enough that its two ends read apart
    assert line.startswith("estimated duration: ") and "–" in line and "refined" in line
    assert "about" not in line.split(" on ")[0]


def paced(seconds_per_step, steps=100, after_s=0.0):
    pace, t = estimate.Pace(steps, after_s), 0.0
    for step, dt in enumerate(seconds_per_step, start=1):
        t += dt
        pace.add(step, t)
    return pace


def test_the_pace_refines_the_time_left():
    assert paced([0.1, 0.1]).left() is None  # too few steps measured
    low, high = paced([0.1] * 10, after_s=2.0).left()  # 90 steps left at 0.1 s, then 2 s measuring
    assert low == pytest.approx(90 * 0.1 * 0.9 + 2.0) and high == pytest.approx(90 * 0.1 * 1.1 + 2.0)
    assert paced([0.1] * 100).left() == (0.0, 0.0)


def test_a_run_that_slows_down_says_so_within_its_recent_pace():
    """The first 50 steps at 0.1 s, then a busy machine: 1 s a step. The recent pace (the last
    RECENT_S seconds) gives the high end, the whole run's the low end."""
    low, high = paced([0.1] * 50 + [1.0] * 30).left()
    overall = (50 * 0.1 + 30 * 1.0) / 80
    assert low == pytest.approx(20 * overall * 0.9) and high == pytest.approx(20 * 1.0 * 1.1)


def test_an_estimate_is_timed_with_the_threads_the_run_takes(tiny_model, monkeypatch):
    """A page whose server kept torch's default threads timed the run's steps on them: one visit
    said ~0.26 s a step, the next ~0.029 s. The run of a tiny model trains on one thread."""
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = []
    monkeypatch.setattr(estimate, "_rate", lambda device, clock: seen.append(torch.get_num_threads()) or 1e9)
    monkeypatch.setattr(estimate, "_fixed", lambda model, device, clock: seen.append(torch.get_num_threads()) or 0.0)
    estimate.device_rate.cache_clear()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        e = estimate.run_seconds(tiny_model().cfg, 100, 16, 8, model=tiny_model())
        assert e["threads"] == 1 and seen and set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
        estimate.device_rate.cache_clear()


def test_a_job_publishes_the_time_left_as_it_trains():
    from attn_core.retraining.job import TrainingJob
    from attn_core.training.config import JobConfig

    job = TrainingJob.open(JobConfig(source="reverse-1l", regularizers={"entropy": 0.1}, steps=12), store=False)
    said = []
    job.on_publish = lambda j: said.append((j.snapshot().step, j.snapshot().left_s))
    job.run()
    left = [(step, s) for step, s in said if s is not None]
    assert left and all(step >= estimate.MIN_PACE_STEPS for step, _ in left)
    assert all(0 <= low <= high for _, (low, high) in left)
