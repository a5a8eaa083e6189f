"""Cost of training dynamics on induction-2l's architecture: what checkpointing adds to a run, what
one checkpoint costs to write and to measure (every metric of ``attn_core.dynamics.measure``), and a
series measured once (cold cache) against the same series again (every checkpoint read from the
cache).

    python benchmarks/dynamics.py            # 300 steps, ~30 log-spaced checkpoints, 256 held-out sequences
    python benchmarks/dynamics.py --quick    # a smoke run: 20 steps, 3 checkpoints, 32 sequences, not saved

One torch thread. Times are medians (over checkpoints, or over ``--repeats`` runs). Saves
benchmarks/results/dynamics.json with the machine's environment (``benchmarks/record.py``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from attn_core import dynamics as D  # noqa: E402
from attn_core.retraining.job import TrainingJob  # noqa: E402
from attn_core.tasks import get_task  # noqa: E402
from attn_core.training import checkpoints as ckpt  # noqa: E402
from attn_core.training.config import JobConfig  # noqa: E402
from benchmarks import record  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "dynamics.json"


def train_seconds(steps: int, **checkpoints) -> tuple[float, TrainingJob]:
    cfg = JobConfig("scratch:induction-2l", steps=steps, lr=3e-3, device="cpu", eval_every=steps,
                    telemetry_every=steps, spectrum_every=steps, measure_samples=64, **checkpoints)  # fmt: skip
    job = TrainingJob.open(cfg, store=False)
    start = time.perf_counter()
    job.run()
    return time.perf_counter() - start, job


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--log", type=int, default=30, help="log-spaced checkpoints")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.log, args.samples, args.repeats = 20, 2, 32, 1
    torch.set_num_threads(1)
    plain = [train_seconds(args.steps)[0] for _ in range(args.repeats)]
    kept = [train_seconds(args.steps, checkpoint_log=args.log) for _ in range(args.repeats)]
    job = kept[-1][1]
    folder = job.checkpoints.folder
    work = Path(tempfile.mkdtemp(prefix="attn-lab-bench-"))
    try:
        writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=1), 10)
        writer.start(work / "series", job.model)
        write_ms = []
        for step in range(1, 11):
            t = time.perf_counter()
            writer.write(step, job.model)
            write_ms.append((time.perf_counter() - t) * 1e3)
        series = D.series([str(folder)])
        inputs = D.task_inputs(get_task("induction"), args.samples, seed=0)
        measure_ms = []
        for member in series.members:
            model = series.load(member).model
            t = time.perf_counter()
            D.checkpoint_metrics(model, inputs)
            measure_ms.append((time.perf_counter() - t) * 1e3)
        cold, warm, hits = [], [], []
        for r in range(args.repeats):
            cache = work / f"cache-{r}"
            t = time.perf_counter()
            D.dynamics(series, inputs, cache=D.MetricCache(cache))
            cold.append(time.perf_counter() - t)
            t = time.perf_counter()
            again = D.dynamics(series, inputs, cache=D.MetricCache(cache))
            warm.append(time.perf_counter() - t)
            hits.append(again.hits)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
    res = dict(
        steps=args.steps,
        checkpoints=len(series.members),
        samples=args.samples,
        repeats=args.repeats,
        train_s_plain=statistics.median(plain),
        train_s_with_checkpoints=statistics.median(s for s, _ in kept),
        checkpoint_bytes=writer.bytes_each,
        write_ms=statistics.median(write_ms),
        measure_ms=statistics.median(measure_ms),
        series_cold_s=statistics.median(cold),
        series_cached_s=statistics.median(warm),
        cache_hits=hits,
        **record.environment(),
    )
    res["checkpoint_overhead"] = res["train_s_with_checkpoints"] / res["train_s_plain"]
    res["cached_over_cold"] = res["series_cached_s"] / res["series_cold_s"]
    record.report(res, args.out, args.quick)


if __name__ == "__main__":
    main()
