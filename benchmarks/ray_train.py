"""Retraining on Ray Train workers (issue 29): steps/s and peak memory of each worker for 1, 2 (and
on a GPU machine, every GPU) workers, and the scaling efficiency.

Every run trains the same job (``--model``, ``--steps`` steps, the same global batch ``--batch``
split across the workers, DDP or FSDP) through ``TrainingJob`` with ``JobConfig.workers`` N, as
``attn-lab retrain MODEL --workers N`` does; one local Ray (started once through
``attn_core.cluster``) serves them all. Telemetry and spectra are logged once, at the end, so the
rate is the step loop's. For each N we report the median over ``--repeats`` of: rank 0's steps/s
over its training loop (``Snapshot.steps_per_s``), every worker's own steps/s and peak memory
(CPU: the process's peak resident set, VmHWM; CUDA: ``max_memory_allocated``), and the start-up
(from ``start()`` to the first step: Ray Train's controller, the workers, their imports, the
model on every rank, rank 0's before-measurement). The scaling efficiency of N workers is
rate(N) / (N x rate(1 worker)) for the fixed global batch (strong scaling: 1.0 means N times
faster). The same job in one process (no Ray, one torch thread, what ``retrain`` without
``--workers`` runs; in a fresh interpreter of its own, away from this one's Ray driver) is
measured alongside, as the reference a worker's rate is compared with.
Runs are interleaved (1, 2, ..., one process; again), so load that drifts hits them alike.

    python benchmarks/ray_train.py [--model induction-2l --steps 200 --batch 64 --repeats 3]
    python benchmarks/ray_train.py --gpus [--strategy fsdp]   # 1..every GPU, one GPU per worker
    python benchmarks/ray_train.py --quick                    # 10 steps, 1 and 2 CPU workers, once, not saved
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attn_core.cluster import ray_session  # noqa: E402
from attn_core.retraining.job import TrainingJob  # noqa: E402
from attn_core.runs import RunStore  # noqa: E402
from attn_core.training.config import JobConfig  # noqa: E402
from benchmarks import record  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "ray_train.json"


def job_config(args, workers: int | None) -> JobConfig:
    return JobConfig(
        source=args.model,
        regularizers={"entropy": 0.1},
        steps=args.steps,
        batch_size=args.batch,
        eval_every=args.steps,
        telemetry_every=args.steps,
        spectrum_every=args.steps,
        measure_samples=64,
        eval_samples=64,
        workers=workers,
        gpus_per_worker=1 if (workers and args.gpus) else 0,
        strategy=args.strategy if workers else "ddp",
    )


def one_run(args, workers: int | None, store: RunStore) -> dict:
    """One training run (on ``workers`` Ray Train workers, or None: in a fresh process); its figures."""
    if workers is None:
        import json
        import subprocess

        code = "from benchmarks.ray_train import alone; alone()"
        argv = [sys.executable, "-c", code, args.model, str(args.steps), str(args.batch), str(store.root)]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
        return json.loads(out.stdout.strip().splitlines()[-1])
    job = TrainingJob.open(job_config(args, workers), store=store)
    t0 = time.perf_counter()
    job.start()
    first = None
    while not job.join(0.02):
        if first is None and job.snapshot().step >= 1:
            first = time.perf_counter() - t0
    snap = job.snapshot()
    if snap.status != "completed":
        raise SystemExit(f"the run on {workers or 'no'} workers ended {snap.status}: {snap.message}")
    out = {"steps_per_s": snap.steps_per_s, "startup_s": first, "wall_s": time.perf_counter() - t0}
    if workers:
        out["workers"] = [{k: w[k] for k in ("rank", "device", "steps_per_s", "peak_mib")} for w in snap.workers]
    else:
        out["peak_mib"] = record.peak_rss_kib() / 1024
    return out


def alone() -> None:
    """The one-process reference, in this fresh interpreter (argv: model, steps, batch, store)."""
    import json

    model, steps, batch, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    args = argparse.Namespace(model=model, steps=steps, batch=batch, gpus=False, strategy="ddp")
    job = TrainingJob.open(job_config(args, None), store=RunStore(root))
    t0 = time.perf_counter()
    job.run()
    snap = job.snapshot()
    figures = {"steps_per_s": snap.steps_per_s, "startup_s": None, "wall_s": time.perf_counter() - t0}
    print(json.dumps({**figures, "peak_mib": record.peak_rss_kib() / 1024, "status": snap.status}))


def summary(runs: list[dict], workers: int | None, base: float | None) -> dict:
    """Medians over the repeats of one N."""
    rate = statistics.median(r["steps_per_s"] for r in runs)
    out = {
        "workers": workers,
        "steps_per_s": rate,
        "startup_s": statistics.median([r["startup_s"] for r in runs if r["startup_s"] is not None] or [math.nan]),
        "repeats": len(runs),
    }
    if workers:
        out["per_worker"] = [
            {
                "rank": rank,
                "steps_per_s": statistics.median(r["workers"][rank]["steps_per_s"] for r in runs),
                "peak_mib": statistics.median(r["workers"][rank]["peak_mib"] for r in runs),
            }
            for rank in range(workers)
        ]
        out["scaling_efficiency"] = rate / (workers * base) if base else None
    else:
        out["peak_mib"] = statistics.median(r["peak_mib"] for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="induction-2l")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64, help="the global batch, split across the workers")
    ap.add_argument("--workers", default=None, help="comma-separated worker counts (default 1,2; with --gpus 1..GPUs)")
    ap.add_argument("--strategy", default="ddp", choices=("ddp", "fsdp"))
    ap.add_argument("--gpus", action="store_true", help="one GPU per worker")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--quick", action="store_true", help="10 steps, 1 and 2 CPU workers, once; not saved")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.repeats, args.gpus, args.workers = 10, 1, False, "1,2"
    if args.gpus and not torch.cuda.is_available():
        raise SystemExit("--gpus: no CUDA GPU here")
    counts = [int(n) for n in args.workers.split(",")] if args.workers else None
    counts = counts or (list(range(1, torch.cuda.device_count() + 1)) if args.gpus else [1, 2])
    torch.set_num_threads(1)  # the one-process reference: one thread, as one CPU worker has
    runs: dict = {n: [] for n in [*counts, None]}
    with tempfile.TemporaryDirectory() as tmp, ray_session(num_cpus=max(os.cpu_count() or 1, max(counts))) as ray:
        store = RunStore(Path(tmp) / "runs")
        for _ in range(args.repeats):
            for n in [*counts, None]:
                runs[n].append(one_run(args, n, store))
                print(f"  {n or 'one process'}: {runs[n][-1]['steps_per_s']:.2f} steps/s", file=sys.stderr)
    base = statistics.median(r["steps_per_s"] for r in runs[1]) if 1 in runs else None
    rows = [summary(runs[n], n, base) for n in counts]
    alone = summary(runs[None], None, None)
    print(f"{args.model}, {args.steps} steps, global batch {args.batch}, {args.strategy}, medians of {args.repeats}:")
    print(f"  one process (no Ray):  {alone['steps_per_s']:8.2f} steps/s, peak {alone['peak_mib']:.0f} MiB")
    for r in rows:
        workers = ", ".join(
            f"rank {w['rank']} {w['steps_per_s']:.2f} steps/s {w['peak_mib']:.0f} MiB" for w in r["per_worker"]
        )
        eff = f", scaling efficiency {r['scaling_efficiency']:.2f}" if r["scaling_efficiency"] is not None else ""
        print(
            f"  {r['workers']} worker(s): {r['steps_per_s']:8.2f} steps/s{eff}; start-up {r['startup_s']:.1f} s; {workers}"
        )
    if args.quick:
        return
    result = dict(
        model=args.model,
        steps=args.steps,
        global_batch=args.batch,
        strategy=args.strategy,
        device="cuda" if args.gpus else "cpu",
        ray=ray["ray_version"],
        one_process=alone,
        workers=rows,
        command=" ".join(["python", "benchmarks/ray_train.py", *sys.argv[1:]]),
        **record.environment(),
    )
    print(f"saved {record.save(result, args.out)}")


if __name__ == "__main__":
    main()
