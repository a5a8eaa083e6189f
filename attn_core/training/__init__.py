"""Training, in these modules (see docs/architecture.md; the device, the precision and placement are
``attn_core.device``'s, on the ground floor):

- ``config``: the recipes, TrainConfig (one training run) and JobConfig (a retraining run), each
  checked when built;
- ``trainer``: Trainer (one optimisation step, the NaN/Inf guard, last good weights), evaluate;
  it knows only the model and the task;
- ``telemetry``: what a run measures (``measure``, the per-step telemetry and spectra rows) and
  how metrics are named (``MetricKey``);
- ``record``: the one step loop with its divergence guard (``record_run``) and the one way a run
  is saved in the run store (``RunRecorder``, ``run_card``);
- ``snapshot``: what a live job publishes (Snapshot) and the statuses it goes through;
- ``queue``: how many jobs train at once in a process (``$ATTN_LAB_MAX_JOBS``) and the line the
  others wait in;
- ``interrupt``: Ctrl-C as a stop request of the step loop (``sigint_stops``);
- ``job``: the live retraining job (TrainingJob, preview).

Import from the modules themselves: this package imports nothing, so ``presets`` (which the job's
``scratch:<preset>`` source needs) can use the trainer without a cycle.
"""
