"""Recording a run: the one step loop, with its divergence guard, and the one way a run is saved.

:func:`record_run` steps a :class:`~attn_core.training.trainer.Trainer` to the end of its
schedule. A step whose loss or gradient is NaN/Inf, or whose loss explodes, raises ``Diverged``
at the trainer's next sync point (at once with ``sync_every`` 1, before the bad step's update); the
loop then puts the last good weights back and ends ``diverged``. Each
step's metrics are logged under their names (``telemetry.step_row``) in a :class:`RunRecorder`,
which keeps the metric log in memory and, with a run store, writes it there (at least every
``FLUSH_EVERY_S``) and finally saves the weights with their :class:`~attn_core.card.Card`
(:func:`run_card`). Retraining (``TrainingJob``), the QK comparison (``qk.train_variant``) and
growth (``grow.finetune``) all train through here. See docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from attn_core import checkpoint
from attn_core.card import Card, machine, now, public
from attn_core.model import Transformer
from attn_core.runs import FINAL, RunStoreError
from attn_core.sources import RUN_PREFIX
from attn_core.training.telemetry import step_row
from attn_core.training.trainer import Diverged, Trainer

FLUSH_EVERY_S = 2.0  # metrics reach the run store at least this often
UNSAVED = "attn-lab-unsaved"  # folder (in the temp dir, else ~/.cache) of runs the store refused

# on_step(step, row, seconds): row is the step's metrics under their logged names, seconds the
# time inside Trainer.step (a window of steps read at one sync point shares its time evenly)
OnStep = Callable[[int, dict, float], None]
# interrupt() before every step: a message ends the run as "stopped", None goes on
Interrupt = Callable[[], str | None]


@dataclass(frozen=True)
class Outcome:
    """How a run ended: ``status`` (one of ``runs.FINAL``), the one-sentence ``message``, and for
    a divergence ``reason``, what the guard found (``diverged at step 7: loss is nan``)."""

    status: str
    message: str
    reason: str = ""

    def __post_init__(self) -> None:
        if self.status not in FINAL:
            raise ValueError(f"a run ends {', '.join(FINAL)}, not {self.status!r}")


def record_run(
    trainer: Trainer,
    recorder: RunRecorder | None = None,
    on_step: OnStep | None = None,
    interrupt: Interrupt | None = None,
) -> Outcome:
    """Step ``trainer`` until ``trainer.cfg.steps``: log every step in ``recorder`` (flushed to its
    store every ``FLUSH_EVERY_S``), then call ``on_step``. Steps arrive in order once the trainer
    has read them from the device (at its sync points, see :class:`Trainer`), so with
    ``sync_every`` N they may come up to N - 1 steps late, several at once. On divergence the last
    good weights are restored and the outcome is ``diverged``; ``interrupt`` can stop the run
    between steps (the pending steps are read first)."""
    steps = trainer.cfg.steps

    def deliver(metrics: dict) -> None:
        step = metrics["step"]
        row = step_row(metrics)
        if recorder is not None:
            recorder.log(step, row)
        if on_step is not None:
            on_step(step, row, trainer.seconds.get(step, 0.0))

    def noted(outcome: Outcome) -> Outcome:  # a compiled step that fell back to eager says so
        note = trainer.graph.note
        return dataclasses.replace(outcome, message=f"{outcome.message}; {note}") if note else outcome

    trainer.callbacks.append(deliver)
    try:
        while trainer.step_index < steps:
            try:
                if interrupt is not None:
                    stop = interrupt()
                    if stop:
                        trainer.sync()
                        return noted(Outcome("stopped", stop))
                trainer.step()
            except Diverged as d:
                kept = trainer.restore_good()
                return noted(Outcome("diverged", f"{d}; kept weights of step {kept}", str(d)))
            if recorder is not None:
                recorder.flush()
        return noted(Outcome("completed", f"completed {steps} steps"))
    finally:
        trainer.callbacks.remove(deliver)


def error_text(e: BaseException) -> str:
    """An error as one line: a :class:`RunStoreError` says itself (which store, why), any other
    is ``Type: first line``."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, RunStoreError):
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def rescue_folders(run_id: str) -> list[Path]:
    """Where the weights of a run the store could not save go, in order of preference."""
    return [Path(tempfile.gettempdir()) / UNSAVED / run_id, Path.home() / ".cache" / UNSAVED / run_id]


def measure_final(trainer: Trainer, outcome: Outcome, measure: Callable[[], dict]) -> tuple[Outcome, dict]:
    """``measure()`` of the final weights; a completed run whose held-out loss is not finite
    (the last update broke it) gets its last good weights back and ends ``diverged``. Final
    weights with a finite held-out loss become the trainer's last good weights (``keep_current``),
    so the weights a run saves are the ones measured, whatever its ``sync_every``."""
    after = measure()
    if outcome.status == "completed" and not math.isfinite(after["loss"]):
        kept = trainer.restore_good()
        outcome = Outcome(
            "diverged",
            f"diverged after the last step: held-out loss is NaN; kept weights of step {kept}",
            "held-out loss is NaN",
        )
        after = measure()
    elif outcome.status in ("completed", "stopped") and math.isfinite(after["loss"]):
        trainer.keep_current()  # the measured weights are the run's: saved and reported alike
    return outcome, after


class RunRecorder:
    """A run's metric log (columns ``steps``, ``names``, ``values``: append-only lists, so a
    reader may keep their length as a snapshot) and, with a ``store`` (a ``runs.RunStore``), its
    row in the run store from :meth:`start` to :meth:`finish`."""

    def __init__(self, store=None, flush_every: float = FLUSH_EVERY_S):
        self.store = store
        self.run_id: str | None = None
        self.columns: tuple[list, list, list] = ([], [], [])
        self.flush_every = flush_every
        self._flushed = 0
        self._last_flush = 0.0

    def start(self, parent: str, task: str, config: dict) -> str | None:
        """A new run in status ``running`` (nothing without a store); returns its id."""
        if self.store is not None:
            self.run_id = self.store.create(parent, task, config)
        return self.run_id

    def log(self, step: int, row: dict) -> None:
        steps, names, values = self.columns
        for name, v in row.items():
            steps.append(step)
            names.append(name)
            values.append(float(v))

    def log_rows(self, rows: Iterable[tuple[int, str, float]]) -> None:
        for step, name, v in rows:
            self.log(step, {name: v})

    def __len__(self) -> int:
        return len(self.columns[0])

    def flush(self, force: bool = False) -> None:
        """Write the new rows to the store (unless the last write is younger than ``flush_every``)."""
        if self.store is None or self.run_id is None:
            return
        now_s = time.perf_counter()
        if not force and now_s - self._last_flush < self.flush_every:
            return
        self._last_flush = now_s
        steps, names, values = self.columns
        n = len(steps)
        if n > self._flushed:
            self.store.log_metrics(
                self.run_id, zip(steps[self._flushed : n], names[self._flushed : n], values[self._flushed : n])
            )
            self._flushed = n

    def finish(
        self,
        outcome: Outcome,
        model: Transformer | None,
        card: Card,
        before: dict | None,
        after: dict | None,
        files: dict[str, bytes] | None = None,
    ) -> Outcome:
        """Write the rest of the log, save ``model`` (a CPU copy) with ``card`` and mark the run
        finished. A store that fails (disk full, read-only, corrupt) makes the outcome ``failed``
        with its reason; the weights then go to the first of :func:`rescue_folders` that takes
        them, named in the message, and the run's row is marked failed with that message if
        the index still takes a write. ``files`` are saved beside the weights (a tokenizer)."""
        if self.store is None or self.run_id is None:
            return outcome
        summary = {"before": public(before), "after": public(after)}
        try:
            self.flush(force=True)
            self.store.finish(
                self.run_id, outcome.status, model, card, message=outcome.message, summary=summary, files=files
            )
        except Exception as e:
            why = error_text(e)
            message = f"{outcome.message}; saving the run failed" + (
                " for the same reason" if why in outcome.message else f": {why}"
            )
            if model is not None:
                message += "; " + self._rescue(model, card, message, files)
            try:
                self.store.finish(self.run_id, "failed", None, card, message=message, summary=summary)
            except Exception:
                pass  # the index takes no write: listing shows the run failed once this process is gone
            return Outcome("failed", message)
        return outcome

    def _rescue(self, model: Transformer, card: Card, message: str, files: dict[str, bytes] | None = None) -> str:
        """Save the weights outside the store; says where (or why nowhere)."""
        card = dataclasses.replace(Card.from_dict(card), status="failed", message=message)
        errors = []
        for folder in rescue_folders(self.run_id):
            try:
                checkpoint.save(model, folder, card, overwrite=True, files=files)
                return f"its weights were kept in {folder}"
            except (OSError, ValueError) as e:
                errors.append(f"{folder.parent}: {getattr(e, 'strerror', None) or e}")
        return "its weights could not be kept anywhere (" + "; ".join(errors) + ")"


def run_card(
    run_id: str | None,
    trainer: Trainer,
    outcome: Outcome,
    *,
    parent: str,
    description: str,
    before: dict | None,
    after: dict | None,
    samples: int,
    wall_time_s: float,
    command: str,
    **details,
) -> Card:
    """The card of a recorded run: what it started from, its recipe (the trainer's), how it ended,
    its held-out ``after`` measurement on ``samples`` test sequences as ``metrics``, the public
    before/after keys and per-head detail; ``details`` are the kind's own sections (a retrain's
    ``regularizers`` and ``job``, a comparison's ``variant`` ...)."""
    before, after = before or {}, after or {}
    return Card(
        name=f"{RUN_PREFIX}{run_id}",
        task=trainer.task.name,
        parent=parent,
        description=description,
        metrics={**public(after), "eval_samples": samples, "split": "test"},
        seed=trainer.cfg.seed,
        steps=trainer.step_index,
        train=trainer.cfg.to_dict(),
        run_id=run_id,
        status=outcome.status,
        message=outcome.message,
        wall_time_s=round(wall_time_s, 2),
        device=str(trainer.device),
        machine=machine(),
        params=trainer.model.n_params(),
        command=command,
        created=now(),
        details={
            **details,
            "before": public(before),
            "after": public(after),
            "per_head": {"before": before.get("per_head"), "after": after.get("per_head")},
        },
    )
