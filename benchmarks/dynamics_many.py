"""What `attn-lab dynamics` costs on a long series (the most checkpoints a run may keep, 10,000),
to decide how many one series may hold: per checkpoint on induction-2l's architecture (151 KiB
files), the series built from its folder (headers only), each checkpoint measured (cold, every
metric), the whole series read back from the cache (warm), the cache's bytes per entry, and the
Dynamics page's curves (``figures.dynamics.panels``) drawn for the whole series (with their JSON
size) and for the 500 evenly spaced steps the page draws (``Dynamics.thinned``).

    python benchmarks/dynamics_many.py                 # 2,000 and 10,000 checkpoints, 256 held-out sequences
    python benchmarks/dynamics_many.py --quick         # 50 checkpoints, 16 sequences, not saved

The N checkpoints hold one model's weights (what is measured costs the same whatever the weights);
the cold measurement is timed on --cold of them and the rest of the cache written from that result
under each checkpoint's own key (what a cold run would have left). One torch thread; medians.
Saves benchmarks/results/dynamics_many.json with the machine's environment.
"""

from __future__ import annotations

import argparse
import json
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
from attn_core.dynamics.run import cache_key  # noqa: E402
from attn_core.figures import dynamics as fd  # noqa: E402
from attn_core.sources import resolve  # noqa: E402
from attn_core.training import checkpoints as ckpt  # noqa: E402
from benchmarks import record  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "dynamics_many.json"


def one(n: int, samples: int, cold_n: int, work: Path) -> dict:
    model = resolve("induction-2l").model
    writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=1, max_mb=1e6), n - 1)
    writer.start(work / f"series-{n}", model)
    t = time.perf_counter()
    for step in range(1, n):
        writer.write(step, model)
    write_s = time.perf_counter() - t
    t = time.perf_counter()
    series = D.series([str(work / f"series-{n}")])
    build_s = time.perf_counter() - t
    inputs = D.task_inputs(resolve("induction-2l").task, samples, seed=0)
    cache = D.MetricCache(work / f"cache-{n}", max_bytes=2**40)
    cold = []
    for member in series.members[:cold_n]:
        t = time.perf_counter()
        found = D.checkpoint_metrics(series.load(member).model, inputs, 32, 0)
        cold.append(time.perf_counter() - t)
        cache.put(cache_key(member.key, inputs, 32, 0, False), found)
    for member in series.members[cold_n:]:
        cache.put(cache_key(member.key, inputs, 32, 0, False), found)
    entry_bytes = statistics.median(p.stat().st_size for p in list(cache.folder.glob("*.json"))[:50])
    t = time.perf_counter()
    dyn = D.dynamics(series, inputs, cache=D.MetricCache(cache.folder, max_bytes=2**40))
    warm_s = time.perf_counter() - t
    assert dyn.hits == n, dyn.hits
    t = time.perf_counter()
    plots = fd.panels(dyn, 1, 0, dyn.steps[-1])
    draw_s = time.perf_counter() - t
    figure_mb = sum(len(p.fig.to_json()) for p in plots) / 2**20
    thin = dyn.thinned(500)  # what the Dynamics page draws
    t = time.perf_counter()
    fd.panels(thin, 1, 0, dyn.steps[-1])
    thin_s = time.perf_counter() - t
    return dict(
        checkpoints=n,
        write_s=write_s,
        series_build_s=build_s,
        measure_s_per_checkpoint=statistics.median(cold),
        cold_estimate_h=statistics.median(cold) * n / 3600,
        cached_s=warm_s,
        cache_entry_bytes=entry_bytes,
        cache_mib=entry_bytes * n / 2**20,
        panels_s=draw_s,
        panels_json_mib=figure_mb,
        panels_thinned_steps=len(thin.steps),
        panels_thinned_s=thin_s,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", type=int, nargs="+", default=[2000, 10000])
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--cold", type=int, default=5, help="checkpoints measured cold per count")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.counts, args.samples, args.cold = [50], 16, 2
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="attn-lab-bench-"))
    try:
        rows = []
        for n in args.counts:
            rows.append(one(n, args.samples, args.cold, work))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = dict(samples=args.samples, rows=rows, **record.environment())
    record.report(res, args.out, args.quick)


if __name__ == "__main__":
    main()
