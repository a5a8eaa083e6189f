"""What a live retraining job publishes: immutable :class:`Snapshot` s, taken under the job's
lock and polled by the Retrain page and ``attn-lab retrain``, and the statuses a job goes through
(see docs/architecture.md, "Live retraining")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from attn_core.runs import FINAL, STATUSES

# A job is pending, queued (waiting for a slot, training.queue), running or paused, then ends
# like every run (runs.FINAL).
JOB_STATUSES = ("pending", "queued", STATUSES[0], "paused", *FINAL)
FINAL_STATUSES = FINAL


@dataclass(frozen=True)
class Snapshot:
    """What a training job has published, as of one moment; cheap to take (no copying: the
    metric log is append-only and the snapshot remembers its length).

    ``status`` is one of :data:`JOB_STATUSES`, ``message`` says why a run ended (or is paused);
    ``latest`` has the newest value of every metric; ``probe_pattern`` is the attention [T, T] of
    the watched head ``probe_head`` ((layer, head), ``TrainingJob.watch``) on one fixed held-out
    input (``probe_tokens``) with the weights of step ``probe_step`` (a preview's holds every
    head, [n_layers, n_heads, T, T], and no ``probe_head``); :meth:`pattern_of` reads either;
    ``before``/``after`` come from :func:`measure`."""

    status: str
    message: str
    step: int
    steps: int
    run_id: str | None
    elapsed_s: float
    train_s: float  # seconds inside the training loop (steps, telemetry), without setup/measure/save
    step_s: float  # of which inside Trainer.step (the rest is the job's telemetry and publishing)
    latest: dict
    regularized_heads: tuple
    n_layers: int
    n_heads: int
    before: dict | None
    after: dict | None
    probe_tokens: tuple
    probe_pattern: object | None  # numpy array, never written after publication
    probe_step: int
    probe_head: tuple | None = None
    compile_s: float = 0.0  # of train_s, compiling (the first call of each compiled region; 0 eager)
    # a run on Ray Train workers: one dict per worker (rank, host, pid, device, steps, steps_per_s,
    # peak_mib), rank 0's first; empty for a run in one process
    workers: tuple = ()
    # (low, high) seconds left while it trains, refined from the measured steps (estimate.Pace);
    # None before a few steps are measured
    left_s: tuple | None = None
    _log: tuple = field(repr=False, default=((), (), ()))
    _n: int = 0

    @property
    def done(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def progress(self) -> float:
        return self.step / self.steps if self.steps else 0.0

    def pattern_of(self, layer: int, head: int):
        """The probe pattern [T, T] of head ``layer``, ``head`` when this snapshot holds it, else None."""
        A = self.probe_pattern
        if A is None:
            return None
        if getattr(A, "ndim", 0) == 4:  # every head (a preview)
            ok = 0 <= layer < A.shape[0] and 0 <= head < A.shape[1]
            return A[layer, head] if ok else None
        return A if self.probe_head is not None and tuple(self.probe_head) == (layer, head) else None

    @property
    def steps_per_s(self) -> float:
        """Steps per second of training, compiling apart (:attr:`compile_s`)."""
        seconds = self.train_s - self.compile_s
        return self.step / seconds if seconds > 0 else 0.0

    def workers_table(self) -> pd.DataFrame:
        """Each worker of a run on Ray Train workers (rank, host, device, steps, steps/s, peak
        memory in MiB: the process's peak resident set on a CPU, allocated memory on a GPU)."""
        cols = {"rank": "rank", "host": "host", "device": "device", "steps": "steps"}
        cols.update(steps_per_s="steps/s", peak_mib="peak memory (MiB)")
        rows = [{label: w.get(key) for key, label in cols.items()} for w in self.workers]
        return pd.DataFrame(rows, columns=list(cols.values()))

    def metrics(self, names: Iterable[str] | None = None, prefix: str | None = None):
        """The metric log up to this snapshot as a DataFrame (step, name, value), the same
        format as ``RunStore.metrics``; optionally only some ``names`` or a name ``prefix``."""
        steps, names_, values = (col[: self._n] for col in self._log)
        df = pd.DataFrame({"step": steps, "name": names_, "value": values})
        if names is not None:
            df = df[df["name"].isin(list(names))]
        if prefix is not None:
            df = df[df["name"].str.startswith(prefix)]
        return df.reset_index(drop=True)
