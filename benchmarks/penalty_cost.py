"""What a concentration penalty costs a training step: time and peak memory against the same
step unregularized (issue 22, "Speed and memory"; issue 34, "A penalty that never builds T x T"),
eager and compiled.

Variants of one training step (forward, next-token loss, the penalty, backward, AdamW step) on
random weights and tokens:

- ``none``:        no penalty (every layer runs the fused attention kernel);
- ``layer``:       entropy on one layer's heads (``entropy@L1``; ``@L5`` in the CUDA mode);
- ``all``:         entropy on every head from the cached Q and K, by one fused attention pass per
                   layer with V := K (regularizers/flash_rows.py; the default path since issue 34);
- ``all-blocked``: the same in blocks of query rows (regularizers/rows.py, ``path="blocked"``: the
                   path before issue 34, kept for comparison);
- ``all-sampled``: the same estimated from 64 sampled query rows per step (unbiased; blocked);
- ``all-dense``:   the path before this change, for reference: every layer's [b, h, T, T] pattern
                   formed and kept for backward (eager only).

**CPU mode** (the default; any machine): a small Llama-shaped model (d_model 256, 4 layers, 8
query heads on 2 key/value heads, RMSNorm, rotary, SwiGLU, T 512, batch 4). Time: one fresh
process per mode builds every variant (same seeded init), takes two warm-up steps of each (the
compile, the optimizer's state), then ``--steps`` rounds of one step of each variant, each
variant leading in turn, so that all see the same machine load; a variant's time ratio is the
median over rounds of its step time over ``none``'s in the same round. Memory: one fresh process
per (variant, mode), with glibc's mmap threshold fixed at 64 KiB (every large block is returned
when freed: the RSS peak is the peak of live memory, the same run after run): two warm-up steps,
the peak RSS reset (``/proc/self/clear_refs``), two steps; peak memory is the peak RSS
(``VmHWM``) over the RSS the process had before the model was built (the imported libraries),
the CPU's counterpart of ``torch.cuda.max_memory_allocated`` (compiled, it also holds the
compiled code); the step's transient part (peak over the RSS between steps) is reported beside
it.

**The penalty alone** (CPU, with ``all`` or ``all-blocked`` among the variants, or only it with
``--penalty-only``): in one more fresh process, every layer's cached Q and K of the same model
as leaves, the every-head entropy penalty's forward and backward on the fused path and on the
blocked one in turn, ``--steps`` rounds: the median time of each and what its forward keeps for
backward (saved-tensor hooks).

**CUDA mode** (``--device cuda``): the GPT-2-small shape (12 layers x 12 heads, d_model 768,
T 1024, batch 8, vocabulary 50257), bf16 autocast, fused AdamW; our model with each variant, and
transformers' ``GPT2LMHeadModel`` (sdpa) trained the same way, eager and compiled, side by side
in one process: tokens/s (median) and peak GiB (``torch.cuda.max_memory_allocated``). Without a
CUDA device it says so in one line and exits.

Goals: one-layer penalty <= 1.15x the unregularized step; entropy on every head <= 1.3x its time
and <= 1.25x its peak memory, eager and compiled.

    python benchmarks/penalty_cost.py                 # CPU mode, eager and compiled (about 30 min on 2 cores)
    python benchmarks/penalty_cost.py --modes eager --seq 256,1024 --variants all,all-blocked
                                                      # several T: one results file each, one table
    python benchmarks/penalty_cost.py --penalty-only --seq 256,1024
                                                      # the every-head entropy penalty by itself, fused
                                                      # and blocked (forward + backward from cached Q, K)
    python benchmarks/penalty_cost.py --device cuda   # CUDA mode
    python benchmarks/penalty_cost.py --quick         # tiny models, eager only (and the CUDA mode's code
                                                      # on the CPU), nothing saved
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
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
VARIANTS = ("none", "layer", "all", "all-blocked", "all-sampled", "all-dense")
PATHS = ("auto", "blocked")  # the penalty alone: the fused pass ("all"), the query blocks ("all-blocked")
MODES = ("eager", "compiled")
SAMPLED_ROWS = 64
CPU = dict(n_layers=4, n_heads=8, n_kv_heads=2, d_model=256, d_head=32, d_mlp=688, d_vocab=2048,
           normalization="rmsnorm", positional="rotary", gated_mlp=True, mlp_act="silu")  # fmt: skip
CPU_QUICK = dict(CPU, n_layers=2, n_heads=4, d_model=64, d_head=16, d_mlp=128, d_vocab=256)
GPT2 = dict(n_layers=12, n_heads=12, d_model=768, d_head=64, d_mlp=3072, d_vocab=50257, attn_bias=True,
            mlp_act="gelu_tanh")  # fmt: skip
GPT2_QUICK = dict(GPT2, n_layers=2, n_heads=2, d_model=32, d_head=16, d_mlp=128, d_vocab=128)
GOALS = {"layer_time": 1.15, "all_time": 1.3, "all_memory": 1.25}
# glibc's allocator keeps freed large blocks for reuse once its mmap threshold has adapted, so a
# process's RSS peak then depends on allocation order (tens of MiB from run to run here); with a
# fixed threshold every block over it is mapped and unmapped, and the peak is reproducible
MMAP_THRESHOLD = 65536


def penalty_for(variant: str, model, layer: int):
    """The variant's penalty and the cache its forward fills (None, None for ``none``)."""
    from attn_core import regularizers as R
    from attn_core.hooks import Cache, act_name

    if variant == "none":
        return None, lambda: None
    spec = f"entropy@L{layer}=0.01" if variant == "layer" else "entropy=0.01"
    path = "blocked" if variant == "all-blocked" else "auto"
    pen = R.build_penalty([spec], model, rows=SAMPLED_ROWS if variant == "all-sampled" else None, path=path)
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


def _setup(spec: dict, variant: str):
    """(model, optimizer, loss function) of one variant, from the same seeded init."""
    import torch

    from attn_core.model import ModelConfig
    from attn_core.training.trainer import init_model

    model = init_model(ModelConfig(n_ctx=spec["T"], **spec["shape"]), 0).train()
    pen, new_cache = penalty_for(variant, model, 1)
    loss_fn = loss_function(model, pen, new_cache)
    return (
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-4),
        torch.compile(loss_fn) if spec["mode"] == "compiled" else loss_fn,
    )


def _step(parts, tokens) -> float:
    model, opt, loss_fn = parts
    t = time.perf_counter()
    loss = loss_fn(tokens)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - t


def child(spec: dict) -> dict:
    """In this fresh process: ``memory`` runs one variant and measures its peak; ``time`` builds
    every variant and times their steps one after the other (see the module doc)."""
    import torch

    # libraries are imported before the baseline: they are not the step's memory
    import attn_core.regularizers  # noqa: F401
    import attn_core.training.trainer  # noqa: F401

    if spec["mode"] == "compiled":
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
    torch.set_num_threads(spec["threads"])
    tokens = torch.randint(0, spec["shape"]["d_vocab"], (spec["batch"], spec["T"]),
                           generator=torch.Generator().manual_seed(1))  # fmt: skip
    if spec["role"] == "penalty":
        return penalty_alone(spec, tokens)
    if spec["role"] == "time":
        parts = {v: _setup(spec, v) for v in spec["variants"]}
        first = {v: _step(p, tokens) for v, p in parts.items()}  # the compile, the optimizer's state
        for p in parts.values():
            _step(p, tokens)
        times: dict = {v: [] for v in parts}
        order = list(parts)
        for i in range(spec["steps"]):
            for v in order[i % len(order) :] + order[: i % len(order)]:  # each variant leads in turn
                times[v].append(_step(parts[v], tokens))
        return dict(times=times, first_step_s=first)
    gc.collect()
    base_kib = _status("VmRSS")
    parts = _setup(spec, spec["variant"])
    for _ in range(2):
        _step(parts, tokens)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM := VmRSS
        f.write("5")
    before_kib = _status("VmRSS")
    for _ in range(spec["steps"]):
        _step(parts, tokens)
    peak_kib = _status("VmHWM")
    return dict(base_mib=base_kib / 1024, between_steps_mib=before_kib / 1024, peak_rss_mib=peak_kib / 1024,
                peak_mib=(peak_kib - base_kib) / 1024, step_transient_mib=(peak_kib - before_kib) / 1024)  # fmt: skip


def penalty_alone(spec: dict, tokens) -> dict:
    """The every-head entropy penalty by itself, forward and backward from every layer's cached
    Q and K (leaves), on each path in turn, ``steps`` rounds: times (s) and what its forward keeps
    for backward (MiB, by saved-tensor hooks; Q and K themselves counted once per layer)."""
    import torch

    from attn_core import regularizers as R
    from attn_core.bilinear.queries_keys import layer_qk
    from attn_core.model import ModelConfig
    from attn_core.training.trainer import init_model

    model = init_model(ModelConfig(n_ctx=spec["T"], **spec["shape"]), 0)
    cache = R.qk_cache(model)
    with torch.no_grad():
        model(tokens, cache=cache)
    cfg, heads = model.cfg, list(range(model.cfg.n_heads))
    leaves = []
    for layer in range(cfg.n_layers):
        qk = layer_qk(model, cache, layer, heads)
        (q, scale), k = qk.folded(), qk.k
        leaves.append((q.detach().requires_grad_(), k.detach().requires_grad_(), scale, cfg.window(layer)))

    def run(path: str) -> float:
        t = time.perf_counter()
        total = sum(R.head_means(q, k, "entropy", window=w, scale=c, path=path).sum() for q, k, c, w in leaves)
        total.backward()
        return time.perf_counter() - t

    kept = {}
    for path in PATHS:
        run(path)  # warm-up
        sizes: dict = {}

        def pack(t, sizes=sizes):
            sizes[(t.data_ptr(), tuple(t.shape))] = t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run(path)
        kept[path] = sum(sizes.values()) / 2**20
    times: dict = {p: [] for p in PATHS}
    for i in range(spec["steps"]):
        for path in PATHS[i % 2 :] + PATHS[: i % 2]:
            times[path].append(run(path))
    return dict(times=times, kept_mib=kept)


def run_child(spec: dict) -> dict:
    env = dict(os.environ)
    if spec["role"] == "memory":  # freed blocks go back at once: the RSS peak is the live peak, run after run
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, timeout=3600, env=env
    )
    if out.returncode != 0:
        raise RuntimeError(f"{spec['variant']} ({spec['mode']}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_mode(args) -> dict:
    shape = CPU_QUICK if args.quick else CPU
    T, batch = (64, 2) if args.quick else (args.seq, args.batch)
    common = dict(shape=shape, T=T, batch=batch, threads=args.threads)
    summary, runs = {}, {}
    for mode in [] if args.penalty_only else args.modes:
        variants = [v for v in args.variants if not (v == "all-dense" and mode == "compiled")]
        timing = run_child(dict(common, role="time", mode=mode, variants=variants, steps=args.steps))
        times = timing["times"]
        print(f"{mode}: {args.steps} steps of each variant, one after the other; first steps (s): "
              + ", ".join(f"{v} {t:.1f}" for v, t in timing["first_step_s"].items()), flush=True)  # fmt: skip
        memory = {}
        for v in variants:
            memory[v] = run_child(dict(common, role="memory", mode=mode, variant=v, steps=2))
            print(f"{mode:8s} {v:11s} peak {memory[v]['peak_mib']:.0f} MiB over the imports "
                  f"(RSS {memory[v]['peak_rss_mib']:.0f} MiB)", flush=True)  # fmt: skip
        rows = {}
        for v in variants:
            ratios = [t / n for t, n in zip(times[v], times["none"])]
            step = statistics.median(times[v])
            rows[v] = dict(step_s=step, tokens_per_s=batch * T / step, time_ratio=statistics.median(ratios),
                           time_ratio_range=[min(ratios), max(ratios)], peak_mib=memory[v]["peak_mib"],
                           peak_rss_mib=memory[v]["peak_rss_mib"], step_transient_mib=memory[v]["step_transient_mib"],
                           memory_ratio=memory[v]["peak_mib"] / memory["none"]["peak_mib"])  # fmt: skip
        summary[mode], runs[mode] = rows, dict(timing=timing, memory=memory)
    alone = None
    if "eager" in args.modes and {"all", "all-blocked"} & set(args.variants):
        got = run_child(dict(common, role="penalty", mode="eager", variant="penalty alone", steps=args.steps))
        alone = {p: dict(median_s=statistics.median(got["times"][p]), kept_mib=got["kept_mib"][p]) for p in PATHS}
        alone["blocked_over_fused"] = statistics.median(
            b / a for a, b in zip(got["times"]["auto"], got["times"]["blocked"])
        )
        runs["penalty_alone"] = got
        for p in PATHS:
            print(f"penalty alone ({p}): {alone[p]['median_s'] * 1e3:.0f} ms forward + backward, "
                  f"{alone[p]['kept_mib']:.1f} MiB kept for backward", flush=True)  # fmt: skip
    model = (f"Llama-shaped: {shape['n_layers']} layers, d_model {shape['d_model']}, {shape['n_heads']} heads on "
             f"{shape['n_kv_heads']} kv heads, T {T}, batch {batch}")  # fmt: skip
    return dict(device="cpu", model=model, shape=shape, T=T, batch=batch, steps=args.steps, summary=summary,
                penalty_alone=alone, runs=runs)  # fmt: skip


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
    return side_by_side(args, torch.device("cuda"), GPT2, args.seq, args.batch)


def side_by_side(args, dev, shape: dict, T: int, batch: int) -> dict:
    """Our model with each variant and transformers' GPT2LMHeadModel (sdpa) of the same shape,
    trained the same way in this process (bf16 autocast, fused AdamW), each mode in turn. On
    CUDA steps are timed by events and memory is ``max_memory_allocated``; ``--quick`` runs this
    very code on the CPU with a tiny shape (wall-clock time, no memory figure)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from attn_core.model import ModelConfig
    from attn_core.training.trainer import init_model

    cuda = dev.type == "cuda"
    vocab = shape["d_vocab"]
    tokens = torch.randint(0, vocab, (batch, T), device=dev, generator=torch.Generator(dev).manual_seed(1))

    def measure(model, loss_fn) -> dict:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step():
            loss = loss_fn(tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        for _ in range(3):
            step()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.steps):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000)
            else:
                t = time.perf_counter()
                step()
                times.append(time.perf_counter() - t)
        step_s = statistics.median(times)
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else math.nan
        return dict(step_s=step_s, tokens_per_s=batch * T / step_s, peak_gib=peak)

    def release() -> None:
        """Free the last model, its optimizer and compiled graphs before the next one is measured."""
        gc.collect()
        torch._dynamo.reset()
        if cuda:
            torch.cuda.empty_cache()

    rows: dict = {}
    hf_config = GPT2Config(n_layer=shape["n_layers"], n_head=shape["n_heads"], n_embd=shape["d_model"],
                           n_inner=shape["d_mlp"], n_positions=T, vocab_size=vocab, bos_token_id=0, eos_token_id=0,
                           attn_implementation="sdpa")  # fmt: skip
    layer = shape["n_layers"] // 2 - 1  # L5 of 12
    for mode in args.modes:
        for variant in args.variants:
            if variant == "all-dense" and mode == "compiled":
                continue
            model = init_model(ModelConfig(n_ctx=T, **shape), 0).to(dev).train()
            pen, new_cache = penalty_for(variant, model, layer)
            loss_fn = loss_function(model, pen, new_cache, torch.bfloat16)
            res = measure(model, torch.compile(loss_fn) if mode == "compiled" else loss_fn)
            rows[f"attn_core {variant} {mode}"] = res
            print(f"attn_core {variant:11s} {mode:8s} {res['tokens_per_s']:9.0f} tokens/s  {res['peak_gib']:.2f} GiB")
            del model, pen, loss_fn
            release()
        hf = GPT2LMHeadModel(hf_config).to(dev).train()
        assert hf.config._attn_implementation == "sdpa", hf.config._attn_implementation

        def hf_loss(tok, hf=hf):
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                return hf(input_ids=tok, labels=tok).loss

        res = measure(hf, torch.compile(hf_loss) if mode == "compiled" else hf_loss)
        rows[f"transformers GPT2LMHeadModel (sdpa) {mode}"] = res
        print(f"transformers GPT2 (sdpa)  {mode:8s} {res['tokens_per_s']:9.0f} tokens/s  {res['peak_gib']:.2f} GiB")
        del hf, hf_loss
        release()
    summary = {}
    for mode in args.modes:
        none = rows[f"attn_core none {mode}"]
        hf_rate = rows[f"transformers GPT2LMHeadModel (sdpa) {mode}"]["tokens_per_s"]
        print(
            f"{mode}: attn_core unregularized / transformers tokens/s = {none['tokens_per_s'] / hf_rate:.3f} (goal >= 1)"
        )
        summary[mode] = {
            v: dict(
                time_ratio=none["tokens_per_s"] / rows[k]["tokens_per_s"],
                memory_ratio=rows[k]["peak_gib"] / none["peak_gib"],
            )  # fmt: skip
            for v in args.variants
            if (k := f"attn_core {v} {mode}") in rows
        }
        summary[mode]["none"]["vs_transformers"] = none["tokens_per_s"] / hf_rate
    name = torch.cuda.get_device_name() if cuda else "cpu (a smoke run of the CUDA mode's code)"
    return dict(device=name, model=f"GPT-2 shape {shape}", T=T, batch=batch, precision="bf16 autocast",
                optimizer="AdamW(fused=True)", rows=rows, summary=summary)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--steps", type=int, default=20, help="timed steps of each variant, after two warm-up steps")
    ap.add_argument("--seq", default=None, help="T, or several comma-separated (CPU 512, CUDA 1024)")
    ap.add_argument("--batch", type=int, default=None, help="batch (CPU 4, CUDA 8)")
    ap.add_argument("--threads", type=int, default=1, help="CPU: torch intra-op threads")
    ap.add_argument("--modes", default="eager,compiled", help="eager, compiled or both (comma-separated)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"some of {', '.join(VARIANTS)} (none is kept)")
    ap.add_argument("--out", type=Path, default=None, help=f"results file (default {RESULTS.relative_to(ROOT)})")
    ap.add_argument("--quick", action="store_true", help="tiny models, eager only, 2 steps, nothing saved")
    ap.add_argument(
        "--penalty-only", action="store_true", help="CPU: only the every-head entropy penalty alone, fused and blocked"
    )
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
    if args.steps < 1 or args.threads < 1:
        ap.error("--steps and --threads must be at least 1")
    cuda = args.device == "cuda"
    try:
        seqs = [int(t) for t in args.seq.split(",")] if args.seq else [1024 if cuda else 512]
    except ValueError:
        ap.error(f"--seq must be whole numbers separated by commas, got {args.seq!r}")
    args.batch = args.batch or (8 if cuda else 4)
    if min(seqs) < 2 or args.batch < 1:
        ap.error("--seq must be at least 2 and --batch at least 1")
    if cuda and args.penalty_only:
        ap.error("--penalty-only is a CPU measurement")
    if args.quick:
        if cuda:
            ap.error("--quick is the CPU mode's smoke run")
        args.steps, args.modes, seqs = 2, ["eager"], seqs[:1]
    results = {}
    for T in seqs:
        args.seq = T
        result = run(args, cuda)
        if result is None:
            return
        results[T] = result
        if args.quick:
            print("quick run: results not saved")
            continue
        out = args.out or (RESULTS if not cuda else RESULTS.with_name("penalty_cost_cuda.json"))
        if args.penalty_only:
            out = out.with_name(f"{out.stem}_penalty{out.suffix}")
        if len(seqs) > 1:
            out = out.with_name(f"{out.stem}_T{T}{out.suffix}")
        record.save(result, out)
        print(f"saved {out}")
    if not cuda:
        print_table(results)


def run(args, cuda: bool) -> dict | None:
    """One measurement at T = ``args.seq``, its summary printed."""
    load_start = os.getloadavg()
    result = cuda_mode(args) if cuda else cpu_mode(args)
    if result is None:
        return None
    if args.quick:  # the CUDA mode's code, on the CPU at a tiny size
        import torch

        smoke = side_by_side(args, torch.device("cpu"), GPT2_QUICK, 32, 2)
        assert set(smoke["summary"]["eager"]) >= {"none", "layer", "all"}
    result["goals"] = goals(result["summary"])
    print_summary(result)
    result.update(record.environment(), load_average_start=load_start, goal_ratios=GOALS,
                  created=time.strftime("%Y-%m-%d %H:%M:%S"))  # fmt: skip
    if not cuda:
        result["threads"] = args.threads  # the measuring processes' torch threads, not this one's
    return result


def print_table(results: dict) -> None:
    """One markdown table of the CPU mode's runs: T, mode, variant, median step, its time ratio
    to the unregularized step (median of the per-round ratios), peak memory and its ratio."""
    if any(result["summary"] for result in results.values()):
        print("| T | mode | variant | step (median) | time vs none | peak memory | memory vs none |")
        print("|---|---|---|---|---|---|---|")
    for result in results.values():
        for mode, rows in result["summary"].items():
            for variant, row in rows.items():
                print(f"| {result['T']} | {mode} | {variant} | {row['step_s']:.3f} s | {row['time_ratio']:.2f}x | "
                      f"{row['peak_mib']:.0f} MiB | {row['memory_ratio']:.2f}x |")  # fmt: skip
    if any(result.get("penalty_alone") for result in results.values()):
        print("\n| T | the every-head entropy penalty alone | forward + backward (median) | kept for backward |")
        print("|---|---|---|---|")
    for result in results.values():
        alone = result.get("penalty_alone")
        for path, name in (("auto", "fused pass (all)"), ("blocked", "query blocks (all-blocked)")):
            if alone:
                print(
                    f"| {result['T']} | {name} | {alone[path]['median_s'] * 1e3:.0f} ms | {alone[path]['kept_mib']:.1f} MiB |"
                )


if __name__ == "__main__":
    main()
