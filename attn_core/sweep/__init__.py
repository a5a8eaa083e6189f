"""Sweeps: many retrains (regularizer x lambda x seed, plus a lambda = 0 baseline per seed) run as
Ray Tune trials, their results recorded by the driver as runs of one sweep in the run store.

``plan`` (the grid, trials, Pareto frontier; no Ray), ``check`` (everything a trial would refuse,
refused before anything starts: the one place a sweep is validated), ``trial`` (one trial on a
worker, its payload recorded on the driver), ``ray_backend`` (Tune, on the Ray that
:mod:`attn_core.cluster` starts or joins), ``run`` (a sweep end to end, Ctrl-C, resume)."""

from attn_core.sweep.check import check_resources, check_settings, check_sweep
from attn_core.sweep.plan import (
    BASELINE,
    MAX_TRIALS,
    SweepError,
    SweepInterrupted,
    SweepPlan,
    Trial,
    grid_plan,
    pareto,
    parse_grid,
)
from attn_core.sweep.run import finished_keys, run_sweep, start_sweep, sweep_result
from attn_core.sweep.trial import payload_size, record_trial, run_trial

__all__ = [
    "BASELINE",
    "MAX_TRIALS",
    "SweepError",
    "SweepInterrupted",
    "SweepPlan",
    "Trial",
    "check_resources",
    "check_settings",
    "check_sweep",
    "finished_keys",
    "grid_plan",
    "pareto",
    "parse_grid",
    "payload_size",
    "record_trial",
    "run_sweep",
    "run_trial",
    "start_sweep",
    "sweep_result",
]
