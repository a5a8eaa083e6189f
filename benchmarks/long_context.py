"""Blocked scores of one head at long lengths against the dense path: time and peak memory.

    python benchmarks/long_context.py            # T = 1k, 2k, 4k, 8k; a 4-layer d_model-128 Llama's head change
    python benchmarks/long_context.py --json     # the result as JSON on stdout
    python benchmarks/long_context.py --quick    # a smoke run: T = 256, 512 in this process, a tiny model, not saved

1. Scaling, one head (d_head 32, random Q and K, causal), each (T, path) in a fresh child process:
   - blocked: ``bilinear.blocked.row_stats`` (per row the top-8 keys, entropy, sink mass, 32
     offsets; blocks of 512 x 512), then the whole map pooled to 800 x 800 (``long_map``);
   - dense: S = Q K^T / sqrt(d) as one T x T matrix, the masked softmax, the rows' entropy, top-8
     and sink mass (what a view without blocks does), skipped where it needs more than half the
     memory available.
   Time: wall seconds and the child's CPU seconds (the machine may be shared: CPU time is what
   the work itself took). Memory: the child's peak resident set (VmHWM) minus its resident set
   with Q and K made, i.e. what the computation added; on CUDA, ``max_memory_allocated``.
2. Head change on a Llama built by transformers (4 layers, d_model 128, 4 heads of 32, 2 key
   heads, context 8192; random weights) at 8192 random tokens: the forward up to the last layer
   (``layer_qk``, once), then per head what the Heatmaps page does: ``row_stats``, the 800-pixel
   map, ``map_plot`` serialised to JSON. Medians over the 4 heads.

Saves benchmarks/results/long_context.json (not with --quick).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "long_context.json"
FULL = dict(lengths=[1024, 2048, 4096, 8192], llama_tokens=8192, hidden=128, layers=4, ctx=8192)
QUICK = dict(lengths=[256, 512], llama_tokens=512, hidden=32, layers=2, ctx=512)
D_HEAD, K, BLOCK = 32, 8, 512


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def child(T: int, path: str, device: str) -> dict:
    """One measurement in this (fresh) process: returns seconds, CPU seconds, added peak MiB."""
    import torch

    from attn_core.bilinear.blocked import LayerQK, row_stats  # imported before the baseline
    from attn_core.bilinear.long_map import long_map

    torch.manual_seed(0)
    q = torch.randn(1, T, D_HEAD, device=device) * 2
    k = torch.randn(1, T, D_HEAD, device=device) * 2
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_kib("VmRSS:")
    wall, cpu = time.perf_counter(), time.process_time()
    if path == "blocked":
        qk = LayerQK(0, [0] * T, q, k, (0,), (D_HEAD**-0.5,), 0)
        stats = row_stats(qk, 0, k=K, block=BLOCK)
        long_map(qk, stats, pixels=800)
        out = stats.entropy
    else:
        S = (q[0] @ k[0].T) * D_HEAD**-0.5
        i = torch.arange(T, device=device)
        S.masked_fill_(i[None, :] > i[:, None], -math.inf)
        A = torch.softmax(S, -1)
        ent = -torch.where(A > 0, A * A.log(), torch.zeros_like(A)).sum(-1)
        A.topk(K, -1)
        out = ent + A[:, 0]
    if cuda:
        torch.cuda.synchronize()
    seconds, cpu_s = time.perf_counter() - wall, time.process_time() - cpu
    if cuda:
        added = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        added = (_rss_kib("VmHWM:") - base) / 1024
    assert bool(torch.isfinite(out).all())
    return dict(T=T, path=path, seconds=seconds, cpu_seconds=cpu_s, added_peak_mib=added)


def dense_fits(T: int) -> bool:
    from attn_core import limits

    return 4 * T * T * 4 <= limits.memory_limit()  # S, A and two temporaries of T x T floats


def run_child(T: int, path: str, device: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, __file__, "--child", str(T), path, device], capture_output=True, text=True, env=env
    )
    if r.returncode != 0:
        sys.exit(f"the {path} child at T={T} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


WRITER = """
import json, sys, torch, transformers
shape, folder = json.loads(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).save_pretrained(folder, safe_serialization=True)
"""


def head_change(settings: dict, device: str) -> dict:
    """The forward once, then each head's blocks, map and figure (the Heatmaps page's head change)."""
    import plotly.io as pio
    import torch

    from attn_core import sources
    from attn_core.bilinear.blocked import layer_qk, row_stats
    from attn_core.bilinear.long_map import long_map
    from attn_core.figures.long_view import map_plot

    shape = dict(
        hidden_size=settings["hidden"],
        num_hidden_layers=settings["layers"],
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * settings["hidden"],
        vocab_size=1000,
        max_position_embeddings=settings["ctx"],
    )
    if settings is QUICK:  # the same shape of model made here (no transformers: a quick run stays quick)
        from attn_core.model import ModelConfig, Transformer

        cfg = ModelConfig(
            n_layers=settings["layers"],
            n_heads=4,
            n_kv_heads=2,
            d_model=settings["hidden"],
            d_head=settings["hidden"] // 4,
            d_mlp=2 * settings["hidden"],
            n_ctx=settings["ctx"],
            d_vocab=1000,
            positional="rotary",
            normalization="rmsnorm",
        )
        torch.manual_seed(0)
        model = Transformer(cfg).eval()
    else:
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([sys.executable, "-c", WRITER, json.dumps(shape), tmp], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"writing the Llama folder with transformers failed:\n{r.stderr[-2000:]}")
            model = sources.resolve(tmp).model
    model = model.to(device)
    T, layer = settings["llama_tokens"], settings["layers"] - 1
    tokens = torch.randint(0, 1000, (T,), generator=torch.Generator().manual_seed(0)).tolist()
    start, cpu = time.perf_counter(), time.process_time()
    qk = layer_qk(model, tokens, layer)
    forward = (time.perf_counter() - start, time.process_time() - cpu)
    walls, cpus = [], []
    for head in range(4):
        start, cpu = time.perf_counter(), time.process_time()
        stats = row_stats(qk, head)
        pio.to_json(map_plot(long_map(qk, stats, pixels=800), T - 1).fig, validate=False)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return dict(
        model=shape,
        tokens=T,
        layer=layer,
        forward_seconds=forward[0],
        forward_cpu_seconds=forward[1],
        head_change_seconds=statistics.median(walls),
        head_change_cpu_seconds=statistics.median(cpus),
        head_change_seconds_each=walls,
    )


def table(result: dict) -> str:
    rows = {}
    for m in result["scaling"]:
        rows.setdefault(m["T"], {})[m["path"]] = m
    lines = ["| T | blocked s (CPU s) | blocked peak MiB | dense s (CPU s) | dense peak MiB |", "|---|---|---|---|---|"]
    for T, by in sorted(rows.items()):
        b, d = by["blocked"], by.get("dense")
        dense = f"{d['seconds']:.2f} ({d['cpu_seconds']:.2f}) | {d['added_peak_mib']:.0f}" if d else "not run | -"
        lines.append(f"| {T} | {b['seconds']:.2f} ({b['cpu_seconds']:.2f}) | {b['added_peak_mib']:.1f} | {dense} |")
    h = result["head_change"]
    lines.append(
        f"\nLlama {h['model']['num_hidden_layers']} layers, d_model {h['model']['hidden_size']}, {h['tokens']} tokens, "
        f"layer {h['layer']}: forward {h['forward_seconds']:.2f} s (CPU {h['forward_cpu_seconds']:.2f} s); head change "
        f"(blocks + 800-px map + figure) median {h['head_change_seconds']:.2f} s (CPU {h['head_change_cpu_seconds']:.2f} s)"
    )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]), sys.argv[3], sys.argv[4])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run on small sizes (not saved)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    settings = QUICK if args.quick else FULL
    scaling = []
    measure = (lambda T, path, device: child(T, path, device)) if args.quick else run_child  # a fresh process each
    for T in settings["lengths"]:
        scaling.append(measure(T, "blocked", args.device))
        if args.device != "cpu" or dense_fits(T):
            scaling.append(measure(T, "dense", args.device))
    from benchmarks import record

    result = dict(
        scaling=scaling,
        head_change=head_change(settings, args.device),
        device=args.device,
        d_head=D_HEAD,
        k=K,
        block=BLOCK,
        **record.environment(),
    )
    print(json.dumps(result) if args.json else table(result))
    if not args.quick:
        record.save(result, args.out)


if __name__ == "__main__":
    main()
