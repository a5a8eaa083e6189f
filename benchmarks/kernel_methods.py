"""Speed and memory of kernelized attention against torch's scaled_dot_product_attention: the
timing harness of attn_core.kernels (the library keeps the estimators and their error analysis).

    python benchmarks/kernel_methods.py                 # n = 256 .. 16384, non-causal then causal, ~4 min on 2 cores
    python benchmarks/kernel_methods.py --max-n 4096 --no-causal --json
    python benchmarks/kernel_methods.py --quick         # n = 256 .. 1024, a few seconds, not saved

Prints one line per (n, method) as it finishes, then the table of medians, speed-ups, crossover
lengths and peak memory, and saves the result to benchmarks/results/kernels.json: the non-causal
result of :func:`run` with the causal one under "causal". ``attn-lab kernels-bench`` loads this
file and calls :func:`run` (it returns the same dict the CLI prints).

Peak memory is measured in a fresh interpreter per (n, method): this file run with
``--memory-child``, reading one configuration as JSON on stdin.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from attn_core.kernels import CAUSAL_METHODS, approx_attention, exact_attention  # noqa: E402
from attn_core.kernels.features import _check_method, _generator, _positive_int  # noqa: E402
from benchmarks import record  # noqa: E402

BENCH_METHODS = ("favor", "maclaurin", "nystrom", "nystromformer")  # schoenbat costs what maclaurin does
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "kernels.json"
MEMORY_CHILD = "--memory-child"


def _bench_inputs(n: int, heads: int, d_head: int, seed: int, score_std: float = 1.0) -> tuple[torch.Tensor, ...]:
    """Random heads whose scores q . k have standard deviation ``score_std``: q, k ~ N(0, I)
    (score_std^2 / d)^(1/4) each (the Performer convention of splitting the scale evenly between
    q and k), v ~ N(0, I); [1, heads, n, d]."""
    g = _generator(seed)
    q, k, v = (torch.randn(1, heads, n, d_head, generator=g) for _ in range(3))
    scale = (score_std**2 / d_head) ** 0.25
    return q * scale, k * scale, v


def accuracy(
    n: int = 4096,
    methods: Sequence[str] = BENCH_METHODS,
    features: int = 256,
    d_head: int = 64,
    heads: int = 4,
    score_stds: Sequence[float] = (0.25, 0.5, 1.0),
    causal: bool = False,
    seed: int = 0,
) -> list[dict]:
    """Relative output error |out - exact| / |exact| of each method on the benchmark's random
    heads at one length, for several score spreads: the error at the benchmark's speed depends on
    the inputs far more than on n (FAVOR+'s variance grows like exp|q + k|^2). Rows: score_std,
    method, rel_error."""
    rows = []
    for score_std in score_stds:
        q, k, v = _bench_inputs(n, heads, d_head, seed, score_std)
        with torch.no_grad():
            exact = exact_attention(q, k, v, causal)
            for m in methods:
                out = approx_attention(q, k, v, m, features, seed, causal)
                rows.append(
                    {"score_std": score_std, "method": m, "rel_error": ((out - exact).norm() / exact.norm()).item()}
                )
    return rows


def _bench_call(method: str, q, k, v, features: int, causal: bool, seed: int):
    if method == "sdpa":
        return exact_attention(q, k, v, causal)
    return approx_attention(q, k, v, method, features, seed, causal)


def _rss_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _peak_memory_child() -> None:
    """Runs in a fresh interpreter per configuration, so that no allocation of an earlier one is
    reused: one call, then the rise of the resident set over it. Prints one JSON line."""
    cfg = json.loads(sys.stdin.read())
    torch.set_num_threads(cfg["threads"])
    q, k, v = _bench_inputs(cfg["n"], cfg["heads"], cfg["d_head"], cfg["seed"])
    gc.collect()
    before = _rss_kb("VmRSS")
    try:  # reset the kernel's high-water mark (VmHWM) to the current RSS
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        before = None
    with torch.no_grad():
        _bench_call(cfg["method"], q, k, v, cfg["features"], cfg["causal"], cfg["seed"])
    peak = _rss_kb("VmHWM")
    print(json.dumps({"peak_mb": None if peak is None or before is None else max(peak - before, 0) / 1024}))


def _peak_memory(config: dict, timeout: float) -> float | None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), MEMORY_CHILD],
        input=json.dumps(config),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory run of {config['method']} at n={config['n']} failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_mb"]


def crossover(rows: list[dict], method: str, baseline: str = "sdpa") -> int | None:
    """The smallest n from which ``method`` is faster than ``baseline`` at every measured length."""
    ms = {(r["method"], r["n"]): r["ms"] for r in rows}
    lengths = sorted({r["n"] for r in rows if r["method"] == method})
    found = None
    for n in reversed(lengths):
        if (baseline, n) not in ms or ms[(method, n)] >= ms[(baseline, n)]:
            break
        found = n
    return found


def run(
    min_n: int = 256,
    max_n: int = 16384,
    repeats: int = 5,
    methods: Sequence[str] = BENCH_METHODS,
    d_head: int = 64,
    heads: int = 4,
    *,
    features: int = 256,
    causal: bool = False,
    seed: int = 0,
    threads: int | None = None,
    memory: bool | str = True,
    timeout: float = 300.0,
    progress=None,
) -> dict:
    """Time exact attention (``sdpa``: torch's scaled_dot_product_attention) and each method on one
    batch of ``heads`` float32 heads (:func:`_bench_inputs`) at n = min_n, 2 min_n, ..., max_n.

    ``ms`` is the median of ``repeats`` calls after one warm-up call; the calls of all methods at
    one n are interleaved (sdpa, favor, ..., sdpa, favor, ...) so that a change in the machine's
    load hits every method alike and the ratios stay fair. ``peak_mb`` is measured in a fresh
    subprocess per (n, method): the rise of its resident memory over one call (Linux VmHWM after
    resetting it through /proc/self/clear_refs, minus VmRSS before; None where unavailable or
    ``memory=False``; ``memory="max_n"`` measures it at the largest n only, as the quick run does:
    each measurement is a fresh interpreter). ``rel_error`` is |out - sdpa| / |sdpa| on the same inputs. ``progress``, if
    given, is called with each finished row. ``threads`` sets torch's intra-op threads for the run
    (restored afterwards; None keeps the current setting): on a machine busy with other work, one
    thread avoids the stalls of two threads waiting on each other at every operation's barrier,
    which hit the many small operations of the approximations far more than sdpa's single kernel.

    Returns {config, rows: [{n, method, ms, ratio, peak_mb, rel_error}], crossover: {method: n or
    None}, speedup_at_max_n: {method: ratio}, accuracy: {n, rows: [{score_std, method, rel_error}]}},
    with ratio = sdpa ms / method ms at the same n; the timed inputs have score_std 1."""
    for method in methods:
        _check_method(method)
    if memory not in (True, False, "max_n"):
        raise ValueError(f"memory must be True, False or 'max_n', got {memory!r}")
    if min_n < 1 or max_n < min_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
    for name, value in (("repeats", repeats), ("d_head", d_head), ("heads", heads), ("features", features)):
        _positive_int(value, name)
    lengths = [min_n * 2**i for i in range(int(math.log2(max_n / min_n)) + 1)]
    names = ("sdpa", *methods)
    rows: list[dict] = []
    previous_threads = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(_positive_int(threads, "threads"))
        used_threads = torch.get_num_threads()
        for n in lengths:
            q, k, v = _bench_inputs(n, heads, d_head, seed)
            times: dict[str, list[float]] = {m: [] for m in names}
            with torch.no_grad():
                outputs = {m: _bench_call(m, q, k, v, features, causal, seed) for m in names}  # warm-up
                for _ in range(repeats):
                    for m in names:
                        t0 = time.perf_counter()
                        _bench_call(m, q, k, v, features, causal, seed)
                        times[m].append(time.perf_counter() - t0)
            sdpa_ms = 1000 * statistics.median(times["sdpa"])
            for m in names:
                ms = 1000 * statistics.median(times[m])
                config = {
                    "n": n,
                    "method": m,
                    "heads": heads,
                    "d_head": d_head,
                    "features": features,
                    "causal": causal,
                    "seed": seed,
                    "threads": used_threads,
                }
                rows.append(
                    {
                        "n": n,
                        "method": m,
                        "ms": ms,
                        "ratio": sdpa_ms / ms,
                        "peak_mb": _peak_memory(config, timeout)
                        if memory is True or (memory and n == lengths[-1])
                        else None,
                        "rel_error": ((outputs[m] - outputs["sdpa"]).norm() / outputs["sdpa"].norm()).item(),
                    }
                )
                if progress is not None:
                    progress(rows[-1])
            del outputs
    finally:
        torch.set_num_threads(previous_threads)
    return {
        "config": {
            "min_n": min_n,
            "max_n": lengths[-1],
            "repeats": repeats,
            "d_head": d_head,
            "heads": heads,
            "batch": 1,
            "features": features,
            "causal": causal,
            "dtype": "float32",
            "seed": seed,
            "inputs": "q, k ~ N(0, I) d^-1/4, v ~ N(0, I)",
            "torch_threads": used_threads,
            "torch": torch.__version__,
        },
        "rows": rows,
        "crossover": {m: crossover(rows, m) for m in methods},
        "speedup_at_max_n": {r["method"]: r["ratio"] for r in rows if r["n"] == lengths[-1] and r["method"] != "sdpa"},
        "accuracy": {
            "n": min(lengths[-1], 4096),
            "rows": accuracy(min(lengths[-1], 4096), methods, features, d_head, heads, causal=causal, seed=seed),
        },
    }


def table(result: dict) -> str:
    cfg = result["config"]
    lines = [
        f"{'causal' if cfg['causal'] else 'non-causal'}: {cfg['heads']} heads, d_head {cfg['d_head']}, "
        f"float32, m = {cfg['features']} features/landmarks, median of {cfg['repeats']}, "
        f"{cfg['torch_threads']} thread(s)",
        f"{'n':>6} {'method':<14} {'ms':>10} {'sdpa/ms':>8} {'peak MB':>8} {'rel err':>8}",
    ]
    for r in result["rows"]:
        peak = "-" if r["peak_mb"] is None else f"{r['peak_mb']:.1f}"
        err = f"{r['rel_error']:.3f}"
        lines.append(f"{r['n']:>6} {r['method']:<14} {r['ms']:>10.2f} {r['ratio']:>8.2f} {peak:>8} {err:>8}")
    lines.append(
        "crossover (shortest n from which the method beats sdpa at every longer n): "
        + ", ".join(f"{m} {n if n is not None else 'none'}" for m, n in result["crossover"].items())
    )
    lines.append(
        f"speed-up at n = {cfg['max_n']}: " + ", ".join(f"{m} {x:.1f}x" for m, x in result["speedup_at_max_n"].items())
    )
    acc = result["accuracy"]
    lines.append(f"relative output error at n = {acc['n']} by spread of the scores q.k (timed inputs: std 1):")
    for std in sorted({r["score_std"] for r in acc["rows"]}):
        lines.append(
            f"  std {std:<5} "
            + ", ".join(f"{r['method']} {r['rel_error']:.3g}" for r in acc["rows"] if r["score_std"] == std)
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-n", type=int, default=256)
    parser.add_argument("--max-n", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's own, all cores); 1 on a machine busy with other work",
    )
    parser.add_argument("--methods", nargs="+", default=list(BENCH_METHODS))
    parser.add_argument("--no-causal", action="store_true", help="skip the causal pass")
    parser.add_argument(
        "--json", action="store_true", help="print the result as JSON on stdout (progress goes to stderr)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the JSON ('-' to not save)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="n = 256 .. 1024, 2 repeats, non-causal only, peak memory at n = 1024 only; saved only with an explicit --out",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.max_n, args.repeats, args.no_causal = min(args.max_n, 1024), min(args.repeats, 2), True
        if "--out" not in (argv if argv is not None else sys.argv[1:]):
            args.out = Path("-")

    log = sys.stderr if args.json else sys.stdout
    started = time.perf_counter()

    def progress(row):
        print(f"  n={row['n']:>6} {row['method']:<14} {row['ms']:10.2f} ms", file=log, flush=True)

    common = dict(
        min_n=args.min_n,
        max_n=args.max_n,
        repeats=args.repeats,
        d_head=args.d_head,
        heads=args.heads,
        features=args.features,
        threads=args.threads,
        progress=progress,
    )
    if args.quick:  # peak memory at n = 1024 only: each measurement starts an interpreter
        common["memory"] = "max_n"
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    result = run(methods=args.methods, causal=False, **common)
    print(table(result), file=log, flush=True)
    causal_methods = [m for m in args.methods if m in CAUSAL_METHODS]
    if not args.no_causal and causal_methods:
        result["causal"] = run(methods=causal_methods, causal=True, **common)
        print(table(result["causal"]), file=log)
    result["config"]["wall_s"] = round(time.perf_counter() - started, 1)
    # Other processes on the machine skew the timings; the load average says how busy it was.
    result["config"]["load_average_before"] = load
    print(f"total {result['config']['wall_s']} s", file=log)
    if str(args.out) != "-":
        record.save(result, args.out)
        print(f"saved {args.out}", file=log)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == [MEMORY_CHILD]:
        _peak_memory_child()
        sys.exit(0)
    sys.exit(main())
