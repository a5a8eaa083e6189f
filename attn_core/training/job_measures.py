"""What a live job (:class:`attn_core.training.job.TrainingJob`) measures while it trains, on the
heads that matter: telemetry of the regularized heads on the probe batch, the watched
head's probe pattern (and no other: a job nobody watches copies no pattern from the device), the
spectra of the watched and regularized heads, and the before/after measurement sized to the run.
Each reads the weights through ``Trainer.view()`` (the model, or on rank 0 of an FSDP run its
gathered weights)."""

from __future__ import annotations

import contextlib
import time

from attn_core import regularizers as R
from attn_core.training import telemetry


class Phases(dict):
    """Seconds a job spent in each part of its run, by name: ``load`` (building the
    job: the model, the task, the probe), ``before`` and ``after`` (the measurements),
    ``telemetry`` and ``spectra`` (the periodic measurements), ``save``; :func:`phases` adds the
    steps, the evaluations among them and compiling."""

    @contextlib.contextmanager
    def timed(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - started


def phases(job) -> dict[str, float]:
    """Every part of ``job``'s run so far, in seconds: its :class:`Phases`, ``steps`` (inside
    ``Trainer.step``), of which ``evaluation`` (held-out evaluations) and ``compile`` (the first
    call of each compiled region). A job in a worker process keeps its own."""
    trainer = job.trainer
    return {
        **job.phases,
        "steps": job._state["step_s"],
        "evaluation": trainer.eval_s,
        "compile": trainer.graph.compile_s,
    }


def record_telemetry(job, step: int) -> None:
    """Per-head telemetry of the regularized heads at ``step``, then the watched head's pattern."""
    with job.phases.timed("telemetry"), job.trainer.view() as model:
        job._record(
            step, telemetry.telemetry_row(model, job.probe.tokens, job.penalty.regularized_heads, job.cfg.precision)
        )
    watched_pattern(job, step)


def watched_pattern(job, step: int) -> None:
    """The watched head's probe pattern with the weights of ``step`` (nothing when unwatched)."""
    watched = job._watch
    if watched is not None:
        with job.trainer.view() as model:
            pattern = telemetry.probe_pattern(model, job.probe.tokens[0], *watched)
        job._state.update(probe_pattern=pattern, probe_step=step, probe_head=watched)


def spectra_values(model, heads) -> dict:
    """A spectra refresh's row: the spectra of every head's B and, rotary, sigma_1(B(delta)) of
    ``heads`` (the first :data:`telemetry.LIVE_OFFSET_HEADS` of them)."""
    return {**telemetry.spectra_row(R.spectrum(model)), **telemetry.offsets_row(model, heads)}


def record_spectra(job, step: int) -> None:
    """:func:`spectra_values` of the heads that matter (the watched one first)."""
    heads = ([job._watch] if job._watch is not None else []) + list(job.penalty.regularized_heads)
    with job.phases.timed("spectra"), job.trainer.view() as model:
        job._record(step, spectra_values(model, heads))


def measure(job) -> dict:
    """The before/after measurement (``telemetry.measure``), on text sized by the run's tokens."""
    with job.phases.timed("before" if job._state["before"] is None else "after"), job.trainer.view() as model:
        return telemetry.measure(
            model,
            job.task,
            job.penalty.regularized_heads,
            job.cfg.measure_samples,
            job.cfg.seed,
            tokens=telemetry.measure_tokens(job.train_cfg, job.task),
            precision=job.cfg.precision,
        )


def pattern(job, layer: int, head: int):
    """``job.pattern``: the latest telemetry's probe pattern of the head, or for a run that has
    ended its final weights' (on the CPU, once per head); else None."""
    snap = job.snapshot()
    found = snap.pattern_of(layer, head)
    if found is not None or not snap.done:
        return found
    key = (int(layer), int(head), snap.step)
    if key not in job._patterns:
        try:
            model = job.model_copy()
        except RuntimeError:  # a job that ended without weights (failed before training)
            return None
        job._patterns[key] = telemetry.probe_pattern(model, job.probe.tokens[0].cpu(), layer, head)
    return job._patterns[key]
