"""What a concentration penalty costs a training step: time and peak memory against the same
step unregularized (issue 22, "Speed and memory"), eager and compiled.

Variants of one training step (forward, next-token loss, the penalty, backward, AdamW step) on
random weights and tokens:

- ``none``:        no penalty (every layer runs the fused attention kernel);
- ``layer``:       entropy on one layer's heads (``entropy@L1``; ``@L5`` in the CUDA mode);
- ``all``:         entropy on every head, blocked from the cached Q and K (regularizers/rows.py);
- ``all-sampled``: the same estimated from 64 sampled query rows per step (unbiased);
- ``all-dense``:   the path before this change, for reference: every layer's [b, h, T, T] pattern
                   formed and kept for backward (eager only).

**CPU mode** (the default; any machine): a small Llama-shaped model (d_model 256, 4 layers, 8
query heads on 2 key/value heads, RMSNorm, rotary, SwiGLU, T 512, batch 4). Each (variant,
mode) runs in a fresh process: two warm-up steps (the compile, the optimizer's state), then the
peak RSS is reset (``/proc/self/clear_refs``) and ``--steps`` steps are timed. Peak memory is
the step's peak RSS (``VmHWM``) over the RSS the process had before the model was built (the
imported libraries), the CPU's counterpart of ``torch.cuda.max_memory_allocated`` (compiled,
it also holds the compiled code); the step's transient part (peak over the RSS between steps) is
reported beside it. Rounds go through the variants in turn; ratios are per round against
``none`` in the same mode, medians.

**CUDA mode** (``--device cuda``): the GPT-2-small shape (12 layers x 12 heads, d_model 768,
T 1024, batch 8, vocabulary 50257), bf16 autocast, fused AdamW; our model with each variant, and
transformers' ``GPT2LMHeadModel`` (sdpa) trained the same way, eager and compiled, side by side
in one process: tokens/s (median) and peak GiB (``torch.cuda.max_memory_allocated``). Without a
CUDA device it says so in one line and exits.

Goals: one-layer penalty <= 1.15x the unregularized step; entropy on every head <= 1.3x its time
and <= 1.25x its peak memory, eager and compiled.

    python benchmarks/penalty_cost.py                     # CPU mode, eager and compiled (~20 min on 2 cores)
    python benchmarks/penalty_cost.py --device cuda       # CUDA mode
    python benchmarks/penalty_cost.py --quick             # a tiny CPU model, eager only, nothing saved
"""

from __future__ import annotations

import argparse
import ctypes
import gc
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

RESULTS = ROOT / "benchmarks" / "results" / "penalty_cost.json"
VARIANTS = ("none", "layer", "all", "all-sampled", "all-dense")
MODES = ("eager", "compiled")
SAMPLED_ROWS = 64
CPU = dict(n_layers=4, n_heads=8, n_kv_heads=2, d_model=256, d_head=32, d_mlp=688, d_vocab=2048,
           normalization="rmsnorm", positional="rotary", gated_mlp=True, mlp_act="silu")  # fmt: skip
CPU_QUICK = dict(CPU, n_layers=2, n_heads=4, d_model=64, d_head=16, d_mlp=128, d_vocab=256)
GPT2 = dict(n_layers=12, n_heads=12, d_model=768, d_head=64, d_mlp=3072, d_vocab=50257, attn_bias=True,
            mlp_act="gelu_tanh")  # fmt: skip
GOALS = {"layer_time": 1.15, "all_time": 1.3, "all_memory": 1.25}


def penalty_for(variant: str, model, layer: int):
    """The variant's penalty and the cache its forward fills (None, None for ``none``)."""
    from attn_core import regularizers as R
    from attn_core.hooks import Cache, act_name

    if variant == "none":
        return None, lambda: None
    spec = f"entropy@L{layer}=0.01" if variant == "layer" else "entropy=0.01"
    pen = R.build_penalty([spec], model, rows=SAMPLED_ROWS if variant == "all-sampled" else None)
    if variant == "all-dense":  # every pattern kept: the penalty reads them densely
        names = [act_name("pattern", l) for l in range(model.cfg.n_layers)]
        return pen, lambda: Cache(names)
    return pen, pen.cache


def loss_function(model, pen, new_cache, autocast_dtype=None):
    """forward + next-token loss (under autocast, as the Trainer) + the penalty (outside it)."""
    import torch
    import torch.nn.functional as F

    def loss_fn(tokens):
        cache = new_cache()
        with torch.autocast(tokens.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = model(tokens, cache=cache)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
        if pen is not None:
            loss = loss + sum(pen(model, None, cache).values())
        return loss

    return loss_fn


# --- CPU mode: one (variant, mode) per fresh process --------------------------------------------------


def _status(key: str) -> int:
    """A /proc/self/status figure in KiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def child(spec: dict) -> dict:
    """Run one variant in this process; its times and memory (see the module doc)."""
    import torch

    if spec["mode"] == "compiled":  # the compiler's own libraries are not the step's memory
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401

    from attn_core.model import ModelConfig
    from attn_core.training.trainer import init_model

    torch.set_num_threads(spec["threads"])
    T, batch = spec["T"], spec["batch"]
    tokens = torch.randint(0, spec["shape"]["d_vocab"], (batch, T), generator=torch.Generator().manual_seed(1))
    gc.collect()
    base_kib = _status("VmRSS")
    model = init_model(ModelConfig(n_ctx=T, **spec["shape"]), 0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    pen, new_cache = penalty_for(spec["variant"], model, 1)
    loss_fn = loss_function(model, pen, new_cache)
    if spec["mode"] == "compiled":
        loss_fn = torch.compile(loss_fn)

    def step() -> float:
        t = time.perf_counter()
        loss = loss_fn(tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return time.perf_counter() - t

    t0 = time.perf_counter()
    warm = [step() for _ in range(2)]
    warm_s = time.perf_counter() - t0
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM := VmRSS
        f.write("5")
    before_kib = _status("VmRSS")
    times = [step() for _ in range(spec["steps"])]
    peak_kib = _status("VmHWM")
    return dict(times=times, warmup_s=warm_s, first_step_s=warm[0], base_mib=base_kib / 1024,
                between_steps_mib=before_kib / 1024, peak_rss_mib=peak_kib / 1024,
                peak_mib=(peak_kib - base_kib) / 1024)  # fmt: skip


def run_child(spec: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, timeout=3600
    )
    if out.returncode != 0:
        raise RuntimeError(f"{spec['variant']} ({spec['mode']}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_mode(args) -> dict:
    shape = CPU_QUICK if args.quick else CPU
    T, batch = (64, 2) if args.quick else (args.seq, args.batch)
    runs: dict = {}
    for r in range(args.rounds):
        for mode in args.modes:
            for variant in args.variants:
                if variant == "all-dense" and mode == "compiled":
                    continue
                spec = dict(variant=variant, mode=mode, shape=shape, T=T, batch=batch, steps=args.steps,
                            threads=args.threads)  # fmt: skip
                res = run_child(spec)
                runs.setdefault(mode, {}).setdefault(variant, []).append(res)
                print(
                    f"round {r + 1} {mode:8s} {variant:11s} step {statistics.median(res['times']):.3f} s, "
                    f"peak {res['peak_mib']:.0f} MiB over the imports (RSS {res['peak_rss_mib']:.0f} MiB), "
                    f"first step {res['first_step_s']:.1f} s",
                    flush=True,
                )
    summary = {}
    for mode, by_variant in runs.items():
        none = by_variant["none"]
        rows = {}
        for variant, results in by_variant.items():
            step = [statistics.median(x["times"]) for x in results]
            ratio_t = [s / statistics.median(n["times"]) for s, n in zip(step, none)]
            ratio_m = [x["peak_mib"] / n["peak_mib"] for x, n in zip(results, none)]
            transient = [x["peak_rss_mib"] - x["between_steps_mib"] for x in results]
            rows[variant] = dict(step_s=statistics.median(step), tokens_per_s=batch * T / statistics.median(step),
                                 peak_mib=statistics.median(x["peak_mib"] for x in results),
                                 peak_rss_mib=statistics.median(x["peak_rss_mib"] for x in results),
                                 step_transient_mib=statistics.median(transient),
                                 time_ratio=statistics.median(ratio_t), memory_ratio=statistics.median(ratio_m),
                                 time_ratios=ratio_t, memory_ratios=ratio_m)  # fmt: skip
        summary[mode] = rows
    model = f"Llama-shaped {shape['n_layers']} layers, d_model {shape['d_model']}, {shape['n_heads']} heads on {shape['n_kv_heads']} kv heads, T {T}, batch {batch}"
    return dict(device="cpu", model=model, shape=shape, T=T, batch=batch, steps=args.steps, rounds=args.rounds,
                summary=summary, runs=runs)  # fmt: skip


def print_summary(result: dict) -> None:
    for mode, rows in result["summary"].items():
        for variant, row in rows.items():
            peak = (
                f"peak {row['peak_mib']:6.0f} MiB (step {row['step_transient_mib']:5.0f})  "
                if "peak_mib" in row
                else ""
            )
            rate = f"{row['tokens_per_s']:9.0f} tokens/s  " if "tokens_per_s" in row else ""
            print(
                f"{mode:8s} {variant:11s} {rate}step x{row['time_ratio']:.3f}  {peak}memory x{row['memory_ratio']:.3f}"
            )
    goals = result["goals"]
    for mode, g in goals.items():
        print(
            f"{mode}: one layer x{g['layer_time']:.3f} (goal <= {GOALS['layer_time']}), every head "
            f"x{g['all_time']:.3f} time (goal <= {GOALS['all_time']}), x{g['all_memory']:.3f} memory "
            f"(goal <= {GOALS['all_memory']})"
        )


def goals(summary: dict) -> dict:
    return {
        mode: dict(
            layer_time=rows["layer"]["time_ratio"],
            all_time=rows["all"]["time_ratio"],
            all_memory=rows["all"]["memory_ratio"],
        )  # fmt: skip
        for mode, rows in summary.items()
        if {"layer", "all"} <= set(rows)
    }


# --- CUDA mode: everything in one process ---------------------------------------------------------------


def cuda_mode(args) -> dict | None:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here: the CUDA mode is skipped (GPU figures not measured)")
        return None
    from attn_core.model import ModelConfig
    from attn_core.training.trainer import init_model

    dev = torch.device("cuda")
    T, batch = args.seq, args.batch
    tokens = torch.randint(0, GPT2["d_vocab"], (batch, T), device=dev, generator=torch.Generator(dev).manual_seed(1))

    def measure(model, loss_fn) -> dict:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step():
            loss = loss_fn(tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.steps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        step_s = statistics.median(times)
        return dict(step_s=step_s, tokens_per_s=batch * T / step_s, peak_gib=torch.cuda.max_memory_allocated() / 2**30)

    rows: dict = {}
    for mode in args.modes:
        for variant in args.variants:
            if variant == "all-dense" and mode == "compiled":
                continue
            model = init_model(ModelConfig(n_ctx=T, **GPT2), 0).to(dev).train()
            pen, new_cache = penalty_for(variant, model, 5)
            loss_fn = loss_function(model, pen, new_cache, torch.bfloat16)
            res = measure(model, torch.compile(loss_fn) if mode == "compiled" else loss_fn)
            rows[f"attn_core {variant} {mode}"] = res
            print(f"attn_core {variant:11s} {mode:8s} {res['tokens_per_s']:9.0f} tokens/s  {res['peak_gib']:.2f} GiB")
            del model, pen, loss_fn
            torch.cuda.empty_cache()
        from transformers import GPT2Config, GPT2LMHeadModel

        hf = GPT2LMHeadModel(GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=T, vocab_size=GPT2["d_vocab"]),
                             attn_implementation="sdpa").to(dev).train()  # fmt: skip

        def hf_loss(tok, hf=hf):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return hf(input_ids=tok, labels=tok).loss

        res = measure(hf, torch.compile(hf_loss) if mode == "compiled" else hf_loss)
        rows[f"transformers GPT2LMHeadModel (sdpa) {mode}"] = res
        print(f"transformers GPT2 (sdpa)  {mode:8s} {res['tokens_per_s']:9.0f} tokens/s  {res['peak_gib']:.2f} GiB")
        del hf
        torch.cuda.empty_cache()
    summary = {}
    for mode in args.modes:
        none = rows[f"attn_core none {mode}"]
        summary[mode] = {
            v: dict(
                time_ratio=none["tokens_per_s"] / rows[k]["tokens_per_s"],
                memory_ratio=rows[k]["peak_gib"] / none["peak_gib"],
            )  # fmt: skip
            for v in args.variants
            if (k := f"attn_core {v} {mode}") in rows
        }
    return dict(device=torch.cuda.get_device_name(), model="GPT-2 small shape", T=T, batch=batch,
                precision="bf16 autocast", optimizer="AdamW(fused=True)", rows=rows, summary=summary)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rounds", type=int, default=3, help="CPU: rounds over the variants (fresh processes)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run, after the warm-up")
    ap.add_argument("--seq", type=int, default=None, help="T (CPU 512, CUDA 1024)")
    ap.add_argument("--batch", type=int, default=None, help="batch (CPU 4, CUDA 8)")
    ap.add_argument("--threads", type=int, default=1, help="CPU: torch intra-op threads")
    ap.add_argument("--modes", default="eager,compiled", help="eager, compiled or both (comma-separated)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"some of {', '.join(VARIANTS)} (none is kept)")
    ap.add_argument("--out", type=Path, default=None, help=f"results file (default {RESULTS.relative_to(ROOT)})")
    ap.add_argument("--quick", action="store_true", help="a tiny CPU model, eager only, 1 round, nothing saved")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [m for m in args.modes if m not in MODES] + [v for v in variants if v not in VARIANTS]
    if bad or not args.modes:
        ap.error(f"unknown mode or variant {bad[0] if bad else '(none given)'}; modes {MODES}, variants {VARIANTS}")
    args.variants = ["none"] + [v for v in variants if v != "none"]
    if args.rounds < 1 or args.steps < 1 or args.threads < 1:
        ap.error("--rounds, --steps and --threads must be at least 1")
    cuda = args.device == "cuda"
    args.seq = args.seq or (1024 if cuda else 512)
    args.batch = args.batch or (8 if cuda else 4)
    if args.seq < 2 or args.batch < 1:
        ap.error("--seq must be at least 2 and --batch at least 1")
    if args.quick:
        if cuda:
            ap.error("--quick is the CPU mode's smoke run")
        args.rounds, args.steps, args.modes = 1, 2, ["eager"]
    load_start = os.getloadavg()
    result = cuda_mode(args) if cuda else cpu_mode(args)
    if result is None:
        return
    result["goals"] = goals(result["summary"])
    print_summary(result)
    result.update(record.environment(), load_average_start=load_start, goal_ratios=GOALS,
                  created=time.strftime("%Y-%m-%d %H:%M:%S"))  # fmt: skip
    if args.quick:
        print("quick run: results not saved")
        return
    out = args.out or (RESULTS if not cuda else RESULTS.with_name("penalty_cost_cuda.json"))
    record.save(result, out)
    print(f"saved {out}")


if __name__ == "__main__":
    main()
