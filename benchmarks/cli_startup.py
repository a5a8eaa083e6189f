"""How fast the CLI answers before any work: help and usage errors, in fresh processes.

    python benchmarks/cli_startup.py [--repeats 9] [--json] [--out benchmarks/results/cli_startup.json]
    python benchmarks/cli_startup.py --quick      # a smoke run: 2 samples of each

Each case runs ``python -m attn_core ARGS`` (what the ``attn-lab`` script does, without the
shell shim of a Python version manager) in a new process, ``--repeats`` times, and reports the
median wall time from start to exit. Target: <= 0.5 s for ``--help``, a mistyped command and a
mistyped root option (the root answers without importing any command module), and for a
command's own ``--help`` and its usage errors (the command's module reads its option defaults
from the config dataclasses, which import no torch: ``attn_core.lazy``).

It also times the bare interpreter (``python -c pass``, the floor under the current load) and
runs ``python -X importtime -m attn_core --help`` once to list the slowest imports and whether
torch or pandas were imported at all.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import record  # noqa: E402

TARGET_S = 0.5
# (name, arguments, held to the target); None: the bare interpreter, the floor on this machine now
CASES = [
    ("python itself (-c pass)", None, False),
    ("--help", ["--help"], True),
    ("no arguments (help)", [], True),
    ("mistyped command", ["sepctrum"], True),
    ("mistyped root option", ["--jsn"], True),
    ("train --help", ["train", "--help"], True),
    ("train, mistyped option", ["train", "--preset", "copy-1l", "--step", "5"], True),
    ("retrain --help", ["retrain", "--help"], True),
    ("sweep --help", ["sweep", "--help"], True),
]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def time_once(args: list[str] | None) -> tuple[float, int]:
    cmd = [sys.executable, "-c", "pass"] if args is None else [sys.executable, "-m", "attn_core", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, env=_env(), cwd=ROOT)
    return time.perf_counter() - start, proc.returncode


def import_profile(args: list[str], top: int = 8) -> dict:
    """``-X importtime`` of ``attn-lab ARGS``: total, the slowest top-level imports, torch/pandas seen."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "attn_core", *args], capture_output=True, text=True, env=_env()
    )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        _, cumulative, raw = line.removeprefix("import time:").split("|")
        rows.append((raw[1:].rstrip(), int(cumulative)))  # nested imports are indented under their importer
    modules = {name.strip() for name, _ in rows}
    top_level = [(n, us) for n, us in rows if not n.startswith(" ")]
    return {
        "total_import_s": sum(us for _, us in top_level) / 1e6,
        "slowest": [{"module": n, "s": us / 1e6} for n, us in sorted(top_level, key=lambda r: -r[1])[:top]],
        "torch_imported": "torch" in modules,
        "pandas_imported": "pandas" in modules,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9, help="samples per case (>= 5)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 samples per case")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--out", type=Path, help="also save the result as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 2
    elif args.repeats < 5:
        parser.error("--repeats must be at least 5 (medians of >= 5)")
    time_once(["--help"])  # warm the file cache once, as a user's second call would be
    cases = []
    for name, cli_args, held in CASES:
        samples, codes = zip(*(time_once(cli_args) for _ in range(args.repeats)))
        cases.append(
            {
                "case": name,
                "args": cli_args,
                "median_s": statistics.median(samples),
                "samples_s": list(samples),
                "exit_codes": sorted(set(codes)),
                "target_s": TARGET_S if held else None,
            }
        )
    result = {
        "cases": cases,
        "imports": import_profile(["--help"]),
        "imports_train_help": import_profile(["train", "--help"]),
        "python": sys.version.split()[0],
        **record.environment(),
    }
    if args.out is not None:
        record.save(result, args.out)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for c in cases:
        target = f"target <= {TARGET_S} s" if c["target_s"] else "no target"
        print(
            f"{c['case']:<26} median {c['median_s']:.3f} s of {args.repeats} ({target}); "
            f"samples {', '.join(f'{t:.3f}' for t in c['samples_s'])}; exit {c['exit_codes']}"
        )
    for key, command in (("imports", "attn-lab --help"), ("imports_train_help", "attn-lab train --help")):
        imp = result[key]
        print(
            f"imports of `{command}`: {imp['total_import_s']:.3f} s, torch imported: {imp['torch_imported']}, "
            f"pandas imported: {imp['pandas_imported']}; slowest: "
            + ", ".join(f"{s['module']} {s['s']:.3f} s" for s in imp["slowest"][:5])
        )
    print(f"load average {', '.join(f'{x:.1f}' for x in result['load_average'])} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
