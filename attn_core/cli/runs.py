"""Retraining and the run store: ``retrain`` (fine-tune with regularizers; the run is saved),
``runs`` (list) and ``runs show`` (one run)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from attn_core.card import MEASURE_KEYS, public
from attn_core.cli import dynamics as dyn
from attn_core.cli.common import JsonOpt, emit, guarded, table
from attn_core.regularizers import REGULARIZERS
from attn_core.training.config import JobConfig
from attn_core.training.interrupt import SIGINT_EXIT
from attn_core.validate import default

app = typer.Typer()
runs_app = typer.Typer(
    add_completion=False,
    help="List, inspect and import saved runs (the run store: $ATTN_LAB_RUNS, else one per user in the "
    "platform's user data folder).",
)

_RUN_COLS = ["id", "parent", "task", "status", "created", "regularizers", "steps", "accuracy", "entropy_data"]


def _run_row(r: dict) -> dict:
    after = (r.get("summary") or {}).get("after") or {}
    cfg = r.get("config") or {}
    return {
        **{k: r[k] for k in ("id", "parent", "task", "status", "message", "created", "finished")},
        "regularizers": ", ".join(cfg.get("regularizers", [])) or "-",
        "steps": cfg.get("steps"),
        "entmax_alpha": cfg.get("entmax_alpha"),
        "accuracy": after.get("accuracy"),
        "entropy_data": after.get("entropy_data"),
        "has_weights": r.get("has_weights"),
    }


def _before_after(before: dict | None, after: dict | None) -> str:
    rows = [{"": k, "before": (before or {}).get(k), "after": (after or {}).get(k)} for k in MEASURE_KEYS]
    return table(rows, ["", "before", "after"])


@app.command("retrain")
@guarded
def retrain_cmd(
    name: str = typer.Argument(
        ..., help="Zoo model name or folder, run:<id> (fine-tune a run) or scratch:<preset> (fresh init)."
    ),
    reg: list[str] = typer.Option(
        [],
        "--reg",
        help=f"Regularizer NAME[:K][@HEADS]=LAMBDA, repeatable. Names: {', '.join(REGULARIZERS)}; "
        "K for top-k (topk:2=0.1); HEADS like L1 or L0H1,L1H2.",
    ),
    heads: str | None = typer.Option(
        default(JobConfig, "heads"),
        help="Heads of every --reg without its own @HEADS (L1, L0H1,L1H2; default every head).",
    ),
    steps: int = typer.Option(default(JobConfig, "steps"), help="Training steps."),
    seed: int = typer.Option(
        default(JobConfig, "seed"), help="Seed of the training data (the run is deterministic under it)."
    ),
    lr: float = typer.Option(default(JobConfig, "lr"), help="Peak learning rate (warmup, then cosine decay)."),
    entmax_alpha: float | None = typer.Option(
        default(JobConfig, "entmax_alpha"),
        "--entmax-alpha",
        help="Attention: 1 softmax, 1.5 entmax15, 2 sparsemax (default: the parent's).",
    ),
    batch_size: int | None = typer.Option(
        default(JobConfig, "batch_size"), help="Default: the parent's training batch size."
    ),
    device: str = typer.Option(default(JobConfig, "device"), help="auto, cpu or cuda."),
    precision: str = typer.Option(
        default(JobConfig, "precision"),
        help="fp32, or bf16 (autocast: forward and loss in bfloat16, weights and AdamW in fp32).",
    ),
    sync_every: int | None = typer.Option(
        default(JobConfig, "sync_every"),
        "--sync-every",
        help="Steps between two reads of the losses from the device "
        "(default: 1 on CPU, 25 on CUDA); the NaN guard checks "
        "them there and keeps the last good weights.",
    ),
    compile: bool = typer.Option(
        default(JobConfig, "compile"),
        "--compile/--no-compile",
        help="torch.compile the training step (CUDA graphs on CUDA; compiling takes a while, "
        "then each step is faster). Falls back to the eager step if it cannot compile.",
    ),
    checkpoint_every: int | None = dyn.EveryOpt,
    checkpoint_log: int | None = dyn.LogOpt,
    checkpoint_steps: str | None = dyn.StepsOpt,
    checkpoint_params: str = dyn.ParamsOpt,
    checkpoint_max_mb: float | None = dyn.MaxMbOpt,
    as_json: bool = JsonOpt,
):
    """Fine-tune a model with concentration regularizers; the run is saved in the run store.
    Ctrl-C stops it after the current step and saves it (status stopped, exit status 130); a
    run that failed exits 1 with its reason."""
    from attn_core.training.interrupt import sigint_stops
    from attn_core.training.job import TrainingJob

    cfg = JobConfig(
        source=name,
        regularizers=list(reg),
        heads=heads,
        entmax_alpha=entmax_alpha,
        steps=steps,
        seed=seed,
        lr=lr,
        batch_size=batch_size,
        device=device,
        precision=precision,
        sync_every=sync_every,
        compile=compile,
        **dyn.checkpoint_settings(
            checkpoint_every, checkpoint_log, checkpoint_steps, checkpoint_params, checkpoint_max_mb
        ),
    )
    with sigint_stops(exiting=True) as ctrl_c:  # held until the command ends: a late Ctrl-C cannot cut the report
        job = TrainingJob(cfg)
        if job.checkpoints is not None:  # the disk they take, before training
            dyn.say(job.checkpoints.statement(job.model) + "; in the run's folder")
        if ctrl_c.is_set():
            typer.echo("interrupted before training began; nothing was saved", err=True)
            raise typer.Exit(SIGINT_EXIT)
        ctrl_c.then(job.stop)
        if as_json:
            job.run()
        else:
            _run_with_bar(job, name, steps)
        res = job.result()
        _report(res, as_json)
        if ctrl_c.is_set() and res["status"] == "stopped":
            raise typer.Exit(SIGINT_EXIT)


def _report(res: dict, as_json: bool) -> None:
    """Print a retrain's result; a failed run exits 1 with its reason on stderr."""
    out = {
        "run_id": res["run_id"],
        "status": res["status"],
        "message": res["message"],
        "steps": res["steps"],
        "steps_per_s": res["steps_per_s"],
        "before": public(res["before"]),
        "after": public(res["after"]),
    }
    emit(
        out,
        as_json,
        lambda r: f"run {r['run_id']}: {r['status']} ({r['message']})\n" + _before_after(r["before"], r["after"]),
    )
    if res["status"] == "failed":
        typer.echo(f"error: run {res['run_id'] or '(not recorded)'} failed: {res['message']}", err=True)
        raise typer.Exit(1)


def _run_with_bar(job, name: str, steps: int) -> None:
    """Train in the job's thread while a progress bar (lines when stderr is not a terminal)
    follows its snapshots."""
    from attn_core.progress import Progress

    job.start()
    bar = Progress(steps, f"retrain {name}", unit="step")
    try:
        while not job.join(0.25):
            snap = job.snapshot()
            note = None
            if "task_loss" in snap.latest:
                note = f"loss={snap.latest['task_loss']:.3g} H={snap.latest.get('entropy_data', float('nan')):.3f}"
            bar.set(snap.step, note)
    finally:
        bar.set(job.snapshot().step)
        bar.close()


@runs_app.callback(invoke_without_command=True)
@guarded
def runs_cmd(ctx: typer.Context, as_json: bool = JsonOpt):
    """List saved runs, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    from attn_core.runs import RunStore

    store = RunStore()
    rows = [_run_row(r) for r in store.list_runs()]
    emit(
        rows,
        as_json,
        lambda rs: (
            _store_lines(store) + (table(rs, _RUN_COLS) if rs else "no runs yet (attn-lab retrain NAME ... makes one)")
        ),
    )


def _store_lines(store) -> str:
    """Where the store is and why, and the old ``runs/`` folders whose runs it lacks."""
    from attn_core.runs import migrate, root_origin

    lines = [f"run store: {store.root} ({root_origin()})"]
    for old in migrate.legacy_stores(store):
        lines.append(
            f"note: {old['runs']} run(s) in {old['path']} (an older release's store) are not in it; "
            f"`attn-lab runs import {old['path']}` copies them in (the old folder is left as it is)"
        )
    return "\n".join(lines) + "\n"


@runs_app.command("import")
@guarded
def runs_import_cmd(
    source: Path = typer.Argument(..., help="An older run store: a folder with index.sqlite (e.g. ./runs)."),
    as_json: bool = JsonOpt,
):
    """Copy the runs, sweeps and uploads of another run store into this one: runs it already has are skipped, and the source is only read."""
    from attn_core.runs import RunStore, migrate

    store = RunStore()
    counts = migrate.import_store(source, store)
    emit(
        {**counts, "store": str(store.root)},
        as_json,
        lambda c: (
            f"imported {c['runs']} run(s), {c['sweeps']} sweep(s) and {c['uploads']} upload(s) from "
            f"{c['source']} into {c['store']}"
            + (f"; {c['skipped']} skipped (already here, or still running)" if c["skipped"] else "")
        ),
    )


@runs_app.command("show")
@guarded
def runs_show_cmd(
    run_id: str = typer.Argument(..., help="Run id (as listed by `attn-lab runs`)."),
    metrics: bool = typer.Option(False, "--metrics", help="Include the whole metric log (step, name, value)."),
    as_json: bool = JsonOpt,
):
    """One run: its settings, status, before/after measurements, card and final metrics."""
    from attn_core.runs import RunStore
    from attn_core.training.telemetry import MetricKey

    store = RunStore()
    run = store.get(run_id)
    log = store.metrics(run["id"])
    final = {}
    if len(log):
        per_head = [n for n in log["name"].unique() if (key := MetricKey.try_parse(n)) is not None and key.per_head]
        scalar = log[~log["name"].isin(per_head)]  # not the per-head series
        final = scalar.groupby("name", sort=False)["value"].last().to_dict()
    out = {**run, "final": final}
    if metrics:
        out["metrics"] = log.to_dict(orient="records")

    def human(r):
        summ = r.get("summary") or {}
        head = (
            f"run {r['id']} ({r['status']}{': ' + r['message'] if r['message'] else ''})\n"
            f"parent {r['parent']}, task {r['task']}, created {r['created']}\n"
            f"settings: {json.dumps(r['config'])}\n"
        )
        return head + _before_after(summ.get("before"), summ.get("after"))

    emit(out, as_json, human)
