"""Model commands: ``zoo`` (list), ``eval`` (held-out accuracy), ``train`` (a preset from
scratch) and ``presets`` (the recipes)."""

from __future__ import annotations

from pathlib import Path

import typer

from attn_core import limits
from attn_core.cli import dynamics as dyn
from attn_core.cli.common import JsonOpt, command_line, emit, guarded, needs_task, settings_options, table
from attn_core.declarations import declared
from attn_core.device import check_precision, check_threads
from attn_core.training.config import JobConfig, TrainConfig

app = typer.Typer()


@app.command("zoo")
@guarded
def zoo_cmd(as_json: bool = JsonOpt):
    """List the shipped models and those in $ATTN_LAB_MODELS."""
    from attn_core import zoo

    rows = zoo.list_models()
    for r in rows:
        r.pop("path", None)
    emit(
        rows,
        as_json,
        lambda rs: table(
            rs, ["name", "task", "n_layers", "n_heads", "d_model", "d_head", "qk", "d_mlp", "params", "accuracy"]
        ),
    )


@app.command("eval")
@guarded
def eval_cmd(
    name: str = typer.Argument(..., help="Zoo model name or path to a model folder."),
    samples: int = typer.Option(512, help="Number of held-out sequences."),
    seed: int = typer.Option(0, help="Seed of the held-out samples."),
    as_json: bool = JsonOpt,
):
    """Accuracy and loss of a model on fresh held-out samples of its task."""
    from attn_core.sources import resolve
    from attn_core.training.trainer import evaluate

    limits.check_count("--samples", samples, hi=limits.MAX_SAMPLES)
    loaded = resolve(name)
    limits.check_forward("--samples", samples, loaded.config)  # the memory it needs
    needs_task(loaded, "it cannot be evaluated")
    res = evaluate(loaded.model, loaded.task, samples=samples, seed=seed)
    emit(
        {
            "name": loaded.name,
            "task": loaded.task.name,
            "accuracy": res["accuracy"],
            "loss": res["loss"],
            "samples": samples,
            "seed": seed,
        },
        as_json,
        lambda r: (
            f"{r['name']} ({r['task']}): accuracy {r['accuracy']:.4f}, loss {r['loss']:.4g} on {r['samples']} "
            f"held-out samples (seed {r['seed']})"
        ),
    )


PRESET_SETTINGS = ("steps", "seed", "device")  # train's options that override the preset's recipe


@app.command("train")
@guarded
@settings_options(
    JobConfig,
    ("steps", "seed", "device", "precision", "compile", "threads", *dyn.CHECKPOINT_SETTINGS),
    unset=PRESET_SETTINGS,  # unset: the preset's
    **{name: declared(TrainConfig, name)["help"] for name in PRESET_SETTINGS},  # train's own wording
)
def train_cmd(
    preset: str = typer.Option(..., help="Preset name (see `attn-lab presets`)."),
    out: Path | None = typer.Option(None, help="Folder to save the model in (must not exist)."),
    settings: dict = None,  # the settings train shares with retrain, their options generated from JobConfig
    as_json: bool = JsonOpt,
):
    """Train a preset from scratch; with --out, save model.safetensors, config.json and card.json
    (and with --checkpoint-every/--checkpoint-log the weights across training in checkpoints/).
    Ctrl-C ends it (exit status 130) without writing --out."""
    from attn_core.destinations import check_destination
    from attn_core.presets import train_preset
    from attn_core.training.interrupt import exit_on_ctrl_c

    steps, seed, device = (settings[k] for k in PRESET_SETTINGS)
    if steps is not None and steps <= 0:
        raise ValueError(f"--steps must be positive, got {steps}")
    precision, compile, threads = settings["precision"], settings["compile"], settings["threads"]
    check_precision(precision, prefix="--precision: ")
    check_threads(threads, prefix="--threads: ")
    plan = dyn.checkpoint_plan(*(settings[k] for k in dyn.CHECKPOINT_SETTINGS))
    if plan is not None and out is None:
        raise ValueError("checkpoints need a folder to go in: give --out")
    if out is not None:
        check_destination(out)  # before training, not after it
    with exit_on_ctrl_c("nothing was saved" + (f" ({out} was not written)" if out else "")):
        card = train_preset(
            preset,
            out=out,
            steps=steps,
            seed=seed,
            device=device,
            progress=True,  # on stderr, with --json too (stdout holds the JSON)
            command=command_line(),
            precision=precision,
            compile=compile,
            checkpoints=plan,
            on_plan=dyn.say,
            threads=threads,
        )
    result = {"preset": preset, "out": str(out) if out else None, **card}
    emit(
        result,
        as_json,
        lambda r: (
            f"{r['preset']}: accuracy {r['metrics']['accuracy']:.4f} on 512 held-out "
            f"samples, {r['wall_time_s']:.1f} s" + (f", saved to {r['out']}" if r["out"] else "")
        ),
    )


@app.command("presets")
@guarded
def presets_cmd(as_json: bool = JsonOpt):
    """The training recipes of the zoo."""
    from attn_core.presets import PRESETS

    rows = [
        {"name": p.name, "task": p.task, **p.model, "steps": p.train.steps, "description": p.description}
        for p in PRESETS.values()
    ]
    emit(rows, as_json, lambda rs: table(rs, ["name", "task", "n_layers", "n_heads", "d_model", "steps"]))
