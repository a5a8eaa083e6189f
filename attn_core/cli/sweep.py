"""Sweeps on Ray: ``sweep`` (regularizer x lambda x seed retrains of one model, plus a lambda = 0
baseline per seed, run as Ray Tune trials and recorded as runs of one sweep), ``sweeps`` (list)
and ``sweeps show`` (one sweep, its trials and Pareto frontier)."""

from __future__ import annotations

import typer

from attn_core.cli import dynamics as dyn
from attn_core.cli import text_options as opts
from attn_core.cli import worker_options as wopts
from attn_core.cli.common import JsonOpt, emit, guarded, report, settings_options, table
from attn_core.training.config import JobConfig

app = typer.Typer()
sweeps_app = typer.Typer(add_completion=False, help="List and inspect sweeps (groups of runs made by attn-lab sweep).")

_TRIAL_COLS = ["run_id", "reg", "lambda", "seed", "status", "accuracy", "entropy_data", "pareto"]
_TEXT_COLS = ["run_id", "reg", "lambda", "seed", "status", "perplexity", "entropy_data", "pareto"]
_SWEEP_COLS = ["id", "name", "status", "created", "trials", "recorded", "address", "wall_s"]


def _trial_rows(res: dict) -> list[dict]:
    front = set(res["pareto"])
    return [
        {
            **t,
            "accuracy": (t["after"] or {}).get("accuracy"),
            "perplexity": (t["after"] or {}).get("perplexity"),
            "entropy_data": (t["after"] or {}).get("entropy_data"),
            "pareto": "*" if t["run_id"] in front else "",
        }
        for t in res["trials"]
    ]


def _human(res: dict) -> str:
    head = (
        f"sweep {res['sweep_id']} ({res['status']}{': ' + res['message'] if res['message'] else ''}) on "
        f"{res['backend']} {res['ray_version'] or ''} at {res['address'] or '-'}, "
        f"{res['wall_s'] if res['wall_s'] is not None else '-'} s\n"
    )
    rows = _trial_rows(res)
    text = any(r["perplexity"] is not None for r in rows)  # a sweep on text: perplexity, not accuracy
    quality = "held-out perplexity down" if text else "accuracy up"
    return (
        head
        + table(rows, _TEXT_COLS if text else _TRIAL_COLS)
        + f"\n* = on the Pareto frontier ({quality}, data entropy down)"
    )


def _output(res: dict) -> dict:
    keys = ("run_id", "key", "reg", "lambda", "seed", "status", "message", "before", "after")
    return {
        k: res[k] for k in ("sweep_id", "name", "status", "message", "backend", "ray_version", "address", "wall_s")
    } | {"trials": [{k: t[k] for k in keys} for t in res["trials"]], "pareto": res["pareto"]}


SWEEP_SETTINGS = ("heads", "steps", "lr", "batch_size", *dyn.CHECKPOINT_SETTINGS, "text", "text_field", "eval_text")
SWEEP_SETTINGS += ("block", "train", "kl", "penalty_rows", "gpus_per_worker", "strategy")
SWEEP_WORDING = dict(
    heads="Regularized heads (L1, L0H1,L1H2; default every head).",
    text="Sweep a Hugging Face folder (or a run of one) on this text, as retrain --text reads it; it is "
    "tokenized once, before the trials, into the run store's text-cache (workers must see the path).",
)


@app.command("sweep")
@guarded
@settings_options(JobConfig, SWEEP_SETTINGS, **SWEEP_WORDING)
def sweep_cmd(
    name: str = typer.Argument(
        ..., help="The model to sweep: zoo name or folder, run:<id> or scratch:<preset> (as attn-lab retrain takes it)."
    ),
    grid: list[str] = typer.Option(
        [],
        "--grid",
        help="NAME=LAMBDA[,LAMBDA...], repeatable "
        "(--grid entropy=0.01,0.1,1 --grid hoyer=0.1,1); NAME as in --reg of "
        "retrain (entropy, hoyer, topk:2, vocab_entropy@L1 ...).",
    ),
    seeds: int = typer.Option(1, help="Seeds 0..N-1 per setting (each with its lambda = 0 baseline)."),
    settings: dict = None,  # the run settings a sweep takes, their options generated from JobConfig
    address: str | None = wopts.AddressOpt,
    cpus_per_trial: float = typer.Option(1.0, help="CPUs per trial (torch threads = its integer part)."),
    gpus_per_trial: float = typer.Option(
        0.0, help="GPUs per trial; fractions share a GPU (0.25 = four trials per GPU); > 0 trains on cuda."
    ),
    scheduler: str = typer.Option("none", help="none, or asha (stops poor trials early on their loss)."),
    resume: str | None = typer.Option(
        None, help="Resume sweep ID: run only its unfinished trials (NAME and the grid are then taken from the sweep)."
    ),
    workers_per_trial: int | None = typer.Option(
        None,
        "--workers-per-trial",
        metavar="N",
        help="Train each trial on N Ray Train workers (as retrain --workers N: the trial is Ray Train's per-trial "
        "driver); trials run at once as the cluster holds their workers.",
    ),
    as_json: bool = JsonOpt,
):
    """Sweep regularizers x lambdas x seeds on Ray; every trial is a retrain recorded as a run.
    Everything a trial would refuse is refused first (exit 2). Ctrl-C (or SIGTERM, SIGHUP) stops
    the running trials, records them and prints the sweep (exit 130, 143, 129; --resume ID
    finishes it); a sweep whose every trial failed exits 1 and says why. Progress goes to
    stderr, with --json too."""
    from attn_core.sweep import SweepInterrupted, run_sweep
    from attn_core.training.interrupt import said, sigint_stops

    def notice(text: str) -> None:
        typer.echo(
            f"\n{said(ctrl_c.signum)}: stopping the running trials and recording them (the sweep can be resumed)",
            err=True,
        )

    with sigint_stops(notice=notice, exiting=True) as ctrl_c:
        plan = None
        text, text_field, eval_text = (settings[k] for k in ("text", "text_field", "eval_text"))
        if resume is None and text is not None:  # tokenized once with a progress bar; the trials find it
            try:
                opts.tokenize_with_bar(name, text, text_field, eval_text, stop=ctrl_c.is_set)
            except KeyboardInterrupt:
                typer.echo("interrupted before the sweep began; nothing was run", err=True)
                raise typer.Exit(ctrl_c.code) from None
        if resume is None:
            ckpt = dyn.checkpoint_settings(*(settings[k] for k in dyn.CHECKPOINT_SETTINGS))
            text_options = dict(text=text, text_field=text_field, eval_text=eval_text, block=settings["block"])
            train, kl, gpus, strategy = (settings[k] for k in ("train", "kl", "gpus_per_worker", "strategy"))
            tuning = dict(train=train if train != "all" else None, kl=kl or None, penalty_rows=settings["penalty_rows"])
            tuning.update(  # on workers: recorded only when asked for (a plan without them is as it was)
                workers=workers_per_trial,
                gpus_per_worker=gpus or None,
                strategy=strategy if strategy != "ddp" else None,
            )
            recipe = (settings[k] for k in ("steps", "lr", "heads", "batch_size"))
            plan = sweep_plan(name, grid, seeds, *recipe, **ckpt, **text_options, **tuning)
        try:
            res = run_sweep(
                plan,
                resume=resume,
                address=address,
                cpus_per_trial=cpus_per_trial,
                gpus_per_trial=gpus_per_trial,
                scheduler=scheduler,
                on_trial=_say_trial,  # on stderr, with --json too (stdout holds the JSON)
                stop=ctrl_c.is_set,
                stopped_by=lambda: said(ctrl_c.signum),
            )
        except SweepInterrupted as e:
            raise typer.Exit(report(str(e), as_json, "interrupted", ctrl_c.code)) from None
        emit(_output(res), as_json, lambda _: _human(res))
        if ctrl_c.is_set():
            typer.echo(
                f"interrupted by {said(ctrl_c.signum)} ({res['message']}); "
                f"attn-lab sweep {res['name']} --resume {res['sweep_id']} finishes it",
                err=True,
            )
            raise typer.Exit(ctrl_c.code)
        if res["status"] == "failed":
            typer.echo(f"error: sweep {res['sweep_id']} failed: {res['message']}", err=True)
            raise typer.Exit(1)


def sweep_plan(name: str, grid: list[str], seeds: int, steps: int, lr: float, heads, batch_size, **options):
    """The plan of ``attn-lab sweep`` from its options (checked by ``run_sweep`` before anything
    starts: ``attn_core.sweep.check_sweep``); the place to add a trial option."""
    from attn_core.sweep import grid_plan

    return grid_plan(name, grid, seeds, steps=steps, lr=lr, heads=heads, batch_size=batch_size, **options)


def _say_trial(run_id: str, payload: dict) -> None:
    after = payload.get("after") or {}
    if "perplexity" in after:
        said = f" (perplexity {after['perplexity']:.4g}, H_data {after['entropy_data']:.3f})"
    elif "accuracy" in after:
        said = f" (accuracy {after['accuracy']:.4f}, H_data {after['entropy_data']:.3f})"
    else:
        said = f" ({payload.get('message', '')})"
    typer.echo(f"  {payload['key']}: {payload['status']} -> run {run_id}{said}", err=True)


@sweeps_app.callback(invoke_without_command=True)
@guarded
def sweeps_cmd(ctx: typer.Context, as_json: bool = JsonOpt):
    """List sweeps, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    from attn_core.runs import RunStore

    rows = [
        {
            "id": s["id"],
            "name": s["name"],
            "status": s["status"],
            "message": s["message"],
            "created": s["created"],
            "finished": s["finished"],
            "trials": s["trials"],
            "recorded": sum(s["counts"].values()),
            "counts": s["counts"],
            "address": s["info"].get("address"),
            "ray_version": s["info"].get("ray_version"),
            "wall_s": s["info"].get("wall_s"),
        }
        for s in RunStore().list_sweeps()
    ]
    emit(rows, as_json, lambda rs: table(rs, _SWEEP_COLS) if rs else "no sweeps yet (attn-lab sweep NAME --grid ...)")


@sweeps_app.command("show")
@guarded
def sweeps_show_cmd(
    sweep_id: str = typer.Argument(..., help="Sweep id (as listed by `attn-lab sweeps`)."), as_json: bool = JsonOpt
):
    """One sweep: its trials (run id, regularizer, lambda, seed, status, before/after) and Pareto frontier."""
    from attn_core.runs import RunStore
    from attn_core.sweep import sweep_result

    res = sweep_result(RunStore(), sweep_id)
    emit(_output(res) | {"created": res["created"], "job": res["job"]}, as_json, lambda _: _human(res))
