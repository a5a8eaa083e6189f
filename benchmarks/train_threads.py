"""Training threads on a busy machine: `attn-lab train` with torch's default threads (one per
core, what every run took before the trainer chose) against the threads the trainer chooses
(``attn_core.device.choose_threads``: one for a small model, and never more than the free cores).

Each pair runs ``attn-lab train --preset PRESET --steps N`` twice in fresh processes, once with
``--threads`` set to torch's default of this machine and once without it, in alternating order;
``--busy K`` starts K busy-loop processes beside them (each bounded by ``timeout``, ended when
the benchmark ends), the load that other work puts on a shared machine. We report the medians of
the training time (the card's ``wall_time_s``) and of the whole command (start-up included), the
median of the per-pair ratios, and the one-minute load average seen before each run.

    python benchmarks/train_threads.py [--preset induction-2l --steps 100 --pairs 5 --busy 3]
    python benchmarks/train_threads.py --quick     # a smoke run: 10 steps, 1 pair, no busy loops, not saved
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import record  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "train_threads.json"
BUSY = "while True: pass"


def torch_default_threads(env: dict) -> int:
    """The intra-op threads torch takes in a fresh process of this machine."""
    code = "import torch; print(torch.get_num_threads())"
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)


def train(preset: str, steps: int, threads: int | None, env: dict, timeout: float) -> dict:
    """One ``attn-lab train`` in a fresh process: its training seconds, its whole seconds and the
    threads its card says it ran with."""
    cmd = [sys.executable, "-m", "attn_core", "train", "--preset", preset, "--steps", str(steps), "--json"]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    whole = time.perf_counter() - started
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr[-1500:]}")
    card = json.loads(r.stdout)
    return {"train_s": card["wall_time_s"], "command_s": whole, "machine": card.get("machine"), "load": load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="induction-2l")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--busy", type=int, default=3, help="busy-loop processes running beside the runs")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--quick", action="store_true", help="smoke run: 10 steps, 1 pair, no busy loops, not saved")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.pairs, args.busy = 10, 1, 0
    if args.steps < 1 or args.pairs < 1 or args.busy < 0:
        ap.error("--steps and --pairs must be positive, --busy at least 0")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    default = torch_default_threads(env)
    bound = int(args.pairs * 2 * args.timeout) + 60
    busy = [subprocess.Popen(["timeout", str(bound), sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    runs: dict[str, list[dict]] = {"default": [], "chosen": []}
    try:
        if busy:
            time.sleep(5)  # the load average starts to see them
        for p in range(args.pairs):
            order = ("default", "chosen") if p % 2 == 0 else ("chosen", "default")
            for which in order:
                threads = default if which == "default" else None
                runs[which].append(train(args.preset, args.steps, threads, env, args.timeout))
            d, c = runs["default"][-1], runs["chosen"][-1]
            print(
                f"pair {p + 1}: default ({default} threads) {d['train_s']:.1f} s, chosen ({c['machine']}) "
                f"{c['train_s']:.1f} s of training; load {d['load']:.2f} / {c['load']:.2f}",
                flush=True,
            )
    finally:
        for proc in busy:  # SIGTERM: timeout passes it on to its busy loop (a SIGKILL would leave the loop running)
            proc.terminate()
            proc.wait()

    def med(which: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[which])

    loads = [r["load"] for rs in runs.values() for r in rs]
    result = {
        "benchmark": "train_threads",
        "command": f"attn-lab train --preset {args.preset} --steps {args.steps} [--threads {default}]",
        "pairs": args.pairs,
        "busy_processes": args.busy,
        "default_threads": default,
        "chosen": runs["chosen"][-1]["machine"],
        "train_s": {w: {"median": med(w, "train_s"), "all": [r["train_s"] for r in runs[w]]} for w in runs},
        "command_s": {w: {"median": med(w, "command_s"), "all": [r["command_s"] for r in runs[w]]} for w in runs},
        "speedup_train_median_of_pairs": statistics.median(
            d["train_s"] / c["train_s"] for d, c in zip(runs["default"], runs["chosen"])
        ),
        "load_average_1min": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        **record.environment(),
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(
        f"training time, median of {args.pairs}: default {default} threads {result['train_s']['default']['median']:.1f} s, "
        f"chosen {result['train_s']['chosen']['median']:.1f} s ({result['chosen']}); default/chosen per pair "
        f"{result['speedup_train_median_of_pairs']:.2f}x; whole command {result['command_s']['default']['median']:.1f} s "
        f"vs {result['command_s']['chosen']['median']:.1f} s; load average {result['load_average_1min']['min']:.2f}.."
        f"{result['load_average_1min']['max']:.2f} (median {result['load_average_1min']['median']:.2f}) with "
        f"{args.busy} busy loops beside"
    )
    if args.quick:
        print("quick run: results not saved")
        return
    record.save(result, args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
