"""Which concentration regularizer makes attention sparse "for every x" at no cost?

For each model (default: the zoo's recall-2l-merged and induction-2l; the factored recall-2l never learns
the task, see its card) we fine-tune the shipped weights
once without a regularizer (lambda = 0, the reference) and once per regularizer and strength
lambda in ``--lambdas`` (default 0.01, 0.1, 1), every head regularized, same steps, seed, data and
learning rate; then alpha-entmax attention (1.5 and 2 = sparsemax) as the architectural
alternative, fine-tuned without a penalty. Each fine-tuned model is measured on 512 held-out
samples (attn_core.training.telemetry.measure_run): task accuracy, mean normalized attention entropy on those
samples (data) and on the vocabulary view (every token as query and key), mean top-1 attention
mass on data, mean stable rank of B.

Target (issue 4): some setting cuts mean normalized entropy on data by >= 50% against the
lambda = 0 reference while accuracy drops by <= 1 point. The question asks for f_x(y) = x B y^T to be
concentrated for *every* x, which is what the vocabulary view measures: the regularizer that
answers it best is the one with the largest cut of vocabulary entropy within that 1-point budget.

    python experiments/concentration.py                  # the full sweep, saved under results/
    python experiments/concentration.py --quick          # a smoke run (few steps, one lambda)
    python experiments/concentration.py --ray            # the same settings as one sweep on Ray

Writes experiments/results/concentration.{md,json}. Settings run in ``--jobs`` processes (one
torch thread each), so the sweep fits in minutes on a 2-core machine. With ``--ray`` the same
settings run as one sweep (``attn_core.sweep``: Ray Tune trials, a local Ray with ``--jobs`` CPUs
or the cluster of ``--address``), recorded as runs of a sweep named "concentration" in the run store.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attn_core.card import MEASURE_KEYS  # noqa: E402
from attn_core.regularizers import REGULARIZERS  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("recall-2l-merged", "induction-2l")
LAMBDAS = (0.01, 0.1, 1.0)
ENTMAX = (1.5, 2.0)
MAX_ACC_DROP_PTS = 1.0
MIN_ENTROPY_CUT = 0.5
TIE = 0.05  # regularizers within 5 points of the best vocabulary cut are called tied
COLS = MEASURE_KEYS  # what a run measures before and after (attn_core.card)


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def run_setting(setting: dict) -> dict:
    """Fine-tune one model with one setting and measure it (runs in a worker process)."""
    import torch

    from attn_core.retraining.job import TrainingJob
    from attn_core.training.config import JobConfig

    start = time.perf_counter()
    s = setting
    regs = {s["regularizer"]: s["lambda"]} if s["kind"] == "penalty" and s["lambda"] > 0 else {}
    cfg = JobConfig(
        s["model"],
        regs,
        entmax_alpha=s.get("entmax_alpha"),
        steps=s["steps"],
        lr=s["lr"],
        seed=s["seed"],
        batch_size=s["batch_size"],
        device="cpu",
        eval_every=s["steps"],
        telemetry_every=s["steps"],
        spectrum_every=s["steps"],
        measure_samples=s["samples"],
    )
    job = TrainingJob.open(cfg, store=False)
    res = job.run()
    out = {
        **s,
        "status": res["status"],
        "message": res["message"],
        "seconds": time.perf_counter() - start,
        "threads": torch.get_num_threads(),
    }
    out.update({f"parent_{k}": res["before"][k] for k in COLS})
    out.update({k: (res["after"] or {}).get(k, math.nan) for k in COLS})
    return out


def _trial(s: dict):
    from attn_core.sweep import BASELINE, Trial

    if s["kind"] == "entmax":
        return Trial(s["model"], BASELINE, 0.0, s["seed"], entmax_alpha=s["entmax_alpha"])
    if s["regularizer"] == "none" or s["lambda"] == 0:
        return Trial(s["model"], BASELINE, 0.0, s["seed"])
    return Trial(s["model"], s["regularizer"], float(s["lambda"]), s["seed"])


def run_on_ray(todo: list[dict], jobs: int, threads: int, address: str | None) -> list[dict]:
    """The settings as one sweep on Ray (attn_core.sweep); rows as :func:`run_setting` makes them."""
    from attn_core.sweep import SweepPlan, run_sweep

    s0 = todo[0]
    job = dict(
        steps=s0["steps"],
        lr=s0["lr"],
        batch_size=s0["batch_size"],
        device="cpu",
        eval_every=s0["steps"],
        telemetry_every=s0["steps"],
        spectrum_every=s0["steps"],
        measure_samples=s0["samples"],
    )
    by_key = {_trial(s).key: s for s in todo}
    seconds: dict[str, float] = {}

    def on_trial(run_id: str, payload: dict) -> None:
        seconds[payload["key"]] = payload.get("seconds", math.nan)
        s = by_key[payload["key"]]
        after = payload.get("after") or {}
        print(
            f"{s['model']:14s} {s['regularizer']:14s} λ={s['lambda']:<5g} acc {after.get('accuracy', math.nan):.4f} "
            f"H_data {after.get('entropy_data', math.nan):.3f}  {payload['status']}  run {run_id}  "
            f"{seconds[payload['key']]:.1f}s",
            flush=True,
        )

    if address is None and jobs:
        import ray

        if not ray.is_initialized():  # a local Ray with --jobs CPUs (run_sweep then uses it as it is)
            ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        res = run_sweep(
            SweepPlan("concentration", [_trial(s) for s in todo], job),
            address=address,
            cpus_per_trial=threads,
            on_trial=on_trial,
        )
    finally:
        if address is None and jobs:
            ray.shutdown()
    print(
        f"sweep {res['sweep_id']}: {res['status']} on Ray {res['ray_version']} ({res['address']}), "
        f"{res['wall_s']:.1f} s",
        flush=True,
    )
    rows = []
    for t in res["trials"]:
        s = by_key[t["key"]]
        before, after = t["before"] or {}, t["after"] or {}
        row = {
            **s,
            "status": t["status"],
            "message": t["message"],
            "seconds": seconds.get(t["key"], math.nan),
            "threads": threads,
            "run_id": t["run_id"],
            "sweep_id": res["sweep_id"],
        }
        row.update({f"parent_{k}": before.get(k, math.nan) for k in COLS})
        row.update({k: after.get(k, math.nan) for k in COLS})
        rows.append(row)
    return rows


def settings(models, lambdas, steps, batch_size, lr, seed, samples, entmax) -> list[dict]:
    base = dict(steps=steps, batch_size=batch_size, lr=lr, seed=seed, samples=samples)
    out = []
    for model in models:
        out.append(dict(base, model=model, kind="penalty", regularizer="none", **{"lambda": 0.0}))
        for reg in REGULARIZERS:
            for lam in lambdas:
                out.append(dict(base, model=model, kind="penalty", regularizer=reg, **{"lambda": lam}))
        for alpha in entmax:
            out.append(
                dict(
                    base,
                    model=model,
                    kind="entmax",
                    regularizer=f"entmax α={alpha:g}",
                    entmax_alpha=alpha,
                    **{"lambda": 0.0},
                )
            )
    return out


def analyse(rows: list[dict]) -> dict:
    """Deltas against each model's lambda = 0 reference, the settings that meet the target, and
    the best regularizer for concentration "for every x" (largest vocabulary-entropy cut within the accuracy budget)."""
    refs = {r["model"]: r for r in rows if r["regularizer"] == "none"}
    for r in rows:
        ref = refs[r["model"]]
        r["acc_drop_pts"] = 100 * (ref["accuracy"] - r["accuracy"]) + 0.0  # + 0.0: no "-0.00"
        r["entropy_data_cut"] = 1 - r["entropy_data"] / ref["entropy_data"]
        r["entropy_vocab_cut"] = 1 - r["entropy_vocab"] / ref["entropy_vocab"]
        r["within_budget"] = r["status"] == "completed" and r["acc_drop_pts"] <= MAX_ACC_DROP_PTS
        r["meets_target"] = r["within_budget"] and r["entropy_data_cut"] >= MIN_ENTROPY_CUT
    best_vocab, best_data = {}, {}
    for model in refs:
        ok = [r for r in rows if r["model"] == model and r["within_budget"] and r["regularizer"] != "none"]
        if ok:
            best_vocab[model] = max(ok, key=lambda r: r["entropy_vocab_cut"])
            best_data[model] = max(ok, key=lambda r: r["entropy_data_cut"])
    # Per regularizer and model: the largest vocabulary-entropy cut within the accuracy budget
    # (lambda = 0, a cut of 0, is always within it); ranked by the mean over the models.
    best = {}
    for reg in sorted({r["regularizer"] for r in rows} - {"none"}):
        best[reg] = {}
        for model in refs:
            ok = [r for r in rows if r["model"] == model and r["regularizer"] == reg and r["within_budget"]]
            top = max(ok, key=lambda r: r["entropy_vocab_cut"]) if ok else None
            best[reg][model] = (
                {"lambda": top["lambda"], "entropy_vocab_cut": top["entropy_vocab_cut"], "helps": True}
                if top is not None and top["entropy_vocab_cut"] > 0
                else {"lambda": 0.0, "entropy_vocab_cut": 0.0, "helps": False}
            )
    score = {reg: sum(b["entropy_vocab_cut"] for b in per.values()) / len(per) for reg, per in best.items()}
    ranking = sorted(score, key=score.get, reverse=True)
    return {
        "references": {m: {k: refs[m][k] for k in COLS} for m in refs},
        "meets_target": [_key(r) for r in rows if r["meets_target"]],
        "best_vocab_cut": {m: _key(r) for m, r in best_vocab.items()},
        "best_data_cut": {m: _key(r) for m, r in best_data.items()},
        "ranking": [{"regularizer": reg, "mean_best_vocab_cut": score[reg], "per_model": best[reg]} for reg in ranking],
        "answer": ranking[0] if ranking else None,
        "tied_with": [reg for reg in ranking[1:] if score[ranking[0]] - score[reg] <= TIE],
    }


def _key(r: dict) -> dict:
    return {
        k: r[k]
        for k in (
            "model",
            "regularizer",
            "lambda",
            "accuracy",
            "acc_drop_pts",
            "entropy_data",
            "entropy_data_cut",
            "entropy_vocab",
            "entropy_vocab_cut",
            "top1_mass",
            "stable_rank",
        )
    }


def _cell(reg: str, b: dict) -> str:
    if not b["helps"]:
        return "0% (no cut within budget)"
    lam = "" if reg.startswith("entmax") else f" (λ={b['lambda']:g})"
    return f"{-100 * b['entropy_vocab_cut'] + 0.0:+.0f}%{lam}"


def _pts(r: dict) -> str:
    """Accuracy change in points, signed, never "-0.00"."""
    d = round(-r["acc_drop_pts"], 2)
    return f"{d + 0.0:+.2f}"


def markdown(rows: list[dict], summary: dict, meta: dict) -> str:
    lines = [
        "# Concentration regularizers: the sweep (issue 4)",
        "",
        f"Measured {meta['created']} on {meta['machine']}; {meta['steps']} fine-tuning steps per setting "
        f"(batch {meta['batch_size']}, lr {meta['lr']:g}, seed {meta['seed']}), every head regularized, "
        f"metrics on {meta['samples']} held-out samples; whole sweep {meta['wall_s'] / 60:.1f} min "
        f"({meta['jobs']} processes). Reproduce: `{meta['command']}`.",
        "",
        "Columns: accuracy and its change in points against λ = 0 (same fine-tuning, no regularizer); mean "
        "normalized attention entropy H/log n on the held-out data and on the vocabulary view (every token "
        "as query and key), each with its relative change against λ = 0; mean top-1 attention mass on "
        "data; mean stable rank of B. ✔ marks the issue's target: H_data at least halved, accuracy down "
        "by at most 1 point.",
        "",
    ]
    for model in summary["references"]:
        parent = next(r for r in rows if r["model"] == model)
        lines += [
            f"## {model}",
            "",
            f"Shipped model before fine-tuning: accuracy {parent['parent_accuracy']:.4f}, "
            f"H_data {parent['parent_entropy_data']:.3f}, H_vocab {parent['parent_entropy_vocab']:.3f}, "
            f"top-1 {parent['parent_top1_mass']:.3f}, stable rank {parent['parent_stable_rank']:.2f}.",
            "",
            "| regularizer | λ | accuracy | Δacc (pts) | H_data | ΔH_data | H_vocab | ΔH_vocab | top-1 mass | stable rank |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in (r for r in rows if r["model"] == model):
            mark = " ✔" if r["meets_target"] else ""
            status = "" if r["status"] == "completed" else f" ({r['status']})"
            lines.append(
                f"| {r['regularizer']}{status} | {r['lambda']:g} | {r['accuracy']:.4f} | {_pts(r)} | "
                f"{r['entropy_data']:.3f} | {-100 * r['entropy_data_cut'] + 0.0:+.0f}%{mark} | {r['entropy_vocab']:.3f} | "
                f"{-100 * r['entropy_vocab_cut'] + 0.0:+.0f}% | {r['top1_mass']:.3f} | {r['stable_rank']:.2f} |"
            )
        lines.append("")
    lines += ["## Verdict", ""]
    hits = summary["meets_target"]
    if hits:
        lines.append(
            f"Target (H_data cut ≥ {100 * MIN_ENTROPY_CUT:.0f}% with ≤ {MAX_ACC_DROP_PTS:g} point accuracy drop) "
            f"met by {len(hits)} settings (✔), e.g. "
            + "; ".join(
                f"{h['model']} {h['regularizer']} λ={h['lambda']:g}: H_data {100 * h['entropy_data_cut']:.0f}% lower, "
                f"accuracy {_pts(h)} pts"
                for h in sorted(hits, key=lambda h: h["acc_drop_pts"])[:3]
            )
            + "."
        )
    else:
        lines.append("No setting met the target in this sweep.")
    lines.append("")
    ranking = summary["ranking"]
    if ranking:
        models = list(summary["references"])
        lines += [
            "The question asks for f_x(y) concentrated for every x, which the vocabulary view measures. Each "
            "regularizer's best change of H_vocab within the accuracy budget (its λ in brackets; 0 where no "
            "strength cuts H_vocab without costing more than a point), ranked by the mean over the models:",
            "",
            "| regularizer | " + " | ".join(models) + " | mean |",
            "|---|" + "---:|" * (len(models) + 1),
        ]
        for item in ranking:
            cells = [_cell(item["regularizer"], item["per_model"][m]) for m in models]
            lines.append(
                f"| {item['regularizer']} | "
                + " | ".join(cells)
                + f" | {-100 * item['mean_best_vocab_cut'] + 0.0:+.0f}% |"
            )
        lines.append("")
        for model, b in summary["best_vocab_cut"].items():
            lines.append(
                f"Best for every x on {model}: {b['regularizer']} λ={b['lambda']:g} (H_vocab "
                f"{100 * b['entropy_vocab_cut']:.0f}% lower, H_data {100 * b['entropy_data_cut']:.0f}% lower, "
                f"accuracy {_pts(b)} pts)."
            )
        lines.append("")
        tied = summary.get("tied_with") or []
        lines.append(
            f"**Answer: {summary['answer']}**"
            + (f" (tied within {100 * TIE:.0f} points with {', '.join(tied)})." if tied else ".")
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--lambdas", nargs="+", type=float, default=list(LAMBDAS))
    ap.add_argument("--entmax", nargs="*", type=float, default=list(ENTMAX))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--ray", action="store_true", help="run the settings as one sweep on Ray (attn_core.sweep)")
    ap.add_argument("--address", help="with --ray: the Ray cluster to join (default: a local Ray with --jobs CPUs)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 20 steps, lambda 0.1, no entmax, not saved")
    ap.add_argument("--render", type=Path, help="only rewrite the markdown from a saved concentration.json")
    args = ap.parse_args()
    if args.render:
        saved = json.loads(args.render.read_text())
        md = markdown(saved["rows"], analyse(saved["rows"]), saved["meta"])
        (args.render.parent / "concentration.md").write_text(md)
        print(md)
        return
    if args.quick:
        args.steps, args.lambdas, args.entmax, args.samples = 20, [0.1], [], 128
    if args.steps <= 0 or any(l < 0 for l in args.lambdas):
        ap.error("--steps must be positive and every lambda >= 0")
    todo = settings(
        args.models, args.lambdas, args.steps, args.batch_size, args.lr, args.seed, args.samples, args.entmax
    )
    start = time.perf_counter()
    rows = []
    if args.ray:
        rows = run_on_ray(todo, args.jobs, args.threads, args.address)
    with ProcessPoolExecutor(max_workers=args.jobs, initializer=_init_worker, initargs=(args.threads,)) as pool:
        for r in [] if args.ray else pool.map(run_setting, todo):
            rows.append(r)
            print(
                f"{r['model']:14s} {r['regularizer']:14s} λ={r['lambda']:<5g} acc {r['accuracy']:.4f} "
                f"H_data {r['entropy_data']:.3f} H_vocab {r['entropy_vocab']:.3f} top1 {r['top1_mass']:.3f} "
                f"sr {r['stable_rank']:.2f}  {r['status']}  {r['seconds']:.1f}s",
                flush=True,
            )
    wall = time.perf_counter() - start
    summary = analyse(rows)
    import torch

    meta = {
        "created": time.strftime("%Y-%m-%d %H:%M"),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seed": args.seed,
        "samples": args.samples,
        "lambdas": args.lambdas,
        "entmax": args.entmax,
        "jobs": args.jobs,
        "threads": args.threads,
        "wall_s": wall,
        "backend": "ray" if args.ray else "processes",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "command": " ".join(["python experiments/concentration.py", *sys.argv[1:]]),
    }
    md = markdown(rows, summary, meta)
    print()
    print(md)
    if args.quick:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in (
        (
            "concentration.json",
            json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=2, default=str) + "\n",
        ),
        ("concentration.md", md),
    ):
        tmp = args.out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(args.out / name)
    print(f"saved {args.out / 'concentration.md'} and {args.out / 'concentration.json'} ({wall / 60:.1f} min)")


if __name__ == "__main__":
    main()
