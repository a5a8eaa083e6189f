"""Kernelized attention: ``kernels`` (how well one method approximates one head's softmax
attention) and ``kernels-bench`` (time and memory against exact attention as n grows; the timing
harness is ``benchmarks/kernel_methods.py`` of the repository, loaded from there)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import typer

from attn_core import limits
from attn_core.cli.common import JsonOpt, NameArg, check_head, emit, guarded, needs_task, table
from attn_core.validate import check_seed

app = typer.Typer()

_KERNEL_COLS = [
    "method",
    "features",
    "seeds",
    "rel_error_mean",
    "rel_error_std",
    "tv_mean",
    "tv_std",
    "kl_mean",
    "stable_rank",
    "spectral_norm",
]


MAX_KERNEL_SEEDS = 1000  # random draws averaged over
MAX_REPEATS = 1000  # timed calls per (n, method)

BENCH_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_methods.py"


def _bench():
    """The timing harness, ``benchmarks/kernel_methods.py`` (not part of the library)."""
    name = "attn_lab_benchmarks_kernels"
    if name not in sys.modules:
        if not BENCH_FILE.is_file():
            raise ValueError(f"kernels-bench runs {BENCH_FILE}, which is not here: run it from a checkout of attn-lab")
        spec = importlib.util.spec_from_file_location(name, BENCH_FILE)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _softmax_model(loaded) -> None:
    if loaded.config.entmax_alpha != 1.0:
        raise ValueError(
            f"model {loaded.name!r} uses alpha-entmax (alpha={loaded.config.entmax_alpha:g}), not softmax: "
            "kernel methods approximate softmax(q k^T), so there is no exact pattern to compare with"
        )


@app.command("kernels")
@guarded
def kernels_cmd(
    name: str = NameArg,
    layer: int = typer.Option(0, help="Layer index."),
    head: int = typer.Option(0, help="Head index."),
    method: str = typer.Option("favor", help="favor, maclaurin, schoenbat, nystrom or nystromformer."),
    features: int = typer.Option(64, help="Random features / landmarks m (>= 1)."),
    seeds: int = typer.Option(5, help="Seeds 0..K-1 of the random draw averaged over (>= 1)."),
    samples: int = typer.Option(16, help="Held-out task sequences the head is run on (>= 1)."),
    seed: int = typer.Option(0, help="Seed of the held-out task sequences."),
    causal: bool = typer.Option(True, "--causal/--no-causal", help="Causal mask, as the model attends."),
    as_json: bool = JsonOpt,
):
    """How well one kernel method approximates one head's softmax attention: relative output
    error |out_hat - out|_F / |out|_F and mean row total variation of the pattern, mean and std
    over seeds, with the head's stable rank |B|_F^2 / |B|_2^2 and spectral norm (float64)."""
    from attn_core import kernels
    from attn_core.sources import resolve

    if method not in kernels.METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(kernels.METHODS)}")
    limits.check_count("--features", features, hi=limits.MAX_FEATURES)
    limits.check_count("--seeds", seeds, hi=MAX_KERNEL_SEEDS)
    limits.check_count("--samples", samples, hi=limits.MAX_SAMPLES)
    check_seed("--seed", seed)
    loaded = resolve(name)
    check_head(loaded, layer, head)
    _softmax_model(loaded)
    needs_task(loaded, "there are no input sequences to run the head on")
    tokens = loaded.task.sample(samples, seed, "test").tokens
    result = {
        "name": loaded.name,
        "samples": samples,
        "sample_seed": seed,
        **kernels.head_error(
            loaded.model, tokens, layer, head, method=method, features=features, seeds=seeds, causal=causal
        ),
    }
    emit(
        result,
        as_json,
        lambda r: (
            f"{r['name']} L{layer}H{head} ({'causal' if causal else 'non-causal'}, "
            f"{samples} sequences)\n" + table([r], _KERNEL_COLS)
        ),
    )


@app.command("kernels-bench")
@guarded
def kernels_bench_cmd(
    max_n: int = typer.Option(
        4096,
        help="Longest sequence; lengths run 256, 512, ... up to it "
        "(>= 256). 4096 takes well under a minute on one CPU "
        "thread; the stored result went to 16384.",
    ),
    threads: int | None = typer.Option(1, help="torch intra-op threads for the run (>= 1)."),
    repeats: int = typer.Option(5, help="Timed calls per (n, method); the median is reported."),
    features: int = typer.Option(256, help="Random features / landmarks m."),
    causal: bool = typer.Option(
        False, "--causal/--no-causal", help="Time the causal forms (favor, maclaurin only: the others have none)."
    ),
    memory: bool = typer.Option(
        False,
        "--memory/--no-memory",
        help="Also measure peak memory, "
        "in a fresh subprocess per (n, method): adds a few seconds each "
        "(peak_mb is null without it).",
    ),
    as_json: bool = JsonOpt,
):
    """Time exact attention (sdpa) and the kernel methods at n = 256 .. max_n (4 heads, d_head 64,
    float32): milliseconds, speed-up, peak memory and the crossover n from which each method wins."""
    from attn_core import kernels

    min_n = 256
    limits.check_count("--max-n", max_n, lo=min_n, hi=limits.MAX_SEQUENCE)
    if threads is not None:
        limits.check_cpu_threads("--threads", threads)
    limits.check_count("--repeats", repeats, hi=MAX_REPEATS)
    limits.check_count("--features", features, hi=limits.MAX_FEATURES)
    # exact attention materialises [heads, n, n] scores and pattern at the longest n
    limits.check_memory(f"--max-n {max_n} (exact attention of 4 heads at n = {max_n})", 2 * 4 * max_n**2 * 4)
    bench = _bench()
    methods = kernels.CAUSAL_METHODS[:2] if causal else bench.BENCH_METHODS
    result = bench.run(
        min_n=min_n,
        max_n=max_n,
        repeats=repeats,
        methods=methods,
        features=features,
        causal=causal,
        threads=threads,
        memory=memory,
    )

    def human(r):
        cross = ", ".join(f"{m} from n={n}" if n else f"{m} never" for m, n in r["crossover"].items())
        return table(r["rows"], ["n", "method", "ms", "ratio", "peak_mb", "rel_error"]) + f"\nfaster than sdpa: {cross}"

    emit(result, as_json, human)
