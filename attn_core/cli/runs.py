"""Retraining and the run store: ``retrain`` (fine-tune with regularizers; the run is saved),
``runs`` (list) and ``runs show`` (one run)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from attn_core.card import MEASURE_KEYS, TEXT_MEASURE_KEYS, public
from attn_core.cli import dynamics as dyn
from attn_core.cli import text_options as opts
from attn_core.cli import worker_options as wopts
from attn_core.cli.common import JsonOpt, emit, guarded, settings_options, table
from attn_core.declarations import flagged
from attn_core.regularizers import REGULARIZERS
from attn_core.training.config import JobConfig

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
        "perplexity": after.get("perplexity"),  # runs on text: held-out perplexity
        "entropy_data": after.get("entropy_data"),
        "has_weights": r.get("has_weights"),
    }


def _run_cols(rows: list[dict]) -> list[str]:
    """The listing's columns: held-out perplexity after accuracy when a run on text is listed."""
    if not any(r.get("perplexity") is not None for r in rows):
        return _RUN_COLS
    at = _RUN_COLS.index("accuracy") + 1
    return [*_RUN_COLS[:at], "perplexity", *_RUN_COLS[at:]]


def _before_after(before: dict | None, after: dict | None) -> str:
    keys = MEASURE_KEYS + tuple(k for k in TEXT_MEASURE_KEYS if k in (before or {}) or k in (after or {}))
    rows = [{"": k, "before": (before or {}).get(k), "after": (after or {}).get(k)} for k in keys]
    return table(rows, ["", "before", "after"])


RUN_SETTINGS = flagged(JobConfig)  # every setting of a run the CLI takes


@app.command("retrain")
@guarded
@settings_options(JobConfig, RUN_SETTINGS)
def retrain_cmd(
    name: str = typer.Argument(
        ...,
        help="Zoo model name or folder, a Hugging Face folder (with --text), run:<id> (fine-tune a run) "
        "or scratch:<preset> (fresh init).",
    ),
    reg: list[str] = typer.Option(
        [],
        "--reg",
        help=f"Regularizer NAME[:K][@HEADS]=LAMBDA, repeatable. Names: {', '.join(REGULARIZERS)}; "
        "K for top-k (topk:2=0.1); HEADS like L1 or L0H1,L1H2.",
    ),
    settings: dict = None,  # every setting of the run, its options generated from JobConfig
    address: str | None = wopts.AddressOpt,
    as_json: bool = JsonOpt,
):
    """Fine-tune a model with concentration regularizers; the run is saved in the run store.
    A Hugging Face folder (or a run of one) retrains on --text: next-token loss on blocks of it,
    perplexity measured on held-out text before and after. Ctrl-C (or SIGTERM, SIGHUP) stops it
    after the current step and saves it (status stopped, exit status 130, 143, 129); a run that
    failed exits 1 with its reason. Progress goes to stderr, with --json too."""
    from attn_core.retraining.job import TrainingJob
    from attn_core.training.interrupt import sigint_stops

    settings["checkpoint_steps"] = dyn.parse_steps(settings["checkpoint_steps"])
    cfg = JobConfig(source=name, regularizers=list(reg), **settings)
    if address is not None and cfg.workers is None:
        raise ValueError("--address needs --workers (a retrain joins a Ray cluster only to train on its workers)")
    stop = _RetrainStop()  # what a stop signal says: held until the command ends (a late one cannot cut the report)
    with sigint_stops(exiting=True, line=stop) as ctrl_c:
        if ctrl_c.is_set():  # a stop came before this handler (its interrupt lost inside a library): end now,
            typer.echo(NOTHING_SAVED, err=True)  # within the grace period
            raise typer.Exit(ctrl_c.code)
        try:
            if cfg.text is not None:  # tokenized once, with a progress bar; the job finds it in the cache
                opts.tokenize_with_bar(cfg.source, cfg.text, cfg.text_field, cfg.eval_text, stop=ctrl_c.is_set)
            job = TrainingJob.open(cfg)
        except KeyboardInterrupt:  # the tokenizing child ended at the stop request
            job = None
        statement = job.checkpoint_statement() if job is not None else None
        if statement is not None:  # the disk they take, before training (from the config: no model is built here)
            dyn.say(statement + "; in the run's folder")
        if ctrl_c.is_set() or job is None:
            typer.echo(NOTHING_SAVED, err=True)
            raise typer.Exit(ctrl_c.code)
        if cfg.workers:  # the batch splits over them, Ray is there, the cluster answers: before the estimate
            from attn_core.distributed.remote import check_workers

            check_workers(job, address)
        opts.say_estimate(job)  # it times a few steps: a Ctrl-C may land there too
        stop.training = True  # from here a stop saves what was trained, and its line says so
        if stop.before:  # a stop came before, and its line promised no save
            typer.echo(NOTHING_SAVED, err=True)
            raise typer.Exit(ctrl_c.code)
        ctrl_c.then(job.stop)
        _run_with_bar(job, name, cfg.steps, address)  # progress on stderr, with --json too (stdout holds the JSON)
        refused = getattr(job.remote, "refused", None)
        if refused is not None:  # Ray or the cluster refused it before anything ran: bad input, one line
            raise refused
        res = job.result()
        _report(res, as_json, job)
        if ctrl_c.is_set() and res["status"] == "stopped":
            raise typer.Exit(ctrl_c.code)


NOTHING_SAVED = "interrupted before training began; nothing was saved"


class _RetrainStop:
    """The line of a retrain's first stop signal, true when it comes: before training begins, that
    the command stops (``before`` records it; the command then ends with :data:`NOTHING_SAVED`);
    once training began, that the run stops after the current step and is saved
    (``interrupt.stop_line``)."""

    def __init__(self) -> None:
        self.training = False
        self.before = False

    def __call__(self, signum: int | None) -> str:
        from attn_core.training.interrupt import said, stop_line

        if self.training:
            return stop_line(signum)
        self.before = True
        return f"\n{said(signum)}: stopping before training begins"


def _per_head(measured: dict | None) -> list[dict] | None:
    """A text run's per-head before/after, compact: entropy, top-1 mass, sigma_1 and stable rank
    of B, and for rotary heads sigma_1(B(delta)) over the offsets."""
    if not measured or "per_head" not in measured:
        return None
    keep = ("head", "entropy_data", "top1_data", "entropy_vocab", "stable_rank", "offset_sigma1")
    return [
        {**{k: r[k] for k in keep if k in r}, "sigma1": (r.get("singular_values") or [None])[0]}
        for r in measured["per_head"]
    ]


def _report(res: dict, as_json: bool, job=None) -> None:
    """Print a retrain's result; a failed run exits 1 with its reason on stderr."""
    out = {
        "run_id": res["run_id"],
        "status": res["status"],
        "message": res["message"],
        "steps": res["steps"],
        "steps_per_s": res["steps_per_s"],
        "compile_s": res.get("compile_s", 0.0),  # compiling (--compile), not counted in steps_per_s
        "before": public(res["before"]),
        "after": public(res["after"]),
    }
    facts = getattr(getattr(job, "task", None), "facts", None)
    if facts is not None:  # a run on text: the corpus, per-head detail and throughput in tokens
        cfg = job.train_cfg
        rate = res.get("steps_per_s")
        out["text"] = facts
        out["batch_size"] = cfg.batch_size  # a text run's default depends on the model (text.task.default_batch)
        out["tokens_per_s"] = rate * cfg.batch_size * facts["block"] if rate else None
        for when in ("before", "after"):
            if out[when] is not None:
                out[when]["per_head"] = _per_head(res[when])
        trained = job.state()["trained"]  # what --train let learn, from the run's card (built where it trained)
        if trained is not None:
            out["trained"] = trained
    if job is not None and not job.cfg.workers:  # where the command's time went
        out["phases_s"] = job.phase_seconds()
    if job is not None and job.cfg.penalty_rows is not None:  # how the row penalties were computed
        out["penalty"] = job.penalty.estimate(job.task.n_ctx)
    if job is not None and job.penalty.paths:  # the path each penalty took (steps taken in this process)
        out["penalty_paths"] = dict(job.penalty.paths)

    def human(r: dict) -> str:
        text = f"run {r['run_id']}: {r['status']} ({r['message']})\n"
        text += f"compiled in {r['compile_s']:.1f} s (apart from steps/s)\n" if r["compile_s"] else ""
        if "text" in r:
            t = r["text"]
            text += (
                f"text {t['path']}: {t['tokens']:,} tokens ({t['train_tokens']:,} to train on, "
                f"{t['held_out_tokens']:,} held out), batches of {r['batch_size']} blocks of {t['block']} tokens"
                + (f"; {r['tokens_per_s']:,.0f} tokens/s" if r.get("tokens_per_s") else "")
                + "\n"
            )
        if "penalty" in r:
            p = r["penalty"]
            text += {
                "sampled": f"row penalties: {p['rows']} of {p['positions']} query rows per head sampled each step "
                "(unbiased estimate)\n",
                "exact": f"row penalties: every row (--penalty-rows {p['rows']} covers the {p['positions']} positions)\n",
                "none": "row penalties: none to sample (--penalty-rows acts on entropy, hoyer and topk)\n",
            }[p["estimate"]]
        if "penalty_paths" in r:
            text += "penalties computed by " + "; ".join(f"{k}: {v}" for k, v in r["penalty_paths"].items()) + "\n"
        strip = lambda m: {k: v for k, v in (m or {}).items() if k != "per_head"}  # noqa: E731
        return text + _before_after(strip(r["before"]), strip(r["after"]))

    emit(out, as_json, human)
    if res["status"] == "failed":
        typer.echo(f"error: run {res['run_id'] or '(not recorded)'} failed: {res['message']}", err=True)
        raise typer.Exit(1)


def _run_with_bar(job, name: str, steps: int, address: str | None = None) -> None:
    """Train in the job's thread while a progress bar (lines when stderr is not a terminal)
    follows its snapshots."""
    from attn_core.progress import Progress
    from attn_core.training.estimate import range_text

    job.start(address=address)
    bar = Progress(steps, f"retrain {name}", unit="step")
    try:
        while not job.join(0.25):
            snap = job.snapshot()
            note = snap.message or None  # e.g. starting the workers on Ray
            if "task_loss" in snap.latest:
                note = f"loss={snap.latest['task_loss']:.3g} H={snap.latest.get('entropy_data', float('nan')):.3f}"
                if snap.left_s is not None:  # refined from the measured steps
                    note += f", {range_text(*snap.left_s)} left"
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
            _store_lines(store)
            + (table(rs, _run_cols(rs)) if rs else "no runs yet (attn-lab retrain NAME ... makes one)")
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


def _settings(config: dict | None, width: int = 100) -> str:
    """A run's settings as ``key=value`` words wrapped at ``width`` (unset ones left out: None,
    an empty list); ``--json`` has them all."""
    import textwrap

    def value(v) -> str:
        if isinstance(v, (list, tuple)):
            return ",".join(value(x) for x in v)
        return v if isinstance(v, str) else json.dumps(v)

    words = [f"{k}={value(v)}" for k, v in (config or {}).items() if v is not None and v != [] and v != {}]
    return textwrap.fill(
        " ".join(words) or "none",
        width,
        initial_indent="settings: ",
        subsequent_indent="  ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def _trained_on(run: dict) -> str:
    """How a run was trained, in one line: in one process on a device, or on Ray Train workers."""
    card = run.get("card") or {}  # card.json: a run's own sections are top-level keys
    spread = card.get("distributed")
    if spread:
        return (
            f"trained on {spread['workers']} Ray Train worker(s): {spread['strategy']}, {spread['backend']} backend, "
            f"{spread['device']} devices\n"
        )
    if (run.get("config") or {}).get("workers"):  # ended before its card was written
        cfg = run["config"]
        return f"trained on {cfg['workers']} Ray Train worker(s): {cfg.get('strategy', 'ddp')}\n"
    return f"trained in one process on {card['device']}\n" if card.get("device") else ""


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
            f"{_settings(r['config'])}\n"
        )
        return head + _trained_on(r) + _before_after(summ.get("before"), summ.get("after"))

    emit(out, as_json, human)
