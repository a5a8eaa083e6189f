"""Merged vs factored QK, the full comparison: factored QK (d_qk 1, 2, 4, 16) against merged QK (plain, with
weight decay on W_QK, with a nuclear-norm penalty) on induction, same architecture, data and
seeds. Saves experiments/results/merged_vs_factored.json (the page shows it) and .md (the table
and what it says), and every run in the run store (parent compare-qk:induction).

    python experiments/merged_vs_factored.py               # the full run (5 seeds x 7 variants)
    python experiments/merged_vs_factored.py --seeds 1 --steps 50 --out /tmp/smoke.json
    python experiments/merged_vs_factored.py --quick       # a smoke run: 10 steps, 1 seed, nothing saved
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attn_core import qk as Q  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400, help="training steps per run")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per variant")
    parser.add_argument("--task", default="induction")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads while training (ms/step is measured with them; 0 keeps torch's default)",
    )
    parser.add_argument("--out", type=Path, default=Q.results_path(), help="JSON result; the .md goes beside it")
    parser.add_argument("--no-store", action="store_true", help="do not save the runs in the run store")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10 steps, 1 seed, nothing saved")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seeds, args.no_store = 10, 1, True
    try:
        cfg = Q.CompareConfig(task=args.task, steps=args.steps, seeds=args.seeds, threads=args.threads)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from attn_core.progress import Progress

    bar = Progress(100, "merged vs factored", unit="")

    def progress(fraction: float, message: str) -> None:
        bar.set(100 * fraction, message)

    result = Q.compare(cfg, store=False if args.no_store else None, progress=progress)
    bar.close()
    if args.quick:
        print(result.markdown())
        return 0
    path = result.save(args.out, overwrite=True)  # this experiment's own results file
    report = path.with_suffix(".md")
    report.write_text(result.markdown())
    print(result.markdown())
    print(f"saved {path} and {report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
