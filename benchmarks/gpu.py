"""GPU benchmark (issues 15 and 21): training steps/s on CPU and on CUDA, bare loop vs Trainer vs live job.

Two models, each trained from its seeded init on real task batches:

- (a) ``induction-2l``: the preset's architecture (2 layers x 4 heads, d_model 64, attention-only)
  on the induction task (n_ctx 24) at batch 64;
- (b) ``wide-4l``: d_model 256, 4 layers x 8 heads (d_head 32), MLP 1024, n_ctx 128, at batch 256
  on the induction task's own generator stretched to n_ctx 128 (registered in this process only
  as task ``induction-128``, so that the live job can load it from a model folder's card).

On each device three loops train the same model for the same steps, as in
benchmarks/train_throughput.py (whose loops are imported, not copied): ``bare`` (sample, forward,
loss, backward, AdamW step), ``trainer`` (attn_core's Trainer: schedule, clipping, the NaN guard
with last good weights read every ``sync_every`` steps, a held-out evaluation at the end) and
``job`` (TrainingJob with its telemetry every 20 steps and spectra every 50; its rate is taken
over the training loop, Snapshot.train_s). Held-out evaluations use 64 sequences (at most a
batch), so that a short CPU run is not dominated by them. One warm-up round, then ``--repeats`` rounds; medians are
reported, with the peak GPU memory of each loop (torch.cuda.max_memory_allocated). On CUDA every
setting runs eager and compiled (``--compile``: torch.compile with CUDA graphs; the bare loop then
compiles its model the same way). Targets (issue 21), checked in the JSON's ``verdicts``:

- wide-4l, live job, bf16: >= 200 steps/s, and bf16 >= fp32;
- induction-2l, live job on CUDA: >= 5x the same job on the CPU;
- job/bare >= 0.9 on CUDA.

Issue 34's rows: the live job's compile time apart from its steps/s (``job_compile_s``), the
seconds of each part of its run (``job_phases_s``: load, before, steps, telemetry, spectra,
after, save; evaluation and compile inside the steps), and the job's CUDA/CPU ratio for every
precision and form (``speedup_job_cuda_vs_cpu``; target 5x for induction-2l). ``--summary FILE``
prints one line of a saved result (scripts/gpu_check.sh's table).

Without a CUDA GPU the CUDA half is skipped with one line saying so, and the JSON records it (the
CPU half is measured either way).

    python benchmarks/gpu.py [--repeats 2 --devices cpu,cuda --precisions fp32,bf16 --compile eager,compiled --out FILE]
    python benchmarks/gpu.py --quick     # a smoke run: tiny steps and batches, not saved unless --out
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import train_throughput as tt  # noqa: E402  (benchmarks/ is this script's own folder)

from attn_core import checkpoint, tasks  # noqa: E402
from attn_core.card import machine  # noqa: E402
from attn_core.device import sync_interval  # noqa: E402
from attn_core.model import ModelConfig  # noqa: E402
from attn_core.presets import get_preset  # noqa: E402
from attn_core.runs import RunStore  # noqa: E402
from attn_core.training.config import TrainConfig  # noqa: E402
from attn_core.training.settings import warmup_of  # noqa: E402
from attn_core.training.trainer import init_model  # noqa: E402
from benchmarks import record  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "gpu.json"
LOOPS = ("bare", "trainer", "job")
EVAL_SAMPLES = 64


@dataclass(frozen=True)
class Setup:
    name: str
    description: str
    task: str
    model: ModelConfig
    batch_size: int
    steps: dict  # device type -> steps per loop

    def scaled(self, batch_size: int, steps: dict) -> Setup:
        return Setup(
            self.name, self.description + f" (quick: batch {batch_size})", self.task, self.model, batch_size, steps
        )


def wide_task() -> tasks.Task:
    """The induction task at n_ctx 128: the same generator and vocabulary, a longer context."""
    if "induction-128" not in tasks.TASKS:
        base = tasks.get_task("induction")
        tasks.TASKS["induction-128"] = tasks.Task(
            "induction-128",
            base.description + " (n_ctx 128, benchmarks only)",
            base.token_names,
            129,
            tasks._induction(n_ctx=128),
        )
    return tasks.TASKS["induction-128"]


def setups() -> dict[str, Setup]:
    preset = get_preset("induction-2l")
    wide = wide_task()
    return {
        "induction-2l": Setup(
            "induction-2l",
            "induction-2l architecture, induction task (n_ctx 24), batch 64",
            preset.task,
            preset.model_config(),
            64,
            {"cpu": 100, "cuda": 500},
        ),
        "wide-4l": Setup(
            "wide-4l",
            "d_model 256, 4 layers x 8 heads, d_mlp 1024, n_ctx 128, batch 256",
            wide.name,
            ModelConfig(n_layers=4, n_heads=8, d_model=256, d_head=32, d_mlp=1024, n_ctx=128, d_vocab=wide.d_vocab),
            256,
            {"cpu": 2, "cuda": 200},
        ),
    }


TARGETS = {
    "wide-4l live job bf16 on CUDA": ">= 200 steps/s, and >= the fp32 job",
    "induction-2l live job on CUDA": ">= 5x the same job on the CPU",
    "job/bare on CUDA": ">= 0.9",
}


def _job(results: list[dict], setup: str, device: str, precision: str, compiled: bool) -> float | None:
    for r in results:
        if (r["setup"], r["device"], r["precision"], r["compiled"]) == (setup, device, precision, compiled):
            return r["steps_per_s"]["job"]["median"]
    return None


def verdicts(results: list[dict]) -> list[dict]:
    """Each issue-21 target against what was measured, eager and compiled apart."""
    out = []
    for compiled in (False, True):
        form = "compiled" if compiled else "eager"
        bf16, fp32 = (_job(results, "wide-4l", "cuda", p, compiled) for p in ("bf16", "fp32"))
        if bf16 is not None:
            out.append(
                {
                    "target": f"wide-4l live job bf16 >= 200 steps/s and >= fp32 ({form})",
                    "measured": f"bf16 {bf16:.1f}, fp32 {fp32 if fp32 is None else round(fp32, 1)} steps/s",
                    "met": bf16 >= 200 and (fp32 is None or bf16 >= fp32),
                }
            )
        gpu, cpu = (
            _job(results, "induction-2l", "cuda", "fp32", compiled),
            _job(results, "induction-2l", "cpu", "fp32", False),
        )
        if gpu is not None and cpu:
            out.append(
                {
                    "target": f"induction-2l live job on CUDA >= 5x CPU ({form}, fp32)",
                    "measured": f"{gpu / cpu:.2f}x ({gpu:.1f} vs {cpu:.1f} steps/s)",
                    "met": gpu >= 5 * cpu,
                }
            )
        for r in results:
            if r["device"] == "cuda" and r["compiled"] == compiled:
                out.append(
                    {
                        "target": f"job/bare >= 0.9: {r['setup']} {r['precision']} ({form})",
                        "measured": f"{r['ratio_job_vs_bare']:.3f}",
                        "met": r["ratio_job_vs_bare"] >= 0.9,
                    }
                )
    return out


@contextlib.contextmanager
def peak_memory(device: torch.device, out: dict, key: str):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    yield
    if device.type == "cuda":
        torch.cuda.synchronize()
        out[key] = torch.cuda.max_memory_allocated(device) / 2**20


def measure(
    setup: Setup,
    device: torch.device,
    precision: str,
    repeats: int,
    warmup: bool,
    source: str,
    store: RunStore,
    job_samples: int,
    compile: bool = False,
) -> dict:
    """Median steps/s and peak memory of the three loops of ``setup`` on ``device`` (compiled
    with ``compile``)."""
    task = tasks.get_task(setup.task)
    steps = setup.steps[device.type]
    cfg = TrainConfig(
        steps=steps,
        batch_size=setup.batch_size,
        lr=1e-3,
        seed=0,
        device=str(device),
        warmup_steps=warmup_of(steps),
        eval_samples=min(EVAL_SAMPLES, setup.batch_size),
        precision=precision,
        compile=compile,
    )
    fresh = lambda: init_model(setup.model, 0)  # noqa: E731

    def bf16():  # the bare loop under the autocast the Trainer applies
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    rates: dict[str, list[float]] = {k: [] for k in LOOPS}
    memory: dict[str, float] = {}
    job_compile_s: list[float] = []  # the job's compile time, apart from its steps/s (issue 34)
    job_phases: list[dict] = []
    for r in range(repeats + int(warmup)):
        with peak_memory(device, memory, "bare"), bf16():
            b = tt.bare(fresh(), task, cfg, device)
        with peak_memory(device, memory, "trainer"):
            t = tt.trainer(fresh(), task, cfg, device)
        with peak_memory(device, memory, "job"):
            j, compile_s, phases = live_job(
                source,
                cfg,
                store,
                eval_samples=cfg.eval_samples,
                measure_samples=job_samples,
                probe_samples=min(16, job_samples),
            )
        if warmup and r == 0:
            continue
        for k, v in zip(LOOPS, (b, t, j)):
            rates[k].append(v)
        job_compile_s.append(compile_s)
        job_phases.append(phases)
        print(
            f"  {setup.name} {device.type} {precision}{' compiled' if compile else ''} round {r}: "
            f"bare {b:.2f}  trainer {t:.2f}  job {j:.2f} steps/s",
            flush=True,
        )
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "setup": setup.name,
        "device": device.type,
        "precision": precision,
        "compiled": compile,
        "steps": steps,
        "batch_size": setup.batch_size,
        "repeats": repeats,
        "sync_every": sync_interval(cfg, device),
        "steps_per_s": {k: {"median": med[k], "all": rates[k]} for k in LOOPS},
        "ratio_trainer_vs_bare": med["trainer"] / med["bare"],
        "ratio_job_vs_bare": med["job"] / med["bare"],
        "peak_memory_mib": memory or None,
        "job_compile_s": statistics.median(job_compile_s),
        "job_phases_s": {k: statistics.median(p[k] for p in job_phases) for k in job_phases[0]},
    }


def live_job(source: str, cfg: TrainConfig, store: RunStore, **settings) -> tuple[float, float, dict]:
    """The live job's steps/s over its training loop (compiling apart: ``Snapshot.steps_per_s``),
    its compile time and the seconds of each part of its run (``TrainingJob.phase_seconds``)."""
    from attn_core.retraining.job import TrainingJob
    from attn_core.training.config import JobConfig

    fields = ("steps", "lr", "seed", "device", "batch_size", "weight_decay", "warmup_steps", "precision")
    recipe = {k: getattr(cfg, k) for k in (*fields, "sync_every", "compile")}
    j = TrainingJob.open(JobConfig(source, **recipe, **settings), store=store)
    res = j.run()
    assert res["status"] == "completed", res["message"]
    snap = j.snapshot()
    return snap.steps_per_s, snap.compile_s, j.phase_seconds()


def summary_line(doc: dict) -> str:
    """One line of a saved result's figures (the GPU check's table, ``--summary FILE``)."""
    out = []
    for r in doc["results"]:
        sps = r["steps_per_s"]
        form = "compiled" if r["compiled"] else "eager"
        text = f"{r['setup']} {r['device']} {r['precision']} {form}: job {sps['job']['median']:.1f} (bare {sps['bare']['median']:.1f}) steps/s"
        out.append(text + (f", compile {r.get('job_compile_s', float('nan')):.1f} s" if r["compiled"] else ""))
    for name, by_form in doc.get("speedup_job_cuda_vs_cpu", {}).items():
        out.append(f"{name} job CUDA/CPU: " + ", ".join(f"{k} {v:.2f}x" for k, v in by_form.items()))
    return " | ".join(out) + (f" | CUDA skipped: {doc['cuda_skipped']}" if doc.get("cuda_skipped") else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="measured rounds after one warm-up round")
    ap.add_argument("--devices", default="cpu,cuda", help="comma-separated: cpu, cuda")
    ap.add_argument("--setups", default="induction-2l,wide-4l", help="comma-separated: induction-2l, wide-4l")
    ap.add_argument("--precisions", default="fp32,bf16", help="precisions measured on CUDA (CPU: fp32 only)")
    ap.add_argument(
        "--compile", default="eager,compiled", help="step forms measured on CUDA: eager, compiled (CPU: eager only)"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=None, help=f"where to save the JSON (default {RESULTS})")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny steps and batches, not saved unless --out")
    ap.add_argument("--summary", type=Path, help="print one line of a saved result's figures, and stop")
    args = ap.parse_args()
    if args.summary:
        print(summary_line(json.loads(args.summary.read_text())))
        return
    if args.repeats < 1:
        ap.error("--repeats must be positive")
    if args.threads:
        torch.set_num_threads(args.threads)
    all_setups = setups()
    chosen = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in all_setups]
    if unknown:
        ap.error(f"unknown setup {unknown[0]!r}; setups: {', '.join(all_setups)}")
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    forms = [f.strip() for f in args.compile.split(",") if f.strip()]
    if not forms or any(f not in ("eager", "compiled") for f in forms):
        ap.error(f"--compile takes eager and/or compiled, got {args.compile!r}")
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    if args.quick:
        all_setups = {
            "induction-2l": all_setups["induction-2l"].scaled(8, {"cpu": 4, "cuda": 20}),
            "wide-4l": all_setups["wide-4l"].scaled(2, {"cpu": 1, "cuda": 5}),
        }
        args.repeats = 1
    cuda = torch.cuda.is_available()
    skipped = None
    if "cuda" in devices and not cuda:
        skipped = "no CUDA GPU on this machine (torch.cuda.is_available() is False): the CUDA half is skipped"
        print(f"CUDA: skipped -- {skipped}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(Path(tmp) / "runs")
        for name in chosen:
            setup = all_setups[name]
            source = str(checkpoint.save(init_model(setup.model, 0), Path(tmp) / name, {"task": setup.task}))
            for dev in devices:
                if dev == "cuda" and not cuda:
                    continue
                device = torch.device(dev)
                for precision in precisions if dev == "cuda" else ["fp32"]:
                    for form in forms if dev == "cuda" else ["eager"]:
                        print(f"{name} on {dev} ({precision}, {form}): {setup.steps[dev]} steps per loop", flush=True)
                        results.append(
                            measure(
                                setup,
                                device,
                                precision,
                                args.repeats,
                                not args.quick,
                                source,
                                store,
                                job_samples=8 if args.quick else 64,
                                compile=form == "compiled",
                            )
                        )
    speedup, job_speedup = {}, {}
    for name in chosen:
        cpu = next((r for r in results if r["setup"] == name and r["device"] == "cpu"), None)
        gpu = next(
            (
                r
                for r in results
                if r["setup"] == name and r["device"] == "cuda" and r["precision"] == "fp32" and not r["compiled"]
            ),
            None,
        )
        if cpu and gpu:
            speedup[name] = {k: gpu["steps_per_s"][k]["median"] / cpu["steps_per_s"][k]["median"] for k in LOOPS}
        if cpu:  # the live job on CUDA against the CPU's, each precision and form (issue 34's rows)
            job_speedup[name] = {
                f"{r['precision']} {'compiled' if r['compiled'] else 'eager'}": r["steps_per_s"]["job"]["median"]
                / cpu["steps_per_s"]["job"]["median"]
                for r in results
                if r["setup"] == name and r["device"] == "cuda"
            }
    doc = {
        "benchmark": "gpu",
        "quick": args.quick,
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": cuda,
        "device_name": torch.cuda.get_device_name(0) if cuda else None,
        "cuda_skipped": skipped,
        "cpu": machine(),
        "cpu_threads": torch.get_num_threads(),
        "setups": {
            n: {
                "description": all_setups[n].description,
                "task": all_setups[n].task,
                "params": init_model(all_setups[n].model, 0).n_params(),
                "batch_size": all_setups[n].batch_size,
                "n_ctx": all_setups[n].model.n_ctx,
            }
            for n in chosen
        },
        "results": results,
        "speedup_cuda_vs_cpu_fp32": speedup,
        "speedup_job_cuda_vs_cpu": {k: v for k, v in job_speedup.items() if v},
        "targets": TARGETS,
        "verdicts": verdicts(results) if cuda else None,
        **record.environment(),
    }
    print()
    for r in results:
        sps = r["steps_per_s"]
        mem = r["peak_memory_mib"]
        print(
            f"{r['setup']:>12} {r['device']:>4} {r['precision']}: bare {sps['bare']['median']:.2f}  trainer "
            f"{sps['trainer']['median']:.2f}  job {sps['job']['median']:.2f} steps/s; trainer/bare "
            f"{r['ratio_trainer_vs_bare']:.3f}  job/bare {r['ratio_job_vs_bare']:.3f}"
            + (f"; peak GPU memory {max(mem.values()):.0f} MiB" if mem else "")
            + (f"; the job compiled in {r['job_compile_s']:.1f} s (apart from its steps/s)" if r["compiled"] else "")
        )
    for name, s in speedup.items():
        print(f"{name}: CUDA / CPU steps/s: " + ", ".join(f"{k} {v:.1f}x" for k, v in s.items()))
    for v in doc["verdicts"] or []:
        print(f"{'met' if v['met'] else 'NOT met'}: {v['target']} ({v['measured']})")
    if skipped:
        print(f"CUDA: skipped ({skipped})")
    out = args.out if args.out is not None else (None if args.quick else RESULTS)
    if out is None:
        print("quick run: results not saved")
        return
    record.save(doc, out)
    print(f"saved {out}")


if __name__ == "__main__":
    main()
