"""Training, in four modules (see docs/architecture.md):

- ``trainer``: TrainConfig, Trainer (one optimisation step, the NaN/Inf guard, last good
  weights), evaluate; it knows only the model and the task;
- ``telemetry``: what a run measures (``measure``, the per-step telemetry and spectra rows) and
  how metrics are named (``MetricKey``);
- ``record``: the one step loop with its divergence guard (``record_run``) and the one way a run
  is saved in the run store (``RunRecorder``, ``run_card``);
- ``job``: the live retraining job (JobConfig, Snapshot, TrainingJob).

Import from the modules themselves: this package imports nothing, so ``presets`` (which the job's
``scratch:<preset>`` source needs) can use the trainer without a cycle.
"""
