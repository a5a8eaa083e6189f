"""Speed of the factored spectrum (QR of the factors + SVD of the r x r core) against the dense
SVD of B, for every head of every layer at once; and of one dashboard click (a sequence view
with its concentration table) on a zoo model.

    python benchmarks/spectrum.py            # both shapes of the issue + the zoo click, ~1-3 min on 2 cores
    python benchmarks/spectrum.py --json     # the result as JSON on stdout
    python benchmarks/spectrum.py --quick    # a smoke run: the small shape, 2 repeats, not saved

Each time is the median of --repeats runs after one warm-up. The dense side is given B already
formed (svdvals only), the factored side starts from W_Q, W_K: the comparison favours dense.
"full spectrum" is the factored time of everything `attn-lab spectrum` reports (singular values,
eigenvalues of B and of its symmetric part, stable and effective rank).
Saves benchmarks/results/spectrum.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from attn_core import bilinear  # noqa: E402
from attn_core.sources import resolve  # noqa: E402
from benchmarks import record  # noqa: E402

SHAPES = [(64, 16, 4, 2), (512, 64, 8, 4)]  # (d_model, d_head, heads, layers)
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "spectrum.json"
TARGET_SPEEDUP, TARGET_CLICK_MS = 10.0, 20.0


def timings_ms(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def median_ms(fn, repeats: int) -> float:
    return statistics.median(timings_ms(fn, repeats))


def spectrum_case(d_model: int, d_head: int, heads: int, layers: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    W_Q = torch.randn(layers, heads, d_model, d_head, generator=g) / d_model**0.5
    W_K = torch.randn(layers, heads, d_model, d_head, generator=g) / d_model**0.5
    B = (W_Q @ W_K.transpose(-1, -2)) / d_head**0.5  # [layers, heads, d, d]

    def factored():
        return bilinear.QKForm(W_Q / d_head**0.5, W_K).singular_values

    def dense():
        return torch.linalg.svdvals(B)

    err = (factored() - dense()[..., :d_head]).abs().max().item()
    f_ms, d_ms = median_ms(factored, repeats), median_ms(dense, repeats)

    def factored_full():  # everything `attn-lab spectrum` reports
        f = bilinear.QKForm(W_Q / d_head**0.5, W_K)
        return f.singular_values, f.eigenvalues_sym, f.eigenvalues, f.stable_rank, f.effective_rank

    full_ms = median_ms(factored_full, repeats)
    return dict(
        d_model=d_model,
        d_head=d_head,
        heads=heads,
        layers=layers,
        factored_ms=f_ms,
        dense_ms=d_ms,
        speedup=d_ms / f_ms,
        max_abs_diff=err,
        full_factored_ms=full_ms,
    )


def click_case(name: str, repeats: int) -> dict:
    loaded = resolve(name)
    tokens = bilinear.sample_tokens(loaded, 0) if loaded.task else bilinear.random_tokens(loaded, 0)
    layer = loaded.config.n_layers - 1

    def click():
        view = bilinear.sequence_view(loaded, tokens, layer)
        return view.concentration_table()

    times = timings_ms(click, repeats)
    return dict(
        model=name,
        layer=layer,
        n_tokens=len(tokens),
        heads=loaded.config.n_heads,
        ms=statistics.median(times),
        min_ms=min(times),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", default="induction-2l", help="zoo model for the click timing")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's). On a busy machine 1 thread is far "
        "faster for the small ops of a click: no waiting on a descheduled worker thread",
    )
    parser.add_argument("--parts", nargs="+", choices=("spectrum", "click"), default=["spectrum", "click"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the JSON ('-' to not save)")
    parser.add_argument("--quick", action="store_true", help="smoke run: the small shape, 2 repeats, not saved")
    args = parser.parse_args(argv)
    shapes = SHAPES
    if args.quick:
        shapes, args.repeats, args.out = SHAPES[:1], 2, Path("-")
    elif args.repeats < 5:
        parser.error("--repeats must be at least 5")

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [spectrum_case(*shape, repeats=args.repeats) for shape in shapes] if "spectrum" in args.parts else []
    click = {"model": args.model, "error": "not asked for"}
    if "click" in args.parts:
        try:
            click = click_case(args.model, args.repeats if args.quick else max(20, args.repeats))
        except ValueError as e:  # the zoo model is not there
            click = {"model": args.model, "error": str(e)}
    result = dict(
        spectrum=rows,
        click=click,
        repeats=args.repeats,
        **record.environment(),
    )
    if args.out != Path("-"):
        record.save(result, args.out)
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"median of {args.repeats} (torch {torch.__version__}, {result['threads']} threads, "
        f"load average {result['load_average'][0]:.1f} when done)"
    )
    if rows:
        print(
            f"all-heads singular values\n{'d_model':>7} {'d_head':>6} {'heads':>5} {'layers':>6} {'factored ms':>12} "
            f"{'dense ms':>9} {'ratio':>7} {'max |diff|':>10} {'full spectrum ms':>16}"
        )
    for r in rows:
        print(
            f"{r['d_model']:>7} {r['d_head']:>6} {r['heads']:>5} {r['layers']:>6} {r['factored_ms']:>12.3f} "
            f"{r['dense_ms']:>9.3f} {r['speedup']:>6.1f}x {r['max_abs_diff']:>10.2e} {r['full_factored_ms']:>16.3f}"
        )
    if rows and not args.quick:  # the target is judged at the larger shape, which --quick skips
        big = rows[-1]["speedup"]
        print(
            f"target >= {TARGET_SPEEDUP:.0f}x at the larger shape: {'met' if big >= TARGET_SPEEDUP else 'MISSED'} ({big:.1f}x)"
        )
    if "ms" in click:
        print(
            f"sequence view + concentration table, {click['model']} layer {click['layer']}, {click['n_tokens']} tokens, "
            f"all {click['heads']} heads: median {click['ms']:.2f} ms, best {click['min_ms']:.2f} ms (target < {TARGET_CLICK_MS:.0f} ms: "
            f"{'met' if click['ms'] < TARGET_CLICK_MS else 'MISSED'})"
        )
    else:
        print(f"click timing skipped: {click['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
