"""Everything a sweep would refuse, refused before any trial starts (and before Ray starts or the
run store is written): :func:`check_sweep` is the one place. A trial that could only fail on a
worker (a model that does not resolve, heads the model lacks, a spec it cannot take) is refused
here exactly as ``attn-lab retrain`` refuses it, by building the trial's job on this machine's
CPU; the trial settings (CPUs, GPUs, scheduler) are checked too. What the cluster has is checked
once Ray is up (:func:`check_resources`), before the first trial is scheduled."""

from __future__ import annotations

import math

from attn_core.sweep.plan import BASELINE, SweepError, SweepPlan

SCHEDULERS = ("none", "asha")


def check_settings(cpus_per_trial: float, gpus_per_trial: float, scheduler: str) -> None:
    """The one-sentence error of a bad resource or scheduler setting (inf and NaN included)."""
    if scheduler not in SCHEDULERS:
        raise SweepError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
    for option, value, lo in (("--cpus-per-trial", cpus_per_trial, None), ("--gpus-per-trial", gpus_per_trial, 0)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (value < lo if lo is not None else value <= 0):
            raise SweepError(f"{option} must be {'>= 0' if lo is not None else '> 0'} (a finite number), got {value!r}")


def check_sweep(
    plan: SweepPlan, *, cpus_per_trial: float = 1.0, gpus_per_trial: float = 0.0, scheduler: str = "none"
) -> None:
    """Refuse, before anything starts, a sweep a trial of which would fail for its input: the
    settings (:func:`check_settings`), and for the baseline and each regularizer of the grid (one
    lambda each: a lambda never makes a spec invalid), the trial's job built as ``attn-lab
    retrain`` builds it (the model resolves and has a task, each spec and ``heads`` fit the
    model, the shared settings are valid), on the CPU (the workers may have GPUs this machine
    lacks). A sweep on text (``plan.job["text"]``) has its text read and tokenized here, once,
    into the token cache the trials then read (bad text is refused before Ray starts: not UTF-8,
    a missing field, fewer tokens than a block ...). Errors keep their kind (a model that cannot
    be read stays a CheckpointError)."""
    from attn_core.retraining.job import TrainingJob

    check_settings(cpus_per_trial, gpus_per_trial, scheduler)
    check_trial_workers(plan.job, cpus_per_trial, gpus_per_trial)
    seen: set[str] = set()
    for trial in plan.trials:
        kind = BASELINE if not trial.spec else trial.reg
        if kind in seen:
            continue
        seen.add(kind)
        # on this machine's CPU (a job on workers builds its check on the CPU itself)
        device = {} if plan.job.get("workers") else {"device": "cpu"}
        TrainingJob.open(trial.job_config({**plan.job, **device}), store=False).build()  # the weights read, too


def check_trial_workers(job: dict, cpus_per_trial: float, gpus_per_trial: float) -> None:
    """A trial on Ray Train workers (``--workers-per-trial``) takes its resources per worker:
    ``--cpus-per-trial`` and ``--gpus-per-trial`` are for trials that train in one process."""
    if job.get("workers") and (cpus_per_trial != 1.0 or gpus_per_trial):
        raise SweepError(
            "--cpus-per-trial and --gpus-per-trial are for trials in one process; a trial on "
            "--workers-per-trial N workers takes 1 CPU and --gpus-per-worker GPUs per worker"
        )


def check_resources(cluster: dict, cpus_per_trial: float, gpus_per_trial: float, job: dict | None = None) -> None:
    """Refuse a request the Ray cluster cannot meet (``cluster``: its CPU and GPU totals), which
    would otherwise leave every trial pending for ever; a trial on workers needs all its workers
    at once."""
    if job and job.get("workers"):
        from attn_core.cluster import ClusterError
        from attn_core.training.scaling import check_cluster

        try:
            return check_cluster(cluster, int(job["workers"]), float(job.get("gpus_per_worker") or 0))
        except ClusterError as e:
            raise SweepError(f"no trial could ever start: {e}") from None
    missing = []
    have_cpus, have_gpus = float(cluster.get("CPU", 0.0)), float(cluster.get("GPU", 0.0))
    if cpus_per_trial > have_cpus:
        missing.append(f"--cpus-per-trial {cpus_per_trial:g} but the cluster has {have_cpus:g} CPUs")
    if gpus_per_trial > have_gpus:
        has = f"{have_gpus:g} GPUs" if have_gpus else "no GPU"
        missing.append(f"--gpus-per-trial {gpus_per_trial:g} but the cluster has {has}")
    if missing:
        raise SweepError(f"no trial could ever start: {'; '.join(missing)} (nothing was run)")
