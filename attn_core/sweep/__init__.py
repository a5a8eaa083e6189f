"""Sweeps: many retrains (regularizer x lambda x seed, plus a lambda = 0 baseline per seed) run as
Ray Tune trials, their results recorded by the driver as runs of one sweep in the run store.

``plan`` (the grid, trials, Pareto frontier; no Ray), ``trial`` (one trial on a worker, its payload
recorded on the driver), ``ray_backend`` (Ray and Tune), ``run`` (a sweep end to end, resume)."""

from attn_core.sweep.plan import BASELINE, SweepError, SweepPlan, Trial, grid_plan, pareto, parse_grid
from attn_core.sweep.run import finished_keys, run_sweep, start_sweep, sweep_result
from attn_core.sweep.trial import payload_size, record_trial, run_trial

__all__ = [
    "BASELINE",
    "SweepError",
    "SweepPlan",
    "Trial",
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
