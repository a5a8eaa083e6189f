"""Training dynamics: the checkpoint options that ``train``, ``retrain`` and ``sweep`` share, and
``dynamics`` (metrics of every checkpoint of a series, the phase change, the animation)."""

from __future__ import annotations

from pathlib import Path

import typer

from attn_core.cli.common import JsonOpt, emit, guarded
from attn_core.text.corpus import MAX_WORDS_BYTES, TEXT_LIMIT
from attn_core.training.config import JobConfig
from attn_core.validate import default

app = typer.Typer()

# --- the checkpoint options of train, retrain and sweep ---------------------------------------------

# generated from their one declaration in JobConfig (common.settings_options), in this order
CHECKPOINT_SETTINGS = (
    "checkpoint_every",
    "checkpoint_log",
    "checkpoint_steps",
    "checkpoint_params",
    "checkpoint_max_mb",
)


def parse_steps(text: str | None) -> list[int] | None:
    """``"0,50,100"`` as steps; one clear line for anything else."""
    if text is None or not text.strip():
        return None
    from attn_core.validate import whole_number

    out = []
    for part in text.split(","):
        number = whole_number(part.strip())
        if number is None:
            raise ValueError(
                f"--checkpoint-steps takes whole numbers separated by commas (0,50,100), got {part.strip()[:40]!r}"
            )
        out.append(number)
    return out


def checkpoint_settings(every, log, steps, params, max_mb) -> dict:
    """The JobConfig fields of the options (unset ones left out)."""
    raw = {
        "checkpoint_every": every,
        "checkpoint_log": log,
        "checkpoint_steps": parse_steps(steps),
        "checkpoint_params": params if params != default(JobConfig, "checkpoint_params") else None,
        "checkpoint_max_mb": max_mb,
    }
    return {k: v for k, v in raw.items() if v is not None}


def checkpoint_plan(every, log, steps, params, max_mb):
    """The plan of the options (None: keep nothing); checked like a JobConfig's."""
    from attn_core.training.checkpoint_plan import CheckpointPlan

    return CheckpointPlan.of(every, log, parse_steps(steps) or (), params, max_mb)


def say(line: str) -> None:
    """A statement made before work starts (stderr, so --json output stays one document)."""
    typer.echo(line, err=True)


# --- attn-lab dynamics ----------------------------------------------------------------------------


def _span(option: str, text: str | None) -> tuple[int, int] | None:
    """``"A:B"`` as positions [A, B)."""
    if text is None:
        return None
    from attn_core.validate import whole_number

    a, sep, b = text.partition(":")
    a, b = whole_number(a.strip()), whole_number(b.strip())
    if not sep or a is None or b is None:
        raise ValueError(f"{option} takes positions A:B (from A up to, not including, B), got {text[:60]!r}")
    return a, b


def _steps(text: str | None) -> list[int] | None:
    if text is None:
        return None
    from attn_core.validate import whole_number

    parts = [whole_number(p.strip()) for p in text.split(",")]
    if any(p is None for p in parts):
        raise ValueError(f"--steps takes whole numbers separated by commas, one per model, got {text[:80]!r}")
    return parts


def _human(res: dict, dyn) -> str:
    from attn_core.cli.common import table

    head = [f"inputs: {dyn.inputs}"]
    cols = ["step", *(["tokens"] if res["tokens"] else []), "loss", "icl_score"]
    rows = [
        {
            "step": s,
            "tokens": (res["tokens"] or [None] * len(res["steps"]))[i],
            "loss": res["metrics"]["loss"][i],
            "icl_score": res["metrics"]["icl_score"][i],
        }
        for i, s in enumerate(res["steps"])
    ]
    from attn_core.dynamics import describe_phase

    return "\n".join([*head, table(rows, cols), describe_phase(res["phase_change"])])


def _check_animate(animate: Path | None, series=None) -> None:
    """--animate follows the output rule of every command (``destinations.check_destination``):
    its name first, then, once the series is listed (nothing written yet), its place, never
    inside the folders measured."""
    from attn_core.destinations import check_destination

    if animate is None:
        return
    if animate.suffix.lower() != ".html":
        raise ValueError(f"--animate writes an HTML file (name.html), got {str(animate)!r}")
    if series is not None:
        check_destination(animate, "--animate", outside=series.folders, doing="measured")


@app.command("dynamics")
@guarded
def dynamics_cmd(
    sources: list[str] = typer.Argument(
        ...,
        help="One run (run:<id>) or model folder holding checkpoints/, a checkpoints folder, a folder of model "
        "folders one per checkpoint (step1000/ ... or listed in series.json / series.csv), or several models "
        "(folders, Hugging Face folders) ordered by --steps or the step their names carry (step1000, checkpoint-1000).",
    ),
    steps: str | None = typer.Option(
        None, "--steps", help="The training step of each model, comma-separated, in order."
    ),
    samples: int = typer.Option(256, help="Held-out sequences (or text windows) the metrics are measured on."),
    seed: int = typer.Option(0, help="Seed of the held-out sequences and of the detectors' sequences."),
    detector_samples: int = typer.Option(
        32, help="Generated sequences of the prefix-matching and previous-token scores."
    ),
    early: str | None = typer.Option(None, "--early", help="Early positions A:B of the ICL score (default 1:1+T/8)."),
    late: str | None = typer.Option(None, "--late", help="Late positions C:D of the ICL score (default T-T/8:T)."),
    text: Path | None = typer.Option(
        None,
        "--text",
        help=f"Measure on windows of this text (a .txt, .jsonl or .parquet file, or a folder of them; {TEXT_LIMIT}), "
        "tokenized by the models' tokenizer.json as retrain, spectrum and sinks read theirs; models without one read "
        f"space-separated token names of their task (a UTF-8 file of at most {MAX_WORDS_BYTES // 2**20} MiB).",
    ),
    length: int | None = typer.Option(None, help="Tokens per text window (default: the context, at most 128)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Measure every checkpoint again, ignoring the cache."),
    animate: Path | None = typer.Option(
        None,
        "--animate",
        help="Also write the animation (one head's heatmap and spectrum across steps) to this new .html file "
        "(never inside the shipped zoo, a model folder or the folders measured).",
    ),
    layer: int = typer.Option(0, help="Layer of the animated head."),
    head: int = typer.Option(0, help="Head of the animated head."),
    value: str = typer.Option("scores", help="What the animated heatmap shows: scores or pattern."),
    as_json: bool = JsonOpt,
):
    """Metrics of every checkpoint of a series (loss, ICL score, prefix matching, previous token,
    K-composition, entropy and its floor, sigma_1 and stable rank of B, copying) and the phase
    change, measured on held-out inputs with a fixed seed; each checkpoint's result is cached. A
    checkpoint that cannot be read is skipped with its reason (stderr, and "skipped" in the JSON)."""
    from attn_core import dynamics as D
    from attn_core import limits
    from attn_core.documents import dynamics_inputs
    from attn_core.figures import dynamics as fd
    from attn_core.figures.base import write_plot
    from attn_core.figures.bilinear import VALUES
    from attn_core.progress import Progress
    from attn_core.validate import check_seed

    limits.check_count("--samples", samples, hi=limits.MAX_SAMPLES)  # before the series is read
    limits.check_count("--detector-samples", detector_samples, hi=4096)
    check_seed("--seed", seed)
    if value not in VALUES:
        raise ValueError(f"--value must be one of {', '.join(VALUES)}, got {value!r}")
    _check_animate(animate)
    series = D.series(list(sources), _steps(steps))
    _check_animate(animate, series)
    for s in series.skipped:
        say(f"skipped {s.line()}")
    early_span, late_span = _span("--early", early), _span("--late", late)
    if animate is not None:
        from types import SimpleNamespace

        from attn_core.bilinear import check_heads, check_layer

        check_layer(SimpleNamespace(cfg=series.config), layer)
        check_heads(SimpleNamespace(cfg=series.config), head)
    inputs = dynamics_inputs(series, samples, seed, early_span, late_span, text, length)
    cache = None if no_cache else D.MetricCache()
    bar = Progress(len(series.members), "dynamics", unit="checkpoint")  # stderr, with --json too
    try:
        dyn = D.dynamics(
            series,
            inputs,
            detector_samples=detector_samples,
            seed=seed,
            cache=cache,
            progress=(lambda done, total: bar.set(done)) if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.close()
    for s in dyn.skipped:
        if s not in series.skipped:  # could not be loaded
            say(f"skipped {s.line()}")
    if cache is not None:
        refused = (
            f"; {dyn.refused} {'entry' if dyn.refused == 1 else 'entries'} refused and measured again "
            f"({'; '.join(dyn.reasons[:2])})"
            if dyn.refused
            else ""
        )
        say(f"cache: {dyn.hits} of {len(dyn.steps)} checkpoints read from {cache.folder}{refused}")
    if animate is not None:
        views, spectra = D.step_views(series, inputs.tokens[0].tolist(), layer, head, steps=dyn.steps)
        write_plot(fd.animation_plot(dyn.steps, views, spectra, head, value), animate, what="--animate")
        say(f"wrote the animation of L{layer}H{head} across {len(dyn.steps)} steps to {animate}")
    res = dyn.to_json()
    emit(res, as_json, lambda r: _human(r, dyn))
