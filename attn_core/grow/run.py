"""The whole growth comparison: grow one head along the functional gradient, widen it
with zero and random columns, fine-tune all three the same way (through the step loop of
:mod:`attn_core.training.record`) and measure them on the same held-out set."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from attn_core.card import Card
from attn_core.device import select_device
from attn_core.grow.config import GrowConfig
from attn_core.grow.growth import (
    FIT_SEED_OFFSET,
    SEARCH_SEED_OFFSET,
    Growth,
    Step,
    widen,
)
from attn_core.model import Transformer
from attn_core.tasks import Task
from attn_core.training.config import TrainConfig
from attn_core.training.record import record_run
from attn_core.training.trainer import Trainer, evaluate

METHODS = ("grown", "random", "zero")
FIT_SHARE = 0.1  # of the progress: the fit and the line search (the fine-tuning of three models is the rest)


@dataclass
class GrowResult:
    """Everything :func:`grow` measured. Losses named ``loss_*`` are held-out (``eval_samples``
    test sequences, the same for every method); ``batch_loss_*`` are on the fitting batch, where
    the predicted (first-order) and measured decreases are compared."""

    config: GrowConfig
    d_k: int
    kept: int
    augmented: bool
    data_rank: tuple[int, int]  # (r_q, r_k)
    step: Step
    eta_ref: float
    line_search: pd.DataFrame
    batch_loss_before: float
    batch_loss_after_step: float
    loss_before: float
    methods: dict[str, dict]  # method -> loss_after_init, loss_after_finetune, accuracy..., note
    curves: pd.DataFrame  # method, step, eval_loss, train_loss
    models: dict[str, Transformer]  # "grown" (after the step) and "<method>_finetuned"
    original: Transformer

    @property
    def measured_decrease(self) -> float:
        return self.batch_loss_before - self.batch_loss_after_step

    def summary(self) -> dict:
        """The JSON document of ``attn-lab grow``."""
        s, g = self.step, self.methods["grown"]
        return {
            "layer": self.config.layer,
            "head": self.config.head,
            "add": self.config.add,
            "d_k": self.d_k,
            "d_k_new": self.kept,
            "basis": self.config.basis,
            "augmented": self.augmented,
            "data_rank": list(self.data_rank),
            "batch": self.config.batch,
            "seed": self.config.seed,
            "damping": self.config.damping,
            "singular_values_Z": s.singular_values.tolist(),
            "kept": self.kept,
            "residual": s.residual,
            "fit_residual": s.fit_residual,
            "truncation_residual": s.truncation_residual,
            "discarded_energy": s.discarded_energy,
            "discarded_share": s.discarded_energy / s.total_energy if s.total_energy > 0 else 0.0,
            "captured_share": s.captured_share(self.d_k),
            "eta": s.eta,
            "eta_ref": self.eta_ref,
            "predicted_decrease": s.predicted_decrease,
            "measured_decrease": self.measured_decrease,
            "batch_loss_before": self.batch_loss_before,
            "batch_loss_after_step": self.batch_loss_after_step,
            "loss_before": self.loss_before,
            "loss_after_step": g["loss_after_init"],
            "loss_after_finetune": g["loss_after_finetune"],
            "accuracy_after_finetune": g["accuracy_after_finetune"],
            "baselines": {m: dict(self.methods[m]) for m in ("random", "zero")},
            "finetune_steps": self.config.steps,
        }

    def card(self, name: str, parent: str, task: str, command: str = "") -> Card:
        """The card of the grown, fine-tuned model (``models["grown_finetuned"]``) saved as
        ``name``: grown from ``parent`` on ``task``; ``grow`` holds :meth:`summary` with the
        parent's name and task."""
        summary = {"name": parent, "task": task, **self.summary()}
        c = self.config
        return Card(
            name=name,
            task=task,
            parent=parent,
            description=f"{parent} with head {c.head} of layer {c.layer} grown from d_k {self.d_k} to "
            f"{self.kept}, then fine-tuned {c.steps} steps",
            metrics={
                "accuracy": summary["accuracy_after_finetune"],
                "loss": summary["loss_after_finetune"],
                "eval_samples": c.eval_samples,
                "split": "test",
            },
            seed=c.seed,
            command=command,
            details={"grow": summary},
        )


def finetune(
    model: Transformer, task: Task, cfg: TrainConfig, on_step: Callable[[int], None] | None = None
) -> tuple[Transformer, pd.DataFrame, str]:
    """Train a copy through the one step loop (``training.record.record_run``); the curve has
    the held-out loss at step 0 and every ``eval_every`` steps and the training-batch loss every
    step. A divergence keeps the last good weights and is reported in the note. ``on_step(step)``
    after each step (progress)."""
    trainer = Trainer(copy.deepcopy(model), task, cfg)
    start = evaluate(trainer.model, task, cfg.eval_samples, cfg.seed)
    rows: list[dict] = [{"step": 0, "eval_loss": start["loss"], "eval_accuracy": start["accuracy"]}]

    def record(step: int, row: dict, seconds: float) -> None:
        rows.append({"step": step, **row})
        if on_step is not None:
            on_step(step)

    outcome = record_run(trainer, on_step=record)
    curve = pd.DataFrame(
        [
            {
                "step": r["step"],
                "train_loss": r.get("task_loss"),
                "eval_loss": r.get("eval_loss"),
                "eval_accuracy": r.get("eval_accuracy"),
            }
            for r in rows
        ]
    )
    return trainer.model.eval(), curve, outcome.reason


def grow(
    model: Transformer, task: Task, cfg: GrowConfig, progress: Callable[[str, float], None] | None = None
) -> GrowResult:
    """Grow head (cfg.layer, cfg.head) by cfg.add dimensions along the functional gradient, pick the
    step by line search, then compare with zero and random growth under the same fine-tuning.
    ``progress(what, fraction)`` says how far it got (the fit and line search, then each method's
    fine-tuning step by step)."""
    say = progress or (lambda what, fraction: None)
    if model.cfg.d_vocab != task.d_vocab or model.cfg.n_ctx < task.n_ctx:
        raise ValueError(
            f"model (d_vocab={model.cfg.d_vocab}, n_ctx={model.cfg.n_ctx}) does not fit task "
            f"{task.name!r} (d_vocab={task.d_vocab}, n_ctx={task.n_ctx})"
        )
    train_cfg = cfg.train_config()
    model = copy.deepcopy(model).to(select_device(cfg.device)).float().eval()
    batch = task.sample(cfg.batch, cfg.seed + FIT_SEED_OFFSET, split="train")
    search = task.sample(cfg.batch, cfg.seed + SEARCH_SEED_OFFSET, split="train")
    say("fitting the scores' step and searching the step size", 0.0)
    growth = Growth(model, task, batch, cfg.layer, cfg.head, cfg.add, cfg.basis, val_batch=search, damping=cfg.damping)
    step, table = growth.line_search(cfg.grid)
    share = FIT_SHARE
    starts = {
        "grown": growth.grown_model(step),
        "random": widen(model, cfg.layer, cfg.head, cfg.add, "random", cfg.random_std, cfg.seed),
        "zero": widen(model, cfg.layer, cfg.head, cfg.add, "zero"),
    }
    before = evaluate(model, task, cfg.eval_samples, cfg.seed)
    methods, curves, models = {}, [], {"grown": starts["grown"]}
    for i, name in enumerate(METHODS):

        def tuning(step: int, i: int = i, name: str = name) -> None:
            done = share + (1 - share) * (i + step / max(train_cfg.steps, 1)) / len(METHODS)
            say(f"fine-tuning {name} ({i + 1} of {len(METHODS)}): step {step} of {train_cfg.steps}", done)

        tuning(0)
        tuned, curve, note = finetune(starts[name], task, train_cfg, on_step=tuning)
        evals = curve.dropna(subset=["eval_loss"])
        methods[name] = {
            "loss_after_init": float(evals["eval_loss"].iloc[0]),
            "loss_after_finetune": float(evals["eval_loss"].iloc[-1]),
            "accuracy_after_init": float(evals["eval_accuracy"].iloc[0]),
            "accuracy_after_finetune": float(evals["eval_accuracy"].iloc[-1]),
            "note": note,
        }
        curves.append(curve.assign(method=name))
        models[f"{name}_finetuned"] = tuned
    return GrowResult(
        config=cfg,
        d_k=growth.d_k,
        kept=growth.kept,
        augmented=growth.hb.augmented,
        data_rank=(growth.fit.q.rank, growth.fit.k.rank),
        step=step,
        eta_ref=growth.eta_ref,
        line_search=table,
        batch_loss_before=growth.loss,
        batch_loss_after_step=growth.loss_at(step),
        loss_before=before["loss"],
        methods=methods,
        curves=pd.concat(curves, ignore_index=True),
        models=models,
        original=model,
    )
