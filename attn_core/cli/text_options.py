"""The options of a retrain on text that ``retrain`` and ``sweep`` share (one help text each), the
batch size, whose default for a text run depends on the model (``text.task.default_batch``), and
the sampled rows of the row penalties (``JobConfig.penalty_rows``)."""

from __future__ import annotations

from contextlib import contextmanager

import typer

from attn_core.text.defaults import DEFAULT_BLOCK, HELD_OUT_FRACTION, MAX_DEFAULT_BATCH, STEP_MEMORY
from attn_core.training.config import MAX_PENALTY_ROWS, TRAIN_HELP, JobConfig
from attn_core.validate import default

BatchOpt = typer.Option(
    default(JobConfig, "batch_size"),
    "--batch-size",
    help="Sequences per training step. Default: the parent's training batch size; a model without one "
    f"(an imported model on --text) takes the most blocks, a power of two up to {MAX_DEFAULT_BATCH}, whose "
    f"step is estimated to add at most {STEP_MEMORY / 2**30:g} GiB (fp32): {MAX_DEFAULT_BATCH} for small "
    "vocabularies, 4 for GPT-2 small at --block 256 (the output says which).",
)
TextFieldOpt = typer.Option(
    default(JobConfig, "text_field"), "--text-field", help="The text's JSON key or Parquet column (default text)."
)
EvalTextOpt = typer.Option(
    default(JobConfig, "eval_text"),
    "--eval-text",
    help=f"Held-out text (same formats); default the last {HELD_OUT_FRACTION:.0%} of --text.",
)
BlockOpt = typer.Option(
    default(JobConfig, "block"),
    "--block",
    help=f"Tokens per training sequence (default min(context, {DEFAULT_BLOCK})).",
)
TrainOpt = typer.Option(default(JobConfig, "train"), "--train", help=TRAIN_HELP)
KlOpt = typer.Option(
    default(JobConfig, "kl"),
    "--kl",
    help="Add LAMBDA * KL(starting model || model) per token on the training batch, to keep behaviour "
    "while heads concentrate (0: off).",
)
PenaltyRowsOpt = typer.Option(
    default(JobConfig, "penalty_rows"),
    "--penalty-rows",
    metavar="M",
    help="Estimate the row penalties (entropy, hoyer, topk, sink) from M query rows per head drawn at random each "
    "step instead of every row: unbiased for the value and its gradient, cheaper on long sequences. "
    f"1..{MAX_PENALTY_ROWS:,}; M at least the sequence length computes every row (default: every row).",
)


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
