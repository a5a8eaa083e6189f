"""The options of a retrain on text that ``retrain`` and ``sweep`` share (one help text each), the
batch size, whose default for a text run depends on the model (``text.task.default_batch``), and
the sampled rows of the row penalties (``JobConfig.penalty_rows``)."""

from __future__ import annotations

from contextlib import contextmanager

import typer

from attn_core.cli.common import option
from attn_core.training.config import JobConfig

# built from their one declaration in JobConfig (attn_core.training.settings)
BatchOpt = option(JobConfig, "batch_size")
TextFieldOpt = option(JobConfig, "text_field")
EvalTextOpt = option(JobConfig, "eval_text")
BlockOpt = option(JobConfig, "block")
TrainOpt = option(JobConfig, "train")
KlOpt = option(JobConfig, "kl")
PenaltyRowsOpt = option(JobConfig, "penalty_rows")


@contextmanager
def byte_bars():
    """A progress callback ``(phase, done, total)`` (bytes) drawing one bar per phase on stderr
    (``attn_core.progress``: lines when stderr is not a terminal), with --json too; the bars are
    closed when the block ends."""
    from attn_core.limits import size_text
    from attn_core.progress import Progress

    bars: dict[str, Progress] = {}

    def progress(phase: str, done: int, total: int) -> None:
        if phase not in bars:
            for bar in bars.values():
                bar.close()
            bars[phase] = Progress(max(total, 1), phase, unit="")
        bars[phase].set(done, note=f"{size_text(done)} of {size_text(total)}")

    try:
        yield progress
    finally:
        for bar in bars.values():
            bar.close()


def tokenize_with_bar(source: str, text: str, field=None, eval_text=None, stop=None) -> None:
    """Hash and tokenize a job's text into the cache (in its bounded child, ``text.child``),
    with a progress bar per phase on stderr (:func:`byte_bars`); ``stop()`` true ends it
    (KeyboardInterrupt)."""
    from attn_core.runs import RunStore
    from attn_core.text.source import prepare_text

    with byte_bars() as progress:
        prepare_text(source, text, field, eval_text, RunStore(), progress, stop)


def say_estimate(job) -> None:
    """The estimated duration of a job, one line on stderr, before it starts
    (``training.estimate``)."""
    from attn_core.training import estimate

    cfg, task = job.cfg, job.task
    block = getattr(task, "block", None) or task.seq_len
    if cfg.workers and cfg.gpus_per_worker:  # this machine cannot time the workers' GPUs
        typer.echo(f"estimated duration: not estimated for {cfg.workers} GPU workers from this machine", err=True)
        return
    workers = cfg.workers or 1  # CPU workers: each steps on its share of the batch
    line = estimate.say(
        job.model.cfg,
        cfg.steps,
        -(-job.train_cfg.batch_size // workers),
        block,
        job.device.type,
        cfg.kl,
        eval_every=cfg.eval_every,
        eval_samples=cfg.eval_samples,
        measure_samples=cfg.measure_samples,
        model=job.model,
    )
    if cfg.workers:
        line += f"; on {workers} CPU worker(s), each on its share of the batch, after Ray Train starts them"
    typer.echo(line, err=True)
