"""Training the variants of a comparison and recording each run.

:func:`compare` trains one architecture on one task and the same seeds (same data, same
recipe) with

- factored heads for several d_qk (``ModelConfig.d_qk``: only the query/key width changes, values
  and outputs keep d_head, so the rank cap of B is the only architectural difference),
- merged heads without decay on W_QK (no bias towards low rank at all),
- merged heads with AdamW weight decay ``qk_weight_decay`` on W_QK,
- merged heads with the penalty ``nuclear * mean_h ||B_h||_*`` (regularizers' ``nuclear``),

every other matrix decayed by the recipe's ``weight_decay`` (W_Q and W_K included). Each run is
measured on one fixed held-out set, its B's spectrum is taken per head, and its B is truncated to
rank r (Eckart-Young, :func:`truncated`) to see how much of the rank the model uses. Runs are saved
in the run store (parent ``compare-qk:<task>``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from attn_core import regularizers as R
from attn_core.bilinear import spectrum_rows
from attn_core.card import machine
from attn_core.model import Transformer
from attn_core.model.form import QK_MATRICES
from attn_core.qk.config import PARENT_PREFIX, TRUNCATION_RANKS, CompareConfig, Variant
from attn_core.qk.convert import truncated
from attn_core.qk.result import Comparison
from attn_core.tasks import Task, get_task
from attn_core.training.record import Interrupt, RunRecorder, measure_final, record_run, run_card
from attn_core.training.telemetry import MetricKey, measure_run
from attn_core.training.trainer import Trainer, adamw, evaluate, init_model, lr_factor

# (fraction of the work done, what is running) -> None; the page passes an st.progress updater.
Progress = Callable[[float, str], None]


def _qk_names(model: Transformer) -> set[str]:
    return {n for n, _ in model.named_parameters() if n.rsplit(".", 1)[-1] in QK_MATRICES}


def set_qk_weight_decay(trainer: Trainer, qk_weight_decay: float) -> None:
    """Give W_Q/W_K/W_QK their own AdamW weight decay, the rest of the recipe unchanged: the
    trainer's optimizer and schedule are rebuilt (before any step, so no state is lost) with
    three groups, other matrices (cfg.weight_decay), query/key matrices, vectors (none)."""
    if trainer.step_index != 0:
        raise ValueError("the weight decay of W_QK can only be set before the first step")
    cfg, qk = trainer.cfg, _qk_names(trainer.model)
    groups = {"decay": [], "qk": [], "none": []}
    for name, p in trainer.model.named_parameters():
        groups["qk" if name in qk else ("decay" if p.dim() >= 2 else "none")].append(p)
    trainer.optimizer = adamw(
        [
            {"params": groups["decay"], "weight_decay": cfg.weight_decay},
            {"params": groups["qk"], "weight_decay": float(qk_weight_decay)},
            {"params": groups["none"], "weight_decay": 0.0},
        ],
        cfg,
        trainer.device,
    )
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda s: lr_factor(s, cfg))


def truncation_table(model: Transformer, task: Task, ranks: Sequence[int], samples: int, seed: int) -> list[dict]:
    """Held-out loss and accuracy with every head's B cut to rank r, for each r in ``ranks``."""
    out = []
    for r in ranks:
        ev = evaluate(truncated(model, r), task, samples, seed)
        out.append({"rank": r, "loss": ev["loss"], "accuracy": ev["accuracy"]})
    return out


def train_variant(
    variant: Variant,
    cfg: CompareConfig,
    seed: int,
    store=None,
    progress: Callable[[int], None] | None = None,
    interrupt: Interrupt | None = None,
) -> dict:
    """Train one variant with one seed; returns its record (final metrics, spectrum, curves,
    step times, truncation table, run id). ``progress(step)`` is called after every step;
    ``interrupt()`` before every step can stop the run (it is then saved ``stopped``)."""
    task = get_task(cfg.task)
    model_cfg = variant.model_config(cfg.base_model_config())
    # the threads compare() set for its runs (cfg.threads, else the process's): its trainer keeps them
    train_cfg = dataclasses.replace(cfg.train_config(seed), threads=torch.get_num_threads())
    model = init_model(model_cfg, seed)
    penalty = R.build_penalty({"nuclear": variant.nuclear}, model) if variant.nuclear > 0 else None
    trainer = Trainer(model, task, train_cfg, penalty=penalty)
    qk_decay = cfg.weight_decay if variant.qk_weight_decay is None else variant.qk_weight_decay
    if qk_decay != cfg.weight_decay:
        set_qk_weight_decay(trainer, qk_decay)
    model = trainer.model
    config = {
        "variant": variant.name,
        "kind": variant.kind,
        "qk": variant.qk,
        "d_qk": variant.d_qk,
        "qk_weight_decay": qk_decay,
        "regularizers": variant.regularizers(),
        "steps": cfg.steps,
        "seed": seed,
        "comparison": cfg.to_dict(),
        "model": model_cfg.to_dict(),
        "train": train_cfg.to_dict(),
    }
    parent = PARENT_PREFIX + cfg.task
    recorder = RunRecorder(store)
    run_id = recorder.start(parent, task.name, config)
    before = measure_run(model, task, None, cfg.measure_samples, cfg.eval_seed)
    step_s: list[float] = []
    curves: list[dict] = []
    window: dict[str, list[float]] = {"loss": [], "accuracy": []}

    def on_step(step: int, m: dict, seconds: float) -> None:
        nonlocal window
        if "eval_loss" not in m:  # held-out evaluations are not part of a training step's cost
            step_s.append(seconds)
        window["loss"].append(m["task_loss"])
        window["accuracy"].append(m["accuracy"])
        if "eval_loss" in m:
            curves.append(
                {
                    "step": step,
                    "loss": statistics.fmean(window["loss"]),
                    "accuracy": statistics.fmean(window["accuracy"]),
                    "eval_loss": m["eval_loss"],
                    "eval_accuracy": m["eval_accuracy"],
                }
            )
            window = {"loss": [], "accuracy": []}
        if progress is not None:
            progress(step)

    start = time.perf_counter()
    outcome = record_run(trainer, recorder, on_step=on_step, interrupt=interrupt)
    wall = time.perf_counter() - start
    model.eval()
    outcome, after = measure_final(
        trainer, outcome, lambda: measure_run(model, task, None, cfg.measure_samples, cfg.eval_seed)
    )
    spec = spectrum_rows(model)
    for rec in spec:
        l, h = rec["layer"], rec["head"]
        recorder.log(trainer.step_index, {str(MetricKey("stable_rank", l, h)): rec["stable_rank"]})
        recorder.log(
            trainer.step_index, {str(MetricKey("sigma", l, h, i)): s for i, s in enumerate(rec["singular_values"])}
        )
    ranks = [r for r in TRUNCATION_RANKS if r <= cfg.d_model]
    trunc = truncation_table(model, task, ranks, cfg.measure_samples, cfg.eval_seed)
    ms = 1000 * statistics.median(step_s) if step_s else math.nan
    if run_id is not None:
        card = run_card(
            run_id,
            trainer,
            outcome,
            parent=parent,
            description=f"{variant.name} QK on {task.name} (merged-vs-factored comparison), seed {seed}",
            before=before,
            after=after,
            samples=cfg.measure_samples,
            wall_time_s=wall,
            command=cfg.command(),
            variant=variant.name,
            regularizers=variant.regularizers(),
            truncation=trunc,
            comparison=cfg.to_dict(),
            ms_per_step=ms,
        )
        outcome = recorder.finish(outcome, model.cpu(), card, before, after)
    return {
        "variant": variant.name,
        "kind": variant.kind,
        "qk": variant.qk,
        "d_qk": variant.d_qk,
        "seed": seed,
        "status": outcome.status,
        "message": outcome.message,
        "steps": trainer.step_index,
        "params": model.n_params(),
        "final_loss": after["loss"],
        "accuracy": after["accuracy"],
        "stable_rank": after["stable_rank"],
        "effective_rank": statistics.fmean(r["effective_rank"] for r in spec),
        "nuclear_norm": statistics.fmean(r["nuclear_norm"] for r in spec),
        "frobenius_norm": statistics.fmean(r["frobenius_norm"] for r in spec),
        "ln1_gain": ln1_gain(model),
        "ms_per_step": ms,
        "step_ms": [round(1000 * s, 4) for s in step_s],
        "wall_s": wall,
        "spectrum": [
            {
                "layer": r["layer"],
                "head": r["head"],
                "rank_cap": r["rank_cap"],
                "stable_rank": r["stable_rank"],
                "effective_rank": r["effective_rank"],
                "singular_values": r["singular_values"],
            }
            for r in spec
        ],
        "curves": curves,
        "truncation": trunc,
        "run_id": run_id,
    }


def ln1_gain(model: Transformer) -> float:
    """Mean |w| of the attention LayerNorms' gains. S = X B X^T with X = w * x_hat (+ b): scaling w
    by c and B by 1/c^2 leaves the scores unchanged when b = 0, so a penalty on the size of B (weight
    decay, nuclear norm) can be paid for by a larger, undecayed gain; this shows whether it was."""
    gains = [b.ln1.w.detach().abs().mean().item() for b in model.blocks if hasattr(b.ln1, "w")]
    return statistics.fmean(gains) if gains else math.nan


def compare(
    cfg: CompareConfig, store=None, progress: Progress | None = None, interrupt: Interrupt | None = None
) -> Comparison:
    """Train every variant with every seed (seed-major, so a partial picture covers every variant)
    and collect the records. ``store``: a ``runs.RunStore`` (each run is saved there), None (the
    default store) or False (nothing saved). ``progress(fraction, message)`` after every step.
    ``interrupt()`` (e.g. Ctrl-C, ``training.interrupt``) stops the run under way, which is kept
    as ``stopped``, and the runs not begun: the comparison then holds the runs made so far."""
    from attn_core.runs import RunStore

    store = None if store is False else (store if store is not None else RunStore())
    if store is not None:
        store.check_writable()  # before any training, not after the first run
    variants = cfg.variants()
    jobs = [(s, v) for s in cfg.seed_list for v in variants]
    total = len(jobs) * cfg.steps
    runs = []
    threads = torch.get_num_threads()
    start = time.perf_counter()
    try:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        where = machine()  # with the threads the steps were timed with
        for i, (seed, variant) in enumerate(jobs):
            done = i * cfg.steps
            label = f"{variant.name}, seed {seed} ({i + 1}/{len(jobs)})"
            if progress is not None:
                progress(done / total, label)
            tick = (
                None
                if progress is None
                else (lambda step, done=done, label=label: progress((done + step) / total, label))
            )
            runs.append(train_variant(variant, cfg, seed, store, tick, interrupt))
            if interrupt is not None and interrupt():
                break
    finally:
        torch.set_num_threads(threads)
    if progress is not None and len(runs) == len(jobs):
        progress(1.0, "done")
    return Comparison(cfg, runs, machine=where, wall_time_s=time.perf_counter() - start)


def results_path(root: str | Path | None = None) -> Path:
    """Where experiments/merged_vs_factored.py saves the full comparison (JSON; .md beside it)."""
    base = Path(root) if root is not None else Path(__file__).resolve().parent.parent.parent
    return base / "experiments" / "results" / "merged_vs_factored.json"
