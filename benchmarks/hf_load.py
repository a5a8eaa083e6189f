"""Loading a Hugging Face folder: time and memory of ``sources.resolve`` on a random
Llama-shaped model saved by transformers in bf16 as a sharded checkpoint (the layout of the
models people download), each load in a fresh process so that its peak memory is its own.

    python benchmarks/hf_load.py             # 125 M parameters, 3 shards, 5 loads
    python benchmarks/hf_load.py --quick     # a tiny model, 2 loads, nothing saved

Prints the median load time and the growth of the process's peak RSS (``VmHWM``) over what
the imports took, against the size of the float32 weights: one float copy is held, plus the
memory-mapped bf16 file pages while they are read (counted in RSS, not a copy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import record  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "hf_load.json"
FULL = dict(hidden_size=768, intermediate_size=2048, num_attention_heads=12, num_key_value_heads=4,
            num_hidden_layers=12, vocab_size=32000, shard="100MB")  # fmt: skip
QUICK = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             num_hidden_layers=2, vocab_size=1000, shard="100KB")  # fmt: skip

# VmHWM, the peak RSS of this process image (ru_maxrss would carry the parent's peak across exec)
CHILD = """
import json, sys, time
sys.path.insert(0, {root!r})
from attn_core.sources import resolve
def hwm():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
base = hwm()
t = time.perf_counter()
loaded = resolve({folder!r})
seconds = time.perf_counter() - t
peak = hwm()
print(json.dumps(dict(seconds=seconds, base_kib=base, peak_kib=peak, params=loaded.config.n_params())))
"""


def write_folder(folder: Path, shape: dict) -> int:
    import torch
    import transformers

    shape = dict(shape)
    shard = shape.pop("shard")
    cfg = transformers.LlamaConfig(max_position_embeddings=2048, **shape)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
    return len(list(folder.glob("*.safetensors")))


def load_once(folder: Path) -> dict:
    code = CHILD.format(root=str(ROOT), folder=str(folder))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="fresh-process loads (>= 2)")
    ap.add_argument("--quick", action="store_true", help="smoke run: a tiny model, 2 loads, not saved")
    args = ap.parse_args()
    if args.repeats < 2:
        ap.error("--repeats must be at least 2")
    repeats = 2 if args.quick else args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama-bf16"
        shards = write_folder(folder, QUICK if args.quick else FULL)
        file_mib = sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 2**20
        runs = [load_once(folder) for _ in range(repeats)]
    params = runs[0]["params"]
    seconds = statistics.median(r["seconds"] for r in runs)
    growth = statistics.median((r["peak_kib"] - r["base_kib"]) / 1024 for r in runs)
    weights = params * 4 / 2**20
    print(f"Llama shape, bf16, {shards} shard(s) ({file_mib:.1f} MiB on disk), {params:,} parameters")
    print(f"load (sources.resolve, fresh process): median {seconds:.2f} s of {repeats}")
    print(
        f"peak RSS growth over the imports: median {growth:.0f} MiB; float32 weights {weights:.1f} MiB, "
        f"bf16 file {file_mib:.1f} MiB (memory-mapped while read)"
    )
    if not args.quick:
        doc = dict(params=params, shards=shards, file_mib=file_mib, weights_mib=weights, load_s=seconds,
                   peak_growth_mib=growth, runs=runs)  # fmt: skip
        record.save(doc, RESULTS)


if __name__ == "__main__":
    main()
