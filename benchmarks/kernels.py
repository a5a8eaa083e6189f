"""Speed and memory of kernelized attention against torch's scaled_dot_product_attention.

    python benchmarks/kernels.py                 # n = 256 .. 16384, non-causal then causal, ~4 min on 2 cores
    python benchmarks/kernels.py --max-n 4096 --no-causal --json

Prints one line per (n, method) as it finishes, then the table of medians, speed-ups, crossover
lengths and peak memory, and saves the result to benchmarks/results/kernels.json: the non-causal
result of attn_core.kernels.benchmark with the causal one under "causal". The timing logic lives
in attn_core.kernels.benchmark so that `attn-lab kernels-bench` can reuse it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attn_core.kernels import BENCH_METHODS, CAUSAL_METHODS, benchmark  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "kernels.json"


def table(result: dict) -> str:
    cfg = result["config"]
    lines = [f"{'causal' if cfg['causal'] else 'non-causal'}: {cfg['heads']} heads, d_head {cfg['d_head']}, "
             f"float32, m = {cfg['features']} features/landmarks, median of {cfg['repeats']}, "
             f"{cfg['torch_threads']} thread(s)",
             f"{'n':>6} {'method':<14} {'ms':>10} {'sdpa/ms':>8} {'peak MB':>8} {'rel err':>8}"]
    for r in result["rows"]:
        peak = "-" if r["peak_mb"] is None else f"{r['peak_mb']:.1f}"
        err = f"{r['rel_error']:.3f}"
        lines.append(f"{r['n']:>6} {r['method']:<14} {r['ms']:>10.2f} {r['ratio']:>8.2f} {peak:>8} {err:>8}")
    lines.append("crossover (shortest n from which the method beats sdpa at every longer n): "
                 + ", ".join(f"{m} {n if n is not None else 'none'}" for m, n in result["crossover"].items()))
    lines.append(f"speed-up at n = {cfg['max_n']}: "
                 + ", ".join(f"{m} {x:.1f}x" for m, x in result["speedup_at_max_n"].items()))
    acc = result["accuracy"]
    lines.append(f"relative output error at n = {acc['n']} by spread of the scores q.k (timed inputs: std 1):")
    for std in sorted({r["score_std"] for r in acc["rows"]}):
        lines.append(f"  std {std:<5} " + ", ".join(f"{r['method']} {r['rel_error']:.3g}"
                                                    for r in acc["rows"] if r["score_std"] == std))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-n", type=int, default=16384)
    parser.add_argument("--min-n", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's own, all cores); 1 on a machine busy with other work")
    parser.add_argument("--methods", nargs="+", default=list(BENCH_METHODS))
    parser.add_argument("--no-causal", action="store_true", help="skip the causal pass")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout (progress goes to stderr)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the JSON ('-' to not save)")
    args = parser.parse_args(argv)

    log = sys.stderr if args.json else sys.stdout
    started = time.perf_counter()

    def progress(row):
        print(f"  n={row['n']:>6} {row['method']:<14} {row['ms']:10.2f} ms", file=log, flush=True)

    common = dict(max_n=args.max_n, min_n=args.min_n, repeats=args.repeats, d_head=args.d_head, heads=args.heads,
                  features=args.features, threads=args.threads, progress=progress)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    result = benchmark(methods=args.methods, causal=False, **common)
    print(table(result), file=log, flush=True)
    causal_methods = [m for m in args.methods if m in CAUSAL_METHODS]
    if not args.no_causal and causal_methods:
        result["causal"] = benchmark(methods=causal_methods, causal=True, **common)
        print(table(result["causal"]), file=log)
    result["config"]["wall_s"] = round(time.perf_counter() - started, 1)
    # Other processes on the machine skew the timings; the load average says how busy it was.
    result["config"]["load_average_before"] = load
    print(f"total {result['config']['wall_s']} s", file=log)
    if str(args.out) != "-":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(args.out)
        print(f"saved {args.out}", file=log)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
