"""What every benchmark saves with its figures: where it ran (a timing means little without the
machine, torch's threads and how busy the CPUs were) and the result file, written whole.

    from benchmarks import record
    record.save(dict(seconds=..., **record.environment()), Path("benchmarks/results/x.json"))

It has no figures of its own; ``--quick`` is accepted so that every script in benchmarks/ has a
quick mode (it prints this machine's environment).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path


def environment() -> dict:
    """torch's version and intra-op threads, the CPU count, the load average and the processor."""
    import torch

    return dict(
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        cpus=os.cpu_count(),
        load_average=os.getloadavg(),
        machine=f"{platform.machine()}, {platform.processor() or '?'}",
    )


def peak_rss_kib() -> int:
    """This process's peak resident memory so far, in KiB: ``VmHWM`` of /proc/self/status (a
    process image's own peak; ``ru_maxrss`` would carry a parent's peak across exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def rss_anon_kib() -> int:
    """This process's resident anonymous memory now, in KiB (``RssAnon``: what it allocated,
    without the file pages a memory map has touched, which RSS also counts)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


def save(result: dict, path: Path) -> Path:
    """Write ``result`` as indented JSON to ``path`` (its folder made), through a temporary file,
    so that an interrupted run leaves the previous result rather than half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def report(result: dict, path: Path, quick: bool) -> None:
    """Print ``result``; a full run (not ``--quick``) also saves it to ``path`` (:func:`save`)."""
    print(json.dumps(result, indent=2))
    if not quick:
        save(result, path)
        print(f"saved {path}")


if __name__ == "__main__":
    if sys.argv[1:] not in ([], ["--quick"]):
        sys.exit("usage: python benchmarks/record.py [--quick]  (prints this machine's environment)")
    print(json.dumps(environment(), indent=2))
