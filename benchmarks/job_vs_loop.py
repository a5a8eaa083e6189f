"""What the live job costs over the model itself (issue 28): a plain PyTorch loop on attn_core's
model, the Trainer, the live job and the ``attn-lab retrain`` command, side by side.

Two models: an imported Hugging Face folder (a Llama built by transformers at random init, with a
byte-level BPE tokenizer trained on a generated corpus, retrained on that text) and a zoo model
(``induction-2l`` on its own task). Each trains the same steps four ways, each with and without
the every-head entropy penalty (``entropy=0.01``), eager and compiled (``--compile``):

- plain:   sample a batch, forward, loss (plus the penalty), zero_grad, backward, AdamW's step
           (fused on CUDA; CUDA batches through pinned memory, copied without a wait) -- nothing
           else; compiled, the loss function goes through ``torch.compile`` as a user would;
- trainer: ``attn_core.training.trainer.Trainer`` with the job's recipe (warmup and cosine
           schedule, clipping, the NaN guard and its last good weights, held-out evaluation);
- job:     ``TrainingJob`` as the CLI runs it (telemetry every 20 steps, spectra every 50,
           evaluation every 100, the metric log flushed to a run store), nobody watching;
- command: ``attn-lab retrain ... --json`` in a process of its own: its whole wall and CPU time
           (start-up, loading, tokenizer cache, the before/after measurement, saving the run).

Every loop runs in a fresh process. Loop rates are steps per second of the process's CPU time
(on the CPU: a machine shared with other work slows the wall clock, much less the CPU time)
over the steps after ``--warmup`` (the compile, the optimizer's state), with the time of
everything the loop does between steps; on CUDA steps per wall-clock second after a
synchronize. Peak memory: the process's peak RSS (CPU; ``VmHWM``) or
``torch.cuda.max_memory_allocated`` (CUDA). The plain process also gives the command its
baseline: a script that imports, loads and runs the plain loop's steps, its whole CPU time.
Each repeat runs every process once, in the same order; figures are medians over repeats.

CPU mode (default): 1 torch thread, the imported folder d_model 128, 4 layers, 4 query heads on
2 key/value heads, vocabulary 2048, batches of 8 blocks of 128 tokens. ``--device cuda``: the
GPT-2-small-sized Llama of the issue (88M parameters, 12 layers, 12 query heads on 4 key/value
heads, vocabulary 8192, batch 8 x 1024, bf16 autocast, fused AdamW), 150 steps.

Targets (issue 28): CPU, imported folder: job loop >= 0.9x the plain loop; the 100-step command's
CPU time <= 1.4x the plain script's. CUDA, 88M folder: job loop >= 0.9x plain, eager and
compiled; the 150-step command's wall <= plain loop + model load + 10 s (issue 34; the command's
wall is split into load, before, steps, telemetry, spectra, after, save and the rest, with the
evaluations and compiling inside the steps, from ``retrain --json``'s ``phases_s``); compiled job >= 1.4x
the eager job; every-head penalty <= 1.3x; induction-2l's CUDA job >= 5x its CPU job.

    python benchmarks/job_vs_loop.py                       # CPU, eager and compiled, 3 repeats
    python benchmarks/job_vs_loop.py --modes eager         # CPU, eager only
    python benchmarks/job_vs_loop.py --device cuda         # the 88M folder on a GPU
    python benchmarks/job_vs_loop.py --quick               # tiny shapes, eager, 1 repeat, the loops in one
                                                           # process (a smoke run: its figures mean little)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import record  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "job_vs_loop.json"
LOOPS = ("plain", "trainer", "job", "command")
PENALTY = "entropy=0.01"  # every head
ZOO = "induction-2l"
CPU = dict(hidden=128, layers=4, heads=4, kv=2, mlp=344, vocab=2048, block=128, batch=8, corpus_mb=2.0,
           steps=100, zoo_batch=64)  # fmt: skip
CPU_QUICK = dict(hidden=32, layers=2, heads=4, kv=2, mlp=64, vocab=300, block=16, batch=4, corpus_mb=0.1,
                 steps=12, zoo_batch=16)  # fmt: skip
CUDA = dict(hidden=768, layers=12, heads=12, kv=4, mlp=2048, vocab=8192, block=1024, batch=8, corpus_mb=8.0,
            steps=150, zoo_batch=64)  # fmt: skip


# --- the data: a corpus and a model folder made by transformers --------------------------------------------


def corpus(path: Path, mb: float) -> None:
    """Paragraphs of Zipf-distributed pseudo-words (benchmarks/text_retrain.py's generator)."""
    from benchmarks.text_retrain import corpus as make

    make(path, mb)


def model_folder(folder: Path, shape: dict, text: Path) -> None:
    """A Llama folder at random init (seeded) with a BPE tokenizer trained on ``text``."""
    import torch
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train([str(text)], vocab_size=shape["vocab"], min_frequency=2, special_tokens=["<|endoftext|>"],
              show_progress=False)  # fmt: skip
    cfg = transformers.LlamaConfig(
        hidden_size=shape["hidden"], num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv"], intermediate_size=shape["mlp"], vocab_size=tok.get_vocab_size(),
        max_position_embeddings=shape["block"], eos_token_id=0, bos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))


# --- one loop in this (fresh) process -----------------------------------------------------------------------


def _peak(device) -> float:
    """Peak memory so far in MiB: CUDA's allocator, else this process's peak RSS."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return record.peak_rss_kib() / 1024


class Clock:
    """Process CPU time and wall time after every step (``tick``); the rate over the steps after
    the warm-up. On CUDA each tick waits for the device first."""

    def __init__(self, device, warmup: int):
        self.device, self.warmup = device, warmup
        self.cpu: list[float] = []
        self.wall: list[float] = []

    def tick(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
        self.cpu.append(time.process_time())
        self.wall.append(time.perf_counter())

    def rates(self) -> dict:
        w = min(self.warmup, len(self.cpu) - 2)
        n = len(self.cpu) - 1 - w
        return dict(
            steps=len(self.cpu),
            timed_steps=n,
            steps_per_cpu_s=n / (self.cpu[-1] - self.cpu[w]),
            steps_per_s=n / (self.wall[-1] - self.wall[w]),
        )


def _setup(spec: dict):
    """(loaded model, task, device) of the spec's source, in this process."""
    import torch

    from attn_core.device import select_device
    from attn_core.sources import resolve

    torch.set_num_threads(spec["threads"])
    device = select_device(spec["device"])
    loaded = resolve(spec["source"])
    if spec.get("text"):
        from attn_core.text.source import text_task_for

        task = text_task_for(loaded, spec["text"], block=spec["block"])
    else:
        task = loaded.task
    return loaded, task, device


def job_config(spec: dict):
    from attn_core.training.config import JobConfig

    text = dict(text=spec["text"], block=spec["block"]) if spec.get("text") else {}
    return JobConfig(
        spec["source"], regularizers=[spec["penalty"]] if spec["penalty"] else [], steps=spec["steps"], lr=1e-3,
        batch_size=spec["batch"], device=spec["device"], precision=spec["precision"], compile=spec["compile"], **text,
    )  # fmt: skip


def plain(spec: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from attn_core import regularizers as R
    from attn_core.training.step import compile_mode

    loaded, task, device = _setup(spec)
    model = loaded.model.to(device).train()
    pen = R.build_penalty([spec["penalty"]], model) if spec["penalty"] else None
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **fused)
    dtype = torch.bfloat16 if spec["precision"] == "bf16" else None

    def loss_fn(tokens, targets, mask):
        cache = pen.cache() if pen is not None else None
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(tokens, cache=cache).flatten(0, 1)
            per_token = F.cross_entropy(logits.float(), targets.flatten(), reduction="none")
            loss = (per_token * mask.flatten()).sum() / mask.sum()
        if pen is not None:
            loss = loss + sum(pen(model, None, cache).values())
        return loss

    graphs = spec["compile"] and compile_mode(device) == "reduce-overhead"
    fn = torch.compile(loss_fn, mode=compile_mode(device), dynamic=False) if spec["compile"] else loss_fn
    data = torch.Generator().manual_seed(0)
    clock = Clock(device, spec["warmup"])
    clock.tick()
    for _ in range(spec["steps"]):
        batch = task.sample(spec["batch"], data)
        if device.type == "cuda":
            parts = [t.pin_memory().to(device, non_blocking=True) for t in (batch.tokens, batch.targets, batch.mask)]
        else:
            parts = [t.to(device) for t in (batch.tokens, batch.targets, batch.mask)]
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        loss = fn(*parts)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        clock.tick()
    return dict(**clock.rates(), peak_mib=_peak(device))


def trainer(spec: dict) -> dict:
    from attn_core import regularizers as R
    from attn_core.training.trainer import Trainer

    loaded, task, device = _setup(spec)
    model = loaded.model
    pen = R.build_penalty([spec["penalty"]], model) if spec["penalty"] else None
    train_cfg = job_config(spec).train_config({})
    clock = Clock(device, spec["warmup"])
    t = Trainer(model, task, train_cfg, callbacks=[lambda m: None], penalty=pen, device=device)
    clock.tick()
    while t.step_index < train_cfg.steps:
        t.step()
        clock.tick()
    return dict(**clock.rates(), peak_mib=_peak(device))


def job(spec: dict) -> dict:
    import torch

    from attn_core.retraining.job import TrainingJob
    from attn_core.runs import RunStore

    torch.set_num_threads(spec["threads"])
    from attn_core.device import select_device

    device = select_device(spec["device"])
    j = TrainingJob.open(job_config(spec), store=RunStore(spec["store"]))
    clock = Clock(device, spec["warmup"])
    step = j.trainer.step

    def timed():  # each step with everything the job does around it (telemetry, spectra, publishing)
        out = step()
        clock.tick()
        return out

    j.trainer.step = timed
    original_loop = j._loop

    def loop():
        clock.tick()
        return original_loop()

    j._loop = loop
    res = j.run()
    assert res["status"] == "completed", res["message"]
    # where the job's time between steps goes: its phases (telemetry, spectra, evaluations inside
    # the steps) and its slowest steps (the wall from one step's end to the next's)
    phases = {k: round(v, 3) for k, v in j.phase_seconds().items()}
    gaps = [(i, b - a) for i, (a, b) in enumerate(zip(clock.wall, clock.wall[1:]))]
    slowest = [[i, round(s, 4)] for i, s in sorted(gaps, key=lambda g: -g[1])[:6]]
    return dict(**clock.rates(), peak_mib=_peak(device), phases_s=phases, slowest_steps_s=slowest)


def child(spec: dict) -> dict:
    return {"plain": plain, "trainer": trainer, "job": job}[spec["loop"]](spec)


# --- the driver -------------------------------------------------------------------------------------------


def _env(args, store: Path) -> dict:
    threads = str(args.threads)
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
            "ATTN_LAB_RUNS": str(store)}  # fmt: skip


def _run(cmd: list[str], env: dict) -> tuple[subprocess.CompletedProcess, float, float]:
    """(result, wall s, CPU s of the child: user + system, its whole life)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed:\n{out.stdout[-1500:]}\n{out.stderr[-3000:]}")
    return out, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure_loop(spec: dict, args, store: Path) -> dict:
    if args.quick:  # the smoke run: every loop in this process (its whole time: the loop's)
        os.environ["ATTN_LAB_RUNS"] = str(store)
        cpu, wall = time.process_time(), time.perf_counter()
        res = child(spec)
        return dict(res, process_wall_s=time.perf_counter() - wall, process_cpu_s=time.process_time() - cpu)
    out, wall, cpu = _run([sys.executable, __file__, "--child", json.dumps(spec)], _env(args, store))
    return dict(json.loads(out.stdout.strip().splitlines()[-1]), process_wall_s=wall, process_cpu_s=cpu)


def measure_command(spec: dict, args, store: Path) -> dict:
    cmd = [sys.executable, "-m", "attn_core", "retrain", spec["source"], "--steps", str(spec["steps"]), "--json",
           "--lr", "1e-3", "--batch-size", str(spec["batch"]), "--device", spec["device"]]  # fmt: skip
    if spec.get("text"):
        cmd += ["--text", spec["text"], "--block", str(spec["block"])]
    if spec["penalty"]:
        cmd += ["--reg", spec["penalty"]]
    if spec["precision"] != "fp32":
        cmd += ["--precision", spec["precision"]]
    if spec["compile"]:
        cmd += ["--compile"]
    out, wall, cpu = _run(cmd, _env(args, store))
    res = json.loads(out.stdout)
    assert res["status"] == "completed", res["message"]
    # the command's wall split (issue 34): the job's own phases, compiling apart, and the rest
    # (the interpreter's start, imports, publishing and the progress bar) as what is left
    phases = {f"phase_{k}_s": v for k, v in res.get("phases_s", {}).items()}
    timed = sum(v for k, v in phases.items() if k not in ("phase_evaluation_s", "phase_compile_s"))
    return dict(process_wall_s=wall, process_cpu_s=cpu, steps_per_s=res["steps_per_s"], steps=res["steps"],
                compile_s=res.get("compile_s", 0.0), **phases, phase_rest_s=wall - timed)  # fmt: skip


def combos(args, shape: dict, folder: Path, text: Path) -> list[dict]:
    cuda = args.device == "cuda"
    common = dict(device=args.device, threads=args.threads, warmup=args.warmup,
                  precision="bf16" if cuda else "fp32")  # fmt: skip
    out = []
    for model in args.models:
        src = dict(source=str(folder), text=str(text), block=shape["block"], batch=shape["batch"], steps=args.steps)
        if model == "zoo":
            src = dict(source=ZOO, text=None, block=None, batch=shape["zoo_batch"], steps=args.steps)
        for mode in args.modes:
            for penalty in args.penalties:
                if args.quick and model == "zoo" and penalty:  # the smoke run: each path once
                    continue
                out.append(dict(common, **src, model=model, mode=mode, compile=mode == "compiled", penalty=penalty))
    return out


def key(spec: dict) -> str:
    return f"{spec['model']} {spec['mode']} {'entropy every head' if spec['penalty'] else 'no penalty'}"


def summarize(runs: dict, cuda: bool = False) -> dict:
    """Medians over repeats of every loop of every combination, and the ratios the targets read
    (steps per CPU second on the CPU, per wall second on CUDA, where the CPU waits on the device)."""
    out = {}
    for name, loops in runs.items():
        med = {}
        for loop, reps in loops.items():
            fields = {k for r in reps for k, v in r.items() if isinstance(v, (int, float))}
            med[loop] = {k: statistics.median(r[k] for r in reps if k in r) for k in sorted(fields)}
        rate = "steps_per_s" if cuda else "steps_per_cpu_s"
        ratios = {
            f"{loop}_vs_plain": med[loop][rate] / med["plain"][rate] for loop in ("trainer", "job") if loop in med
        }
        if "command" in med:
            ratios["command_cpu_vs_plain_script"] = med["command"]["process_cpu_s"] / med["plain"]["process_cpu_s"]
            ratios["command_wall_vs_plain_script"] = med["command"]["process_wall_s"] / med["plain"]["process_wall_s"]
            # issue 34's target: the command's wall <= the plain loop's steps + the model's load + 10 s
            plain_steps_s = (med["plain"]["steps"] - 1) / med["plain"][
                "steps_per_s"
            ]  # steps: ticks, one before the first
            load = med["command"].get("phase_load_s", 0.0)
            ratios["command_wall_over_loop_and_load_s"] = med["command"]["process_wall_s"] - plain_steps_s - load
        if "job" in loops:
            ratios["job_vs_plain_per_repeat"] = [j[rate] / p[rate] for j, p in zip(loops["job"], loops["plain"])]
        out[name] = dict(median=med, ratios=ratios)
    for name in list(out):  # the penalty's cost, and compiled against eager, from the same runs
        if name.endswith("no penalty"):
            with_pen = name.replace("no penalty", "entropy every head")
            if with_pen in out:
                for loop in [x for x in ("plain", "job") if x in out[name]["median"]]:
                    rate = "steps_per_s" if cuda else "steps_per_cpu_s"
                    out[with_pen]["ratios"][f"penalty_time_{loop}"] = (
                        out[name]["median"][loop][rate] / out[with_pen]["median"][loop][rate]
                    )
                    out[with_pen]["ratios"][f"penalty_memory_{loop}"] = (
                        out[with_pen]["median"][loop]["peak_mib"] / out[name]["median"][loop]["peak_mib"]
                    )
        if " compiled " in name:
            eager = name.replace(" compiled ", " eager ")
            if eager in out and "job" in out[name]["median"]:
                rate = "steps_per_s"
                out[name]["ratios"]["compiled_job_vs_eager_job_wall"] = (
                    out[name]["median"]["job"][rate] / out[eager]["median"]["job"][rate]
                )
    return out


SPLIT = ("load", "before", "steps", "telemetry", "spectra", "after", "save", "rest")


def command_split(m: dict) -> str:
    """The command's wall split into its phases (``attn-lab retrain --json``'s ``phases_s``)."""
    c = m["command"]
    parts = " + ".join(f"{k} {c[f'phase_{k}_s']:.1f}" for k in SPLIT if f"phase_{k}_s" in c)
    extra = [f"{k} {c[f'phase_{k}_s']:.1f}" for k in ("evaluation", "compile") if c.get(f"phase_{k}_s")]
    return f"command {c['process_wall_s']:.1f} s = {parts}" + (f" (steps include {', '.join(extra)})" if extra else "")


def summary_line(doc: dict) -> str:
    """One line of a saved result's figures (the GPU check's table, ``--summary FILE``)."""
    out = []
    for name, s in doc["summary"].items():
        m, r = s["median"], s["ratios"]
        text = f"{name}: job/plain {r['job_vs_plain']:.2f}"
        if "command_wall_over_loop_and_load_s" in r:  # results saved before issue 34 have no split
            text += f"; {command_split(m)}; over loop+load {r['command_wall_over_loop_and_load_s']:.1f} s"
        out.append(text)
    return " | ".join(out)


def show(summary: dict, cuda: bool) -> None:
    rate = "steps_per_s" if cuda else "steps_per_cpu_s"
    unit = "steps/s" if cuda else "steps/CPU-s"
    for name, s in summary.items():
        m, r = s["median"], s["ratios"]
        print(f"{name}:")
        print("  " + "  ".join(f"{loop} {m[loop][rate]:.2f} {unit} ({m[loop]['peak_mib']:.0f} MiB)"
                               for loop in ("plain", "trainer", "job") if loop in m))  # fmt: skip
        line = "".join(f"  {loop}/plain {r[f'{loop}_vs_plain']:.3f}" for loop in ("trainer", "job") if loop in m)
        if "command" in m:
            print(f"  command {m['command']['process_wall_s']:.1f} s wall, {m['command']['process_cpu_s']:.1f} s CPU; "
                  f"plain script {m['plain']['process_wall_s']:.1f} s wall, {m['plain']['process_cpu_s']:.1f} s CPU")  # fmt: skip
            line += (f"  command/script CPU {r['command_cpu_vs_plain_script']:.3f} "
                     f"(wall {r['command_wall_vs_plain_script']:.3f})")  # fmt: skip
            print(f"  {command_split(m)}; wall over the plain loop's steps + load "
                  f"{r['command_wall_over_loop_and_load_s']:.1f} s")  # fmt: skip
        print(line + "".join(f"  {k} {v:.3f}" for k, v in r.items() if k.startswith(("penalty_", "compiled_"))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--steps", type=int, default=None, help="steps of every loop (CPU 100, CUDA 150)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the loop rates")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every process (CPU)")
    ap.add_argument("--modes", default="eager,compiled", help="eager, compiled or both")
    ap.add_argument("--models", default="imported,zoo", help="imported, zoo or both")
    ap.add_argument("--penalties", default="none,every-head", help="none (no penalty), every-head or both")
    ap.add_argument(
        "--loops", default=",".join(LOOPS), help="which of plain, trainer, job, command (plain always runs)"
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="tiny shapes, eager, 1 repeat, nothing saved")
    ap.add_argument("--summary", type=Path, help="print one line of a saved result's figures, and stop")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.summary:
        print(summary_line(json.loads(args.summary.read_text())))
        return
    cuda = args.device == "cuda"
    if cuda:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device here: the CUDA mode is skipped (GPU figures not measured)")
            return
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in ("eager", "compiled") for m in args.modes):
        ap.error("--modes takes eager, compiled or both")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not args.models or any(m not in ("imported", "zoo") for m in args.models):
        ap.error("--models takes imported, zoo or both")
    penalties = {"none": "", "every-head": PENALTY}
    names = [p.strip() for p in args.penalties.split(",") if p.strip()]
    if not names or any(p not in penalties for p in names):
        ap.error("--penalties takes none, every-head or both")
    args.penalties = [penalties[p] for p in names]
    loops = [x.strip() for x in args.loops.split(",") if x.strip()]
    if any(x not in LOOPS for x in loops):
        ap.error(f"--loops takes {', '.join(LOOPS)}")
    args.loops = tuple(x for x in LOOPS if x in loops or x == "plain")  # every ratio is against plain
    shape = CUDA if cuda else (CPU_QUICK if args.quick else CPU)
    if args.quick:
        if cuda:
            ap.error("--quick is the CPU mode's smoke run")
        args.repeats, args.modes, args.warmup = 1, ["eager"], 2
    args.steps = args.steps or shape["steps"]
    if args.steps <= args.warmup + 1 or args.repeats < 1:
        ap.error("--steps must exceed --warmup + 1, and --repeats be at least 1")
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text, folder, store = tmp / "corpus.txt", tmp / "llama", tmp / "runs"
        random.seed(0)
        corpus(text, shape["corpus_mb"])
        model_folder(folder, shape, text)
        specs = combos(args, shape, folder, text)
        # tokenize once into the store's cache (as the CLI's first run would): every loop finds it
        if args.quick:  # the smoke run: in this process (a process of its own costs seconds of imports)
            from attn_core.runs import RunStore
            from attn_core.text.source import prepare_text

            prepare_text(str(folder), str(text), store=RunStore(store))
        else:
            subprocess.run([sys.executable, "-c", "from attn_core.text.source import prepare_text; from attn_core.runs "
                            f"import RunStore; prepare_text({str(folder)!r}, {str(text)!r}, store=RunStore())"],
                           env=_env(args, store), check=True)  # fmt: skip
        # the smoke run starts the command once (a process of its own costs seconds of imports)
        loops_of = {key(s): tuple(x for x in args.loops if x != "command" or not args.quick or i == 0)
                    for i, s in enumerate(specs)}  # fmt: skip
        runs: dict = {key(s): {loop: [] for loop in loops_of[key(s)]} for s in specs}
        for r in range(args.repeats):
            for spec in specs:
                for loop in loops_of[key(spec)]:
                    full = dict(spec, loop=loop, store=str(store))
                    res = measure_command(full, args, store) if loop == "command" else measure_loop(full, args, store)
                    runs[key(spec)][loop].append(res)
                    on_cpu = not cuda and "steps_per_cpu_s" in res
                    rate = res["steps_per_cpu_s"] if on_cpu else res["steps_per_s"]
                    print(f"  {key(spec)}, {loop}: {rate:.2f} steps/{'CPU-' if on_cpu else ''}s, "
                          f"process {res['process_wall_s']:.1f} s wall, {res['process_cpu_s']:.1f} s CPU", flush=True)  # fmt: skip
                    if "phases_s" in res:
                        print(
                            f"    phases (s): {res['phases_s']}; slowest steps [i, s]: {res['slowest_steps_s']}",
                            flush=True,
                        )
                    if loop == "command":
                        print(f"    {command_split({'command': res})}", flush=True)
                print(f"repeat {r + 1}: {key(spec)} done (load {os.getloadavg()[0]:.1f})", flush=True)
    summary = summarize(runs, cuda)
    show(summary, cuda)
    import torch

    result = dict(
        benchmark="job_vs_loop", device=torch.cuda.get_device_name() if cuda else "cpu", shape=shape,
        steps=args.steps, warmup=args.warmup, repeats=args.repeats, modes=args.modes, penalty=PENALTY,
        zoo=ZOO, summary=summary, runs=runs, load_average_start=load_start, load_average_end=os.getloadavg(), models=args.models, penalties=args.penalties, created=time.strftime("%Y-%m-%d %H:%M:%S"),
        **record.environment(),
    )  # fmt: skip
    result["threads"] = args.threads  # the measuring processes' torch threads
    targets = {"cpu: job_vs_plain (imported)": ">= 0.9", "cpu: command_cpu_vs_plain_script (imported)": "<= 1.4"}
    if cuda:
        targets = {"job_vs_plain": ">= 0.9", "compiled_job_vs_eager_job": ">= 1.4", "penalty_time_job": "<= 1.3",
                   "command_wall_over_loop_and_load_s": "<= 10 (issue 34)"}  # fmt: skip
    result["targets"] = targets
    if args.quick:
        print("quick run: results not saved")
        return
    out = args.out or (RESULTS if not cuda else RESULTS.with_name("job_vs_loop_cuda.json"))
    record.save(result, out)
    print(f"saved {out}")


if __name__ == "__main__":
    main()
