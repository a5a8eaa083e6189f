"""The ``attn-lab`` command (also ``python -m attn_core``). Every command takes ``--json`` and
then prints exactly one JSON document on stdout; errors go to stderr as one line, exit code 2."""
from __future__ import annotations

import functools
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="attn-lab: see, measure, regularize and retrain the QK bilinear form of attention.")

JsonOpt = typer.Option(False, "--json", help="Print one JSON document on stdout.")


def _clean(obj: Any) -> Any:
    """JSON-safe: tensors/arrays to lists, non-finite floats to null."""
    if hasattr(obj, "tolist"):
        obj = obj.tolist()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def emit(obj: Any, as_json: bool, human: Optional[Callable[[Any], str]] = None) -> None:
    if as_json:
        typer.echo(json.dumps(_clean(obj)))
    else:
        typer.echo(human(obj) if human else json.dumps(_clean(obj), indent=2))


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def guarded(fn: Callable) -> Callable:
    """Turn expected errors (bad input, bad files) into one clear line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, KeyError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            fail(str(msg))

    return wrapper


def _table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))

    widths = {c: max(len(c), *(len(fmt(r.get(c))) for r in rows)) if rows else len(c) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(fmt(r.get(c)).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


# --- foundation: zoo, eval, train ---------------------------------------------------------------

@app.command("zoo")
@guarded
def zoo_cmd(as_json: bool = JsonOpt):
    """List the shipped models and those in $ATTN_LAB_MODELS."""
    from attn_core import zoo

    rows = zoo.list_models()
    for r in rows:
        r.pop("path", None)
    emit(rows, as_json, lambda rs: _table(rs, ["name", "task", "n_layers", "n_heads", "d_model", "d_head",
                                               "qk", "d_mlp", "params", "accuracy"]))


@app.command("eval")
@guarded
def eval_cmd(name: str = typer.Argument(..., help="Zoo model name or path to a model folder."),
             samples: int = typer.Option(512, help="Number of held-out sequences."),
             seed: int = typer.Option(0, help="Seed of the held-out samples."),
             as_json: bool = JsonOpt):
    """Accuracy and loss of a model on fresh held-out samples of its task."""
    from attn_core import zoo
    from attn_core.train import evaluate

    if samples <= 0:
        raise ValueError(f"--samples must be positive, got {samples}")
    loaded = zoo.load(name)
    if loaded.task is None:
        raise ValueError(f"model {loaded.name!r} has no known task in its card, so it cannot be evaluated")
    res = evaluate(loaded.model, loaded.task, samples=samples, seed=seed)
    emit({"name": loaded.name, "task": loaded.task.name, "accuracy": res["accuracy"], "loss": res["loss"],
          "samples": samples, "seed": seed}, as_json)


@app.command("train")
@guarded
def train_cmd(preset: str = typer.Option(..., help="Preset name (see `attn-lab presets`)."),
              out: Optional[Path] = typer.Option(None, help="Folder to save the model in (must not exist)."),
              steps: Optional[int] = typer.Option(None, help="Override the preset's number of steps."),
              seed: Optional[int] = typer.Option(None, help="Override the preset's seed."),
              device: Optional[str] = typer.Option(None, help="auto, cpu or cuda."),
              as_json: bool = JsonOpt):
    """Train a preset from scratch; with --out, save model.safetensors, config.json and card.json."""
    from attn_core.presets import train_preset

    if steps is not None and steps <= 0:
        raise ValueError(f"--steps must be positive, got {steps}")
    command = "attn-lab " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    card = train_preset(preset, out=out, steps=steps, seed=seed, device=device, progress=not as_json,
                        command=command)
    result = {"preset": preset, "out": str(out) if out else None, **card}
    emit(result, as_json, lambda r: f"{r['preset']}: accuracy {r['metrics']['accuracy']:.4f} on 512 held-out "
                                    f"samples, {r['wall_time_s']:.1f} s" + (f", saved to {r['out']}" if r["out"] else ""))


@app.command("presets")
@guarded
def presets_cmd(as_json: bool = JsonOpt):
    """The training recipes of the zoo."""
    from attn_core.presets import PRESETS

    rows = [{"name": p.name, "task": p.task, **p.model, "steps": p.train.steps, "description": p.description}
            for p in PRESETS.values()]
    emit(rows, as_json, lambda rs: _table(rs, ["name", "task", "n_layers", "n_heads", "d_model", "steps"]))


# --- bilinear-form engine (issue 3) -------------------------------------------------------------

NameArg = typer.Argument(..., help="Zoo model name, path to a model folder, or a local Hugging Face GPT-2 folder.")
FIGURES = ("scores", "pattern", "query", "vocab", "vocab-pattern", "positional", "spectrum", "eigenvalues",
           "concentration", "heads")


def _input_tokens(loaded, tokens: Optional[str], sample_seed: Optional[int], random_seed: Optional[int]) -> list[int]:
    """Typed tokens, a task sample or random tokens (at most one given; default: sample 0 when
    the model has a task, else random tokens with seed 0)."""
    from attn_core import bilinear

    if sum(x is not None for x in (tokens, sample_seed, random_seed)) > 1:
        raise ValueError("give at most one of --tokens, --sample-seed and --random-seed")
    if tokens is not None:
        return bilinear.encode(loaded, tokens)
    if random_seed is not None or (sample_seed is None and loaded.task is None):
        return bilinear.random_tokens(loaded, random_seed or 0)
    return bilinear.sample_tokens(loaded, sample_seed or 0)


def _head_arg(loaded, layer: int, head: int) -> None:
    from attn_core import bilinear

    bilinear.check_layer(loaded.model, layer)
    bilinear.check_heads(loaded.model, head)


@app.command("spectrum")
@guarded
def spectrum_cmd(name: str = NameArg,
                 augmented: bool = typer.Option(False, help="Spectrum of the bias-augmented B' (d_model + 1)."),
                 as_json: bool = JsonOpt):
    """Singular values, eigenvalues of the symmetric part, norms and ranks of B for every head."""
    from attn_core import bilinear, zoo

    rows = bilinear.spectrum(zoo.load(name).model, augmented=augmented)

    def human(rs):
        table = [dict(r, sigma_1=r["singular_values"][0], lambda_sym_1=r["eigenvalues_sym"][0]) for r in rs]
        return _table(table, ["layer", "head", "rank_cap", "sigma_1", "lambda_sym_1", "stable_rank", "effective_rank",
                              "frobenius_norm", "nuclear_norm"])

    emit(rows, as_json, human)


@app.command("scores")
@guarded
def scores_cmd(name: str = NameArg,
               layer: int = typer.Option(0, help="Layer index."),
               head: int = typer.Option(0, help="Head index."),
               tokens: Optional[str] = typer.Option(None, help='Space-separated tokens, e.g. "a b c" (ids for models without a task).'),
               sample_seed: Optional[int] = typer.Option(None, help="Use the held-out task sample with this seed."),
               random_seed: Optional[int] = typer.Option(None, help="Use uniform random tokens with this seed."),
               k: int = typer.Option(1, help="k of the top-k mass."),
               as_json: bool = JsonOpt):
    """Scores S = X'B'X'^T (the model's own pre-softmax scores), pattern A and the concentration
    of every query row for one head on one input."""
    from attn_core import bilinear, metrics, zoo

    loaded = zoo.load(name)
    _head_arg(loaded, layer, head)
    ids = _input_tokens(loaded, tokens, sample_seed, random_seed)
    view = bilinear.sequence_view(loaded, ids, layer, [head])
    per_row = {m: v[0] for m, v in view.concentration(k).items()}
    valid = metrics.informative_rows(view.mask, view.pattern[0].shape)
    summary = {m: {s: float(t) for s, t in metrics.summarize(v, valid).items()} for m, v in per_row.items()}
    names = bilinear.token_names(loaded)
    result = {"name": loaded.name, "layer": layer, "head": head, "tokens": [names[t] for t in ids], "token_ids": ids,
              "scores": view.scores[0].masked_fill(~view.mask, float("nan")), "pattern": view.pattern[0],
              "concentration": {"per_query": per_row, "summary": summary, "k": k}}

    def human(r):
        rows = []
        for q, tok in enumerate(r["tokens"]):
            top = int(view.pattern[0, q].argmax())
            rows.append(dict(query=q, token=tok, top_key=f"{top}:{r['tokens'][top]}", top_prob=float(view.pattern[0, q, top]),
                             norm_entropy=float(per_row["normalized_entropy"][q]), hoyer=float(per_row["hoyer"][q])))
        tail = "  ".join(f"{m} {v['mean']:.3g}" for m, v in summary.items())
        return _table(rows, list(rows[0])) + f"\nmean over rows with >= 2 keys: {tail}"

    emit(result, as_json, human)


@app.command("heads")
@guarded
def heads_cmd(name: str = NameArg,
              samples: int = typer.Option(32, help="Generated sequences per detector."),
              seed: int = typer.Option(0, help="Seed of the generated sequences."),
              length: Optional[int] = typer.Option(None, help="Sequence length (default: the context, at most 64)."),
              rows: str = typer.Option("supported", help="Average over 'supported' rows (a perfect head scores 1) "
                                                          "or 'all' rows (TransformerLens' normalisation)."),
              as_json: bool = JsonOpt):
    """Previous-token, induction, duplicate-token and self scores of every head, on seeded
    random and repeated random sequences from the model's vocabulary."""
    from attn_core import bilinear, zoo

    det = bilinear.head_detectors(zoo.load(name), n_samples=samples, seed=seed, length=length, rows=rows)
    wide = det.pivot(index=["layer", "head"], columns="detector", values="score").reset_index()
    heads = [{"layer": int(r["layer"]), "head": int(r["head"]), **{d: float(r[d]) for d in bilinear.DETECTORS}}
             for _, r in wide.iterrows()]
    result = {"heads": heads, "best": bilinear.best_heads(det), "samples": samples, "seed": seed, "rows": rows}
    emit(result, as_json, lambda r: _table(r["heads"], ["layer", "head", *bilinear.DETECTORS]))


@app.command("export")
@guarded
def export_cmd(name: str = NameArg,
               figure: str = typer.Option(..., help=f"One of: {', '.join(FIGURES)}."),
               out: Path = typer.Option(..., help="File to write (never overwritten)."),
               fmt: Optional[str] = typer.Option(None, "--format", help="png, svg, html or csv (default: from --out)."),
               layer: int = typer.Option(0, help="Layer (views)."),
               head: int = typer.Option(0, help="Head (views)."),
               query: Optional[int] = typer.Option(None, help="Query row to highlight (the 'query' figure needs one; default last)."),
               tokens: Optional[str] = typer.Option(None, help="Typed tokens for the sequence view."),
               sample_seed: Optional[int] = typer.Option(None, help="Task sample for the sequence view."),
               random_seed: Optional[int] = typer.Option(None, help="Random tokens for the sequence view."),
               as_json: bool = JsonOpt):
    """Write one figure as PNG, SVG, HTML or its data as CSV."""
    from attn_core import bilinear, zoo
    from attn_core.figures import EXPORT_FORMATS, ExportError, write_plot
    from attn_core.figures import bilinear as fb

    if figure not in FIGURES:
        raise ValueError(f"unknown figure {figure!r}; choose one of {', '.join(FIGURES)}")
    fmt = (fmt or out.suffix.lstrip(".")).lower()
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)} (--format or the --out suffix)")
    loaded = zoo.load(name)
    model = loaded.model
    if figure in ("scores", "pattern", "query", "vocab", "vocab-pattern", "positional"):
        _head_arg(loaded, layer, head)
    if figure in ("scores", "pattern", "query"):
        view = bilinear.sequence_view(loaded, _input_tokens(loaded, tokens, sample_seed, random_seed), layer, [head])
        if figure == "query":
            plot = fb.query_plot(view, head, len(view.queries) - 1 if query is None else query)
        else:
            plot = fb.view_plot(view, head, query, value="scores" if figure == "scores" else "pattern")
    elif figure in ("vocab", "vocab-pattern"):
        plot = fb.view_plot(bilinear.vocabulary_view(loaded, layer, [head]), head, query,
                            value="scores" if figure == "vocab" else "pattern")
    elif figure == "positional":
        plot = fb.view_plot(bilinear.positional_view(loaded, layer, [head]), head, query)
    elif figure == "spectrum":
        plot = fb.spectrum_plot(bilinear.spectrum_frame(model))
    elif figure == "eigenvalues":
        plot = fb.eigen_plot(bilinear.eigen_frame(model))
    elif figure == "concentration":
        seq = _input_tokens(loaded, tokens, sample_seed, random_seed)
        plot = fb.concentration_plot(bilinear.concentration_table(loaded, seq))
    else:
        plot = fb.heads_plot(bilinear.head_detectors(loaded))
    try:
        path = write_plot(plot, out, fmt)
    except ExportError as e:
        raise ValueError(str(e)) from None
    emit({"figure": figure, "plot": plot.name, "format": fmt, "out": str(path), "bytes": path.stat().st_size},
         as_json, lambda r: f"wrote {r['out']} ({r['format']}, {r['bytes']} bytes)")

# --- end bilinear-form engine -------------------------------------------------------------------

# --- retraining and runs (issue 4) --------------------------------------------------------------

_RUN_COLS = ["id", "parent", "task", "status", "created", "regularizers", "steps", "accuracy", "entropy_data"]


def _run_row(r: dict) -> dict:
    after = (r.get("summary") or {}).get("after") or {}
    cfg = r.get("config") or {}
    return {**{k: r[k] for k in ("id", "parent", "task", "status", "message", "created", "finished")},
            "regularizers": ", ".join(cfg.get("regularizers", [])) or "-", "steps": cfg.get("steps"),
            "entmax_alpha": cfg.get("entmax_alpha"), "accuracy": after.get("accuracy"),
            "entropy_data": after.get("entropy_data"), "has_weights": r.get("has_weights")}


@app.command("retrain")
@guarded
def retrain_cmd(name: str = typer.Argument(..., help="Zoo model name or folder, run:<id> (fine-tune a run) "
                                                     "or scratch:<preset> (fresh init)."),
                reg: list[str] = typer.Option([], "--reg", help="Regularizer NAME[:K][@HEADS]=LAMBDA, repeatable. "
                                              "Names: entropy, hoyer, topk, vocab_entropy, vocab_hoyer, vocab_topk, "
                                              "spectral, nuclear; K for top-k (topk:2=0.1); HEADS like L1 or L0H1,L1H2."),
                heads: Optional[str] = typer.Option(None, help="Heads of every --reg without its own @HEADS "
                                                    "(L1, L0H1,L1H2; default every head)."),
                steps: int = typer.Option(300, help="Training steps."),
                seed: int = typer.Option(0, help="Seed of the training data (the run is deterministic under it)."),
                lr: float = typer.Option(1e-3, help="Peak learning rate (warmup, then cosine decay)."),
                entmax_alpha: Optional[float] = typer.Option(None, "--entmax-alpha", help="Attention: 1 softmax, "
                                                             "1.5 entmax15, 2 sparsemax (default: the parent's)."),
                batch_size: Optional[int] = typer.Option(None, help="Default: the parent's training batch size."),
                device: str = typer.Option("auto", help="auto, cpu or cuda."),
                as_json: bool = JsonOpt):
    """Fine-tune a model with concentration regularizers; the run is saved in the run store."""
    from attn_core.train import MEASURE_KEYS, JobConfig, TrainingJob

    cfg = JobConfig(source=name, regularizers=list(reg), heads=heads, entmax_alpha=entmax_alpha, steps=steps,
                    seed=seed, lr=lr, batch_size=batch_size, device=device)
    job = TrainingJob(cfg)
    if as_json:
        job.run()
    else:
        from tqdm import tqdm

        job.start()
        bar = tqdm(total=steps, desc=f"retrain {name}", unit="step")
        try:
            while not job.join(0.25):
                snap = job.snapshot()
                bar.update(snap.step - bar.n)
                if "task_loss" in snap.latest:
                    bar.set_postfix(loss=f"{snap.latest['task_loss']:.3g}",
                                    H=f"{snap.latest.get('entropy_data', float('nan')):.3f}")
        except KeyboardInterrupt:
            job.stop()
            job.join()
        finally:
            bar.update(job.snapshot().step - bar.n)
            bar.close()
    res = job.result()

    def pick(m):
        return {k: m.get(k) for k in MEASURE_KEYS} if m else None

    out = {"run_id": res["run_id"], "status": res["status"], "message": res["message"], "steps": res["steps"],
           "before": pick(res["before"]), "after": pick(res["after"])}

    def human(r):
        rows = [{"": k, "before": (r["before"] or {}).get(k), "after": (r["after"] or {}).get(k)} for k in MEASURE_KEYS]
        return f"run {r['run_id']}: {r['status']} ({r['message']})\n" + _table(rows, ["", "before", "after"])

    emit(out, as_json, human)


runs_app = typer.Typer(add_completion=False, help="List and inspect saved runs (the run store, $ATTN_LAB_RUNS or ./runs).")
app.add_typer(runs_app, name="runs")


@runs_app.callback(invoke_without_command=True)
@guarded
def runs_cmd(ctx: typer.Context, as_json: bool = JsonOpt):
    """List saved runs, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    from attn_core.runs import RunStore

    rows = [_run_row(r) for r in RunStore().list_runs()]
    emit(rows, as_json, lambda rs: _table(rs, _RUN_COLS) if rs else "no runs yet (attn-lab retrain NAME ... makes one)")


@runs_app.command("show")
@guarded
def runs_show_cmd(run_id: str = typer.Argument(..., help="Run id (as listed by `attn-lab runs`)."),
                  metrics: bool = typer.Option(False, "--metrics", help="Include the whole metric log (step, name, value)."),
                  as_json: bool = JsonOpt):
    """One run: its settings, status, before/after measurements, card and final metrics."""
    from attn_core.runs import RunStore

    store = RunStore()
    run = store.get(run_id)
    log = store.metrics(run["id"])
    final = {}
    if len(log):
        scalar = log[~log["name"].str.contains(r":L\d+H\d+", regex=True)]  # not the per-head series
        final = scalar.groupby("name", sort=False)["value"].last().to_dict()
    out = {**run, "final": final}
    if metrics:
        out["metrics"] = log.to_dict(orient="records")

    def human(r):
        summ = r.get("summary") or {}
        rows = [{"": k, "before": (summ.get("before") or {}).get(k), "after": (summ.get("after") or {}).get(k)}
                for k in ("accuracy", "loss", "entropy_data", "entropy_vocab", "top1_mass", "stable_rank")]
        head = (f"run {r['id']} ({r['status']}{': ' + r['message'] if r['message'] else ''})\n"
                f"parent {r['parent']}, task {r['task']}, created {r['created']}\n"
                f"settings: {json.dumps(r['config'])}\n")
        return head + _table(rows, ["", "before", "after"])

    emit(out, as_json, human)

# --- end retraining and runs --------------------------------------------------------------------

# --- growing d_k (issue 6) ----------------------------------------------------------------------

@app.command("grow")
@guarded
def grow_cmd(name: str = NameArg,
             layer: int = typer.Option(0, help="Layer of the head to grow."),
             head: int = typer.Option(0, help="Head to grow."),
             add: int = typer.Option(..., help="p: query/key dimensions to add (1..d_model - d_k)."),
             batch: int = typer.Option(32, help="Task sequences fitted (and as many more for the line search)."),
             seed: int = typer.Option(0, help="Seed of the fitting batch, the fine-tuning data and the random baseline."),
             steps: int = typer.Option(100, help="Fine-tuning steps after growth, the same for the three methods."),
             lr: float = typer.Option(1e-3, help="Fine-tuning learning rate (AdamW, constant, no weight decay)."),
             basis: str = typer.Option("whitened", help="Truncate in the 'whitened' basis of the batch (the score "
                                                        "metric) or the 'raw' basis of Z (the seed's recipe)."),
             grid: int = typer.Option(19, help="Step sizes tried by the line search (powers of 2)."),
             damping: float = typer.Option(1e-4, help="Levenberg-Marquardt damping of the least-squares fit (0: exact)."),
             eval_samples: int = typer.Option(256, help="Held-out sequences for every reported loss."),
             device: str = typer.Option("cpu", help="auto, cpu or cuda."),
             out: Optional[Path] = typer.Option(None, help="Save the grown, fine-tuned model in this new folder."),
             as_json: bool = JsonOpt):
    """Grow d_k of one head along the functional gradient (seed 001): fit the descent target of the
    scores by batch least squares, truncate to rank d_k + p, pick the step by line search, then
    fine-tune and compare with random and zero growth."""
    from attn_core import grow, zoo

    loaded = zoo.load(name)
    if loaded.task is None:
        raise ValueError(f"model {loaded.name!r} has no known task in its card, so there is no loss to grow it on")
    if out is not None and out.exists():
        raise ValueError(f"{out} already exists; choose a new --out folder (nothing was overwritten)")
    cfg = grow.GrowConfig(layer=layer, head=head, add=add, batch=batch, seed=seed, steps=steps, lr=lr, basis=basis,
                          grid=grid, damping=damping, eval_samples=eval_samples, device=device)
    res = grow.grow(loaded.model, loaded.task, cfg)
    summary = {"name": loaded.name, "task": loaded.task.name, **res.summary()}
    if out is not None:
        card = {"name": out.name, "task": loaded.task.name, "parent": loaded.name,
                "description": f"{loaded.name} with head {head} of layer {layer} grown from d_k {res.d_k} to {res.kept} "
                               f"(seed 001), then fine-tuned {steps} steps",
                "metrics": {"accuracy": summary["accuracy_after_finetune"], "loss": summary["loss_after_finetune"],
                            "eval_samples": eval_samples, "split": "test"},
                "grow": summary, "seed": seed, "command": "attn-lab " + " ".join(shlex.quote(a) for a in sys.argv[1:])}
        zoo.save(res.models["grown_finetuned"].cpu(), out, card)
        summary["out"] = str(out)

    def human(r):
        rows = [{"method": m, "loss after growth": r["loss_after_step"] if m == "grown" else r["baselines"][m]["loss_after_init"],
                 f"after {steps} steps": r["loss_after_finetune"] if m == "grown" else r["baselines"][m]["loss_after_finetune"]}
                for m in ("grown", "random", "zero")]
        sig = ", ".join(f"{s:.3g}" for s in r["singular_values_Z"][:r["kept"] + 3])
        return (f"{r['name']} L{layer}H{head}: d_k {r['d_k']} -> {r['d_k_new']}, loss before {r['loss_before']:.4g}\n"
                f"sigma(Z*) {sig}{' ...' if len(r['singular_values_Z']) > r['kept'] + 3 else ''} (cut after {r['kept']})\n"
                f"discarded energy {r['discarded_energy']:.3g} ({r['discarded_share']:.2%}), residual {r['residual']:.3g}\n"
                f"step eta {r['eta']:.3g}: predicted decrease {r['predicted_decrease']:.3g}, "
                f"measured {r['measured_decrease']:.3g} (fitting batch)\n" + _table(rows, list(rows[0]))
                + (f"\nsaved to {r['out']}" if r.get("out") else ""))

    emit(summary, as_json, human)

# --- end growing d_k ----------------------------------------------------------------------------

# --- kernelized attention (issue 7) -------------------------------------------------------------

_KERNEL_COLS = ["method", "features", "seeds", "rel_error_mean", "rel_error_std", "tv_mean", "tv_std", "kl_mean",
                "stable_rank", "spectral_norm"]


def _softmax_model(loaded) -> None:
    if loaded.config.entmax_alpha != 1.0:
        raise ValueError(f"model {loaded.name!r} uses alpha-entmax (alpha={loaded.config.entmax_alpha:g}), not softmax: "
                         "kernel methods approximate softmax(q k^T), so there is no exact pattern to compare with")


@app.command("kernels")
@guarded
def kernels_cmd(name: str = NameArg,
                layer: int = typer.Option(0, help="Layer index."),
                head: int = typer.Option(0, help="Head index."),
                method: str = typer.Option("favor", help="favor, maclaurin, schoenbat, nystrom or nystromformer."),
                features: int = typer.Option(64, help="Random features / landmarks m (>= 1)."),
                seeds: int = typer.Option(5, help="Seeds 0..K-1 of the random draw averaged over (>= 1)."),
                samples: int = typer.Option(16, help="Held-out task sequences the head is run on (>= 1)."),
                seed: int = typer.Option(0, help="Seed of the held-out task sequences."),
                causal: bool = typer.Option(True, "--causal/--no-causal", help="Causal mask, as the model attends."),
                as_json: bool = JsonOpt):
    """How well one kernel method approximates one head's softmax attention: relative output
    error |out_hat - out|_F / |out|_F and mean row total variation of the pattern, mean and std
    over seeds, with the head's stable rank |B|_F^2 / |B|_2^2 and spectral norm (float64)."""
    from attn_core import kernels, zoo

    if method not in kernels.METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(kernels.METHODS)}")
    for what, value in (("--features", features), ("--seeds", seeds), ("--samples", samples)):
        if value < 1:
            raise ValueError(f"{what} must be at least 1, got {value}")
    loaded = zoo.load(name)
    _head_arg(loaded, layer, head)
    _softmax_model(loaded)
    if loaded.task is None:
        raise ValueError(f"model {loaded.name!r} has no known task in its card, so there are no input sequences to "
                         "run the head on")
    tokens = loaded.task.sample(samples, seed, "test").tokens
    result = {"name": loaded.name, "samples": samples, "sample_seed": seed,
              **kernels.head_error(loaded.model, tokens, layer, head, method=method, features=features,
                                   seeds=seeds, causal=causal)}
    emit(result, as_json, lambda r: f"{r['name']} L{layer}H{head} ({'causal' if causal else 'non-causal'}, "
                                    f"{samples} sequences)\n" + _table([r], _KERNEL_COLS))


@app.command("kernels-bench")
@guarded
def kernels_bench_cmd(max_n: int = typer.Option(4096, help="Longest sequence; lengths run 256, 512, ... up to it "
                                                           "(>= 256). 4096 takes well under a minute on one CPU "
                                                           "thread; the stored result went to 16384."),
                      threads: Optional[int] = typer.Option(1, help="torch intra-op threads for the run (>= 1)."),
                      repeats: int = typer.Option(5, help="Timed calls per (n, method); the median is reported."),
                      features: int = typer.Option(256, help="Random features / landmarks m."),
                      causal: bool = typer.Option(False, "--causal/--no-causal", help="Time the causal forms "
                                                  "(favor, maclaurin only: the others have none)."),
                      memory: bool = typer.Option(False, "--memory/--no-memory", help="Also measure peak memory, "
                                                  "in a fresh subprocess per (n, method): adds a few seconds each "
                                                  "(peak_mb is null without it)."),
                      as_json: bool = JsonOpt):
    """Time exact attention (sdpa) and the kernel methods at n = 256 .. max_n (4 heads, d_head 64,
    float32): milliseconds, speed-up, peak memory and the crossover n from which each method wins."""
    from attn_core import kernels

    min_n = 256
    if max_n < min_n:
        raise ValueError(f"--max-n must be at least {min_n}, got {max_n}")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be at least 1, got {threads}")
    for what, value in (("--repeats", repeats), ("--features", features)):
        if value < 1:
            raise ValueError(f"{what} must be at least 1, got {value}")
    methods = kernels.CAUSAL_METHODS[:2] if causal else kernels.BENCH_METHODS
    result = kernels.benchmark(max_n=max_n, repeats=repeats, methods=methods, min_n=min_n, features=features,
                               causal=causal, threads=threads, memory=memory)

    def human(r):
        cross = ", ".join(f"{m} from n={n}" if n else f"{m} never" for m, n in r["crossover"].items())
        return _table(r["rows"], ["n", "method", "ms", "ratio", "peak_mb", "rel_error"]) + f"\nfaster than sdpa: {cross}"

    emit(result, as_json, human)

# --- end kernelized attention -------------------------------------------------------------------

# --- merged vs factored QK (issue 8) ------------------------------------------------------------

_QK_COLS = ["name", "rank_cap", "params", "final_loss_mean", "final_loss_std", "accuracy_mean", "accuracy_std",
            "stable_rank_mean", "rank_needed", "steps_to_bar", "ms_per_step"]


def _int_list(text: str, what: str) -> tuple:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers, e.g. 1,2,4,16; got {text!r}") from None


@app.command("compare-qk")
@guarded
def compare_qk_cmd(task: str = typer.Option("induction", help="Task to train on (see `attn-lab presets` for tasks)."),
                   steps: int = typer.Option(400, help="Training steps per run."),
                   seeds: int = typer.Option(3, help="Seeds per variant (first-seed, first-seed + 1, ...)."),
                   first_seed: int = typer.Option(0, help="The first seed."),
                   d_qk: str = typer.Option("1,2,4,16", "--d-qk", help="Query/key widths of the factored variants "
                                            "(comma-separated, each 1..d_model; empty for none)."),
                   merged: str = typer.Option("merged,merged + wd,merged + nuclear", help="Merged variants, "
                                              "comma-separated: merged, merged + wd, merged + nuclear (or none)."),
                   d_model: int = typer.Option(32, help="Residual width (every variant)."),
                   weight_decay: float = typer.Option(0.1, help="AdamW weight decay of every matrix but W_QK "
                                                      "(W_Q and W_K included)."),
                   qk_weight_decay: float = typer.Option(3.0, help="AdamW weight decay of W_QK in 'merged + wd'."),
                   nuclear: float = typer.Option(0.01, help="lambda of the penalty lambda * mean ||B||_* in "
                                                 "'merged + nuclear'."),
                   lr: float = typer.Option(3e-3, help="Peak learning rate."),
                   batch_size: int = typer.Option(64, help="Sequences per step."),
                   device: str = typer.Option("cpu", help="cpu, cuda or auto (ms/step is measured on it)."),
                   threads: int = typer.Option(1, help="torch CPU threads while training (0: torch's default); "
                                               "one is fastest for these small models on a busy machine."),
                   store: bool = typer.Option(True, "--store/--no-store", help="Save every run in the run store."),
                   out: Optional[Path] = typer.Option(None, help="Also save the whole comparison as JSON here "
                                                      "(the page can show it)."),
                   as_json: bool = JsonOpt):
    """Seed 004: train one architecture with factored QK (several d_qk) and merged QK (plain, with
    weight decay, with a nuclear-norm penalty) on the same data and seeds; loss, accuracy, rank of
    B, parameters and time per step per variant."""
    from attn_core import qk_compare as Q

    kinds = tuple(k.strip() for k in merged.split(",") if k.strip() and k.strip() != "none")
    cfg = Q.CompareConfig(task=task, steps=steps, seeds=seeds, first_seed=first_seed, d_qks=_int_list(d_qk, "--d-qk"),
                          merged_kinds=kinds, d_model=d_model, weight_decay=weight_decay,
                          qk_weight_decay=qk_weight_decay, nuclear=nuclear, lr=lr, batch_size=batch_size, device=device,
                          threads=threads)
    bar = None
    if not as_json:
        from tqdm import tqdm

        bar = tqdm(total=1000, desc="compare-qk", bar_format="{l_bar}{bar}| {elapsed}<{remaining} {postfix}")

    def progress(fraction: float, message: str) -> None:
        bar.update(round(1000 * fraction) - bar.n)
        bar.set_postfix_str(message, refresh=False)

    result = Q.compare(cfg, store=None if store else False, progress=progress if bar is not None else None)
    if bar is not None:
        bar.close()
    if out is not None:
        result.save(out)
    doc = {"task": task, "steps": steps, "seeds": cfg.seed_list, "variants": result.summary(),
           "findings": result.findings(), "machine": result.machine, "wall_time_s": result.wall_time_s,
           "command": cfg.command(), "out": str(out) if out else None}
    emit(doc, as_json, lambda d: _table(d["variants"], _QK_COLS) + "\n\n" + "\n".join(f"- {s}" for s in d["findings"]))

# --- end merged vs factored QK ------------------------------------------------------------------


def main() -> None:
    app()


if __name__ == "__main__":
    main()
