"""Reproduce the induction-head phase change (Olsson et al. 2022) on induction-2l's architecture, and
ask whether concentration pressure on layer 1 moves it (issue 23).

For each seed (default 5) induction-2l's architecture is trained from scratch with the preset's
recipe (1500 steps, batch 64, lr 3e-3, 100 warmup steps; the run is ``attn-lab retrain
scratch:induction-2l ...``), keeping checkpoints log-spaced from step 1 and every 10 steps from
20 to 400 (where the transition happens), every 100 after. Every checkpoint is measured on the same
256 held-out sequences (``attn_core.dynamics``). Per seed:

- the phase change: the window of steepest fall of the ICL score that the loss shares, both beyond
  the series' noise (``dynamics.phase``);
- whether the layer-1 prefix-matching score (the largest over layer-1 heads) and the K-composition
  from the previous-token head (the layer-0 head with the highest previous-token score at the end)
  into layer 1 (the largest over layer-1 heads) *rise inside that window*: their rise across the
  window is at least half of their whole rise over training;
- the ICL score's fall across the window (nats).

Then the same with an entropy regularizer on layer 1 (``entropy@L1=lambda``, the mean normalized
attention entropy of layer 1's heads on the batch) at two strengths (default 0.1 and 1): does the
phase change come earlier or later?

    python experiments/phase_change.py            # the full run: results/phase_change.{json,md}, docs/images/phase_change.png
    python experiments/phase_change.py --quick    # a smoke run (1 seed, 60 steps, one strength), nothing saved
    python experiments/phase_change.py --render experiments/results/phase_change.json   # tables and figure again

Runs go to ``--jobs`` processes with one torch thread each (2 on this 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "experiments" / "results"
FIGURE = ROOT / "docs" / "images" / "phase_change.png"
RISE_SHARE = 0.5  # "rises inside the window": at least this share of its whole rise happens there
MIN_RISE = 0.05  # a metric whose maximum is less than this above its first value has not risen at all


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def schedule(steps: int) -> dict:
    """Log-spaced checkpoints, dense (every 10 steps) from 20 to 400, every 100 after."""
    dense = list(range(20, min(400, steps) + 1, 10))
    return dict(
        checkpoint_log=min(40, steps // 4), checkpoint_steps=dense, checkpoint_every=100 if steps >= 200 else None
    )


def run_one(setting: dict) -> dict:
    """Train one (strength, seed) from scratch with checkpoints and measure every checkpoint."""
    import torch

    from attn_core import dynamics as D
    from attn_core.retraining.job import TrainingJob
    from attn_core.tasks import get_task
    from attn_core.training.config import JobConfig
    from attn_core.training.settings import warmup_of

    start = time.perf_counter()
    lam, seed, steps = setting["lambda"], setting["seed"], setting["steps"]
    cfg = JobConfig(
        "scratch:induction-2l",
        regularizers=[f"entropy@L1={lam:g}"] if lam > 0 else [],
        steps=steps,
        lr=3e-3,
        seed=seed,
        warmup_steps=warmup_of(steps),
        device="cpu",
        eval_every=steps,
        telemetry_every=steps,
        spectrum_every=steps,
        measure_samples=setting["samples"],
        **schedule(steps),
    )
    job = TrainingJob.open(cfg, store=False)
    res = job.run()
    trained = time.perf_counter() - start
    folder = job.checkpoints.folder
    try:
        series = D.series([str(folder)])
        inputs = D.task_inputs(get_task("induction"), setting["samples"], seed=0)
        dyn = D.dynamics(series, inputs, detector_samples=32, seed=0)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    m = dyn.metrics
    L1 = [h for h in range(4)]
    prev_head = max(range(4), key=lambda h: m[f"previous_token:L0H{h}"][-1])
    writer = f"L0H{prev_head}"
    pm = [max(m[f"prefix_matching:L1H{h}"][i] for h in L1) for i in range(len(dyn.steps))]
    kc = [max(dyn.k_from(writer, f"L1H{h}")[i] for h in L1) for i in range(len(dyn.steps))]
    out = {
        **setting,
        "status": res["status"],
        "accuracy": (res["after"] or {}).get("accuracy", math.nan),
        "entropy_data": (res["after"] or {}).get("entropy_data", math.nan),
        "steps_measured": dyn.steps,
        "icl": m["icl_score"],
        "loss": m["loss"],
        "prefix_matching_l1": pm,
        "k_composition_prev": kc,
        "previous_token_head": writer,
        "phase": dyn.phase_change,
        "train_s": trained,
        "measure_s": time.perf_counter() - start - trained,
        "checkpoints": len(dyn.steps),
        "threads": torch.get_num_threads(),
    }
    out.update(judge(out))
    return out


def _at(steps: list[int], values: list[float], step: float) -> float:
    """``values`` at ``step`` (a checkpoint step: the window's ends are)."""
    return values[min(range(len(steps)), key=lambda i: abs(steps[i] - step))]


def rise_share(steps: list[int], values: list[float], window: list[int]) -> float | None:
    """The share of a metric's whole rise (its maximum minus its first value) made inside the
    window (negative: it fell there); None when it never rose by :data:`MIN_RISE`."""
    total = max(values) - values[0]
    inside = _at(steps, values, window[1]) - _at(steps, values, window[0])
    return inside / total if total >= MIN_RISE else None


def judge(r: dict) -> dict:
    """Per run: the phase change and whether prefix matching and K-composition rise inside it."""
    pc = r["phase"]
    if pc is None:
        return {"phase_step": None, "window": None, "pm_share": None, "kc_share": None, "icl_fall": None,
                "loss_fall": None, "pm_rises": False, "kc_rises": False, "pm_ends": None, "kc_ends": None}  # fmt: skip
    steps, w = r["steps_measured"], pc["window"]
    pm, kc = rise_share(steps, r["prefix_matching_l1"], w), rise_share(steps, r["k_composition_prev"], w)
    fall = _at(steps, r["icl"], w[0]) - _at(steps, r["icl"], w[1])
    loss_fall = _at(steps, r["loss"], w[0]) - _at(steps, r["loss"], w[1])  # the task's (scored) loss
    ends = {k: [_at(steps, r[k], w[0]), _at(steps, r[k], w[1])] for k in ("prefix_matching_l1", "k_composition_prev")}
    return {
        "phase_step": pc["step"],
        "window": w,
        "pm_share": pm,
        "kc_share": kc,
        "icl_fall": fall,
        "loss_fall": loss_fall,
        "pm_rises": pm is not None and pm >= RISE_SHARE,
        "kc_rises": kc is not None and kc >= RISE_SHARE,
        "pm_ends": ends["prefix_matching_l1"],
        "kc_ends": ends["k_composition_prev"],
    }


def _fmt(v, spec: str = ".2f") -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def _move(ends, share) -> str:
    """``0.06 → 0.78 (0.93 of its rise)`` for a metric across the window."""
    if ends is None:
        return "—"
    part = "never rose" if share is None else f"{share:.2f} of its rise"
    return f"{ends[0]:.2f} → {ends[1]:.2f} ({part})"


def table(rows: list[dict]) -> str:
    lines = [
        "| λ (entropy@L1) | seed | phase change step | window | ICL fall in window (nats) | task loss fall in window (nats) | layer-1 prefix matching across the window | K-composition from the previous-token head across the window | final accuracy |",
        "|---:|---:|---:|---|---:|---:|---|---|---:|",
    ]
    for r in rows:
        mark = lambda ok: " ✔" if ok else ""  # noqa: E731
        window = "—" if r["window"] is None else f"{r['window'][0]}–{r['window'][1]}"
        lines.append(
            f"| {r['lambda']:g} | {r['seed']} | {_fmt(r['phase_step'], 'd')} | {window} | {_fmt(r['icl_fall'])} | "
            f"{_fmt(r['loss_fall'])} | "
            f"{_move(r['pm_ends'], r['pm_share'])}{mark(r['pm_rises'])} | "
            f"{r['previous_token_head']}: {_move(r['kc_ends'], r['kc_share'])}{mark(r['kc_rises'])} | {r['accuracy']:.4f} |"
        )
    return "\n".join(lines)


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for lam in sorted({r["lambda"] for r in rows}):
        part = [r for r in rows if r["lambda"] == lam]
        found = [r["phase_step"] for r in part if r["phase_step"] is not None]
        out.append({
            "lambda": lam,
            "runs": len(part),
            "with_phase_change": len(found),
            "phase_step_mean": statistics.mean(found) if found else None,
            "phase_step_sd": statistics.stdev(found) if len(found) > 1 else None,
            "phase_steps": found,
            "pm_rises": sum(r["pm_rises"] for r in part),
            "kc_rises": sum(r["kc_rises"] for r in part),
            "accuracy_mean": statistics.mean(r["accuracy"] for r in part),
        })  # fmt: skip
    return out


def summary_table(rows: list[dict]) -> str:
    lines = [
        "| λ (entropy@L1) | runs with a phase change | phase change step, mean ± sd (each) | L1 prefix matching rises in window | K-comp rises in window | final accuracy (mean) |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for s in summary(rows):
        each = ", ".join(map(str, s["phase_steps"])) or "—"
        sd = f" ± {s['phase_step_sd']:.0f}" if s["phase_step_sd"] is not None else ""
        mean = f"{s['phase_step_mean']:.0f}{sd} ({each})" if s["phase_step_mean"] is not None else "—"
        lines.append(
            f"| {s['lambda']:g} | {s['with_phase_change']} of {s['runs']} | {mean} | {s['pm_rises']} of {s['runs']} | "
            f"{s['kc_rises']} of {s['runs']} | {s['accuracy_mean']:.4f} |"
        )
    return "\n".join(lines)


def figure(rows: list[dict]):
    from attn_core.figures.dynamics import runs_plot

    runs = [
        {
            "label": f"λ={r['lambda']:g} seed {r['seed']}",
            "group": "no regularizer" if r["lambda"] == 0 else f"entropy@L1 = {r['lambda']:g}",
            "steps": r["steps_measured"],
            "icl": r["icl"],
            "pm": r["prefix_matching_l1"],
            "kc": r["k_composition_prev"],
            "phase": r["phase"],
        }
        for r in rows
    ]
    panels = {
        "icl": "ICL score (loss at positions 21–23 minus 1–3, nats)",
        "pm": "layer-1 prefix matching (max over heads)",
        "kc": "K-composition from the previous-token head into layer 1 (max over heads)",
    }
    return runs_plot(
        runs, panels, "induction-2l from scratch: the phase change (◆) in 5 seeds, with and without entropy@L1"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument(
        "--lambdas", type=float, nargs="*", default=[0.1, 1.0], help="strengths of entropy@L1 (0 is always run)"
    )
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--samples", type=int, default=256, help="held-out sequences every checkpoint is measured on")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--quick", action="store_true", help="1 seed, 60 steps, one strength; nothing saved")
    ap.add_argument("--render", type=Path, help="only redo the tables and the figure from a saved phase_change.json")
    args = ap.parse_args()
    if args.render:
        saved = json.loads(args.render.read_text())
        rows = [{**r, **judge(r)} for r in saved["rows"]]
        save(rows, saved["meta"])
        return
    if args.quick:
        args.seeds, args.lambdas, args.steps, args.samples = 1, [1.0], 60, 32
    if args.seeds < 1 or args.steps < 20 or any(l <= 0 for l in args.lambdas):
        ap.error("--seeds >= 1, --steps >= 20 and every lambda > 0")
    todo = [
        {"lambda": lam, "seed": s, "steps": args.steps, "samples": args.samples}
        for lam in [0.0, *args.lambdas]
        for s in range(args.seeds)
    ]
    start = time.perf_counter()
    load_before = os.getloadavg()
    rows = []
    with ProcessPoolExecutor(max_workers=args.jobs, initializer=_init_worker, initargs=(1,)) as pool:
        for r in pool.map(run_one, todo):
            rows.append(r)
            print(
                f"λ={r['lambda']:<4g} seed {r['seed']}: {r['status']}, accuracy {r['accuracy']:.4f}, phase change "
                f"{r['phase']}, prefix-matching share {_fmt(r['pm_share'])}, K-comp share {_fmt(r['kc_share'])} "
                f"({r['checkpoints']} checkpoints; train {r['train_s']:.0f} s, measure {r['measure_s']:.0f} s)",
                flush=True,
            )
    wall = time.perf_counter() - start
    import torch

    meta = {
        "created": time.strftime("%Y-%m-%d %H:%M"),
        "seeds": args.seeds,
        "lambdas": args.lambdas,
        "steps": args.steps,
        "samples": args.samples,
        "jobs": args.jobs,
        "wall_s": wall,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread per process",
        "command": " ".join(["python experiments/phase_change.py", *sys.argv[1:]]),
    }
    save(rows, meta, quick=args.quick)


def markdown(rows: list[dict], meta: dict) -> str:
    return "\n\n".join([
        "# The induction-head phase change on induction-2l (issue 23)",
        f"Measured {meta['created']} on {meta['machine']}, {meta['jobs']} processes; {meta['wall_s'] / 60:.1f} min in "
        f"all (load average {meta['load_average_before'][0]:.1f} before, {meta['load_average_after'][0]:.1f} after). "
        f"Reproduce: `{meta['command']}`.",
        f"A metric *rises in the window* (✔) when at least {RISE_SHARE:g} of its whole rise over training (its "
        f"maximum minus its first value) happens between the window's first and last step; a negative share "
        f"means it fell there; *never rose*: its maximum is less than {MIN_RISE:g} above its first value. "
        "The task loss is induction's own, on the repeated half it scores; the ICL score's early positions "
        "(1–3) are never scored, so never trained: the part of the ICL fall beyond the task loss's is mostly "
        "those positions' loss growing as the model turns confident.",
        summary_table(rows),
        table(rows),
    ])  # fmt: skip


def save(rows: list[dict], meta: dict, quick: bool = False) -> None:
    md = markdown(rows, meta)
    print()
    print(md)
    if quick:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("phase_change.json", json.dumps({"meta": meta, "summary": summary(rows), "rows": rows}, indent=2) + "\n"),
        ("phase_change.md", md + "\n"),
    ):
        tmp = RESULTS / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(RESULTS / name)
    from attn_core.figures.base import export_bytes

    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    FIGURE.write_bytes(export_bytes(figure(rows), "png", width=1100, height=900))
    print(f"saved {RESULTS / 'phase_change.md'}, {RESULTS / 'phase_change.json'} and {FIGURE}")


if __name__ == "__main__":
    main()
