"""Training dynamics: the checkpoint options that ``train``, ``retrain`` and ``sweep`` share, and
``dynamics`` (metrics of every checkpoint of a series, the phase change, the animation)."""

from __future__ import annotations

import typer

from attn_core.training.config import JobConfig
from attn_core.validate import default

app = typer.Typer()

# --- the checkpoint options of train, retrain and sweep ---------------------------------------------

EveryOpt = typer.Option(
    default(JobConfig, "checkpoint_every"),
    "--checkpoint-every",
    help="Keep the weights every N steps (and at step 0 and the last step) as safetensors in the run's "
    "checkpoints/ folder, listed in its card.",
)
LogOpt = typer.Option(
    default(JobConfig, "checkpoint_log"),
    "--checkpoint-log",
    help="Keep the weights at N steps spaced evenly in log(step) from 1 to the end (dense early, where "
    "circuits form); combines with --checkpoint-every.",
)
StepsOpt = typer.Option(
    None, "--checkpoint-steps", help="Keep the weights at these steps too, comma-separated (0,50,100)."
)
ParamsOpt = typer.Option(
    default(JobConfig, "checkpoint_params"),
    "--checkpoint-params",
    help="all, or attn: only attention and LayerNorm weights (what the QK/OV views need; much smaller "
    "for large models).",
)
MaxMbOpt = typer.Option(
    default(JobConfig, "checkpoint_max_mb"),
    "--checkpoint-max-mb",
    help="Refuse, before training, checkpoints that would take more than this many MiB (default 1024).",
)


def parse_steps(text: str | None) -> list[int] | None:
    """``"0,50,100"`` as steps; one clear line for anything else."""
    if text is None or not text.strip():
        return None
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"--checkpoint-steps takes whole numbers separated by commas (0,50,100), got {part!r}")
        out.append(int(part))
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
    from attn_core.training.checkpoints import CheckpointPlan

    return CheckpointPlan.of(every, log, parse_steps(steps) or (), params, max_mb)


def say(line: str) -> None:
    """A statement made before work starts (stderr, so --json output stays one document)."""
    typer.echo(line, err=True)
