"""Training throughput: what our machinery costs over a bare PyTorch loop (issues 2 and 4).

Three loops train the same model (the induction-2l architecture, seeded init) on the same task
with the same batch size and the same AdamW, for ``--steps`` steps each:

- bare:    sample a batch, forward, loss, zero_grad, backward, optimizer step -- nothing else;
- trainer: attn_core.training.trainer.Trainer with a metrics callback, its warmup/cosine schedule, gradient
           clipping, NaN guard with last-good weights, and held-out evaluation (eval_every=250);
- job:     attn_core.retraining.job.TrainingJob (no regularizer, so the work per step is the same) with
           its defaults: a snapshot published every step, telemetry (per-head entropy on data and
           vocabulary, probe pattern) every 10 steps, spectra every 50, evaluation every 100, and
           the metric log flushed to a run store (a temporary folder) every 2 s. Its rate is taken
           over the training loop (Snapshot.train_s); the one-off before/after measurement and
           the save are reported separately.

The loops run interleaved (bare, trainer, job, bare, ...) ``--repeats`` times after one warm-up
round; we report the median steps/s of each and the ratios of medians (targets: trainer/bare
>= 0.9, job/bare >= 0.9). On a machine shared with other work these whole-run rates drift by
tens of percent between runs, so two load-robust figures come with them: bare and Trainer steps
alternated one by one in the same loop (ratio of their summed times), and the job's own split of
its loop time into Trainer.step and the rest (telemetry, snapshots, store), which gives
job/bare ~= (trainer/bare, alternated) x (step time / loop time). Finally, while a job trains in
its thread, the main thread reads ``job.snapshot()`` repeatedly: median and 99th percentile of
one read (target < 1 ms).

    python benchmarks/train_throughput.py [--steps 250 --repeats 5 --threads 1 --device auto]
    python benchmarks/train_throughput.py --quick     # a smoke run: 30 steps, 1 repeat, not saved

Old code against new, in one run: ``--against DIR`` (a checkout of the old code, e.g. ``git
worktree add /tmp/old main``) runs DIR's own copy of this script and this one alternately,
``--rounds`` times (each a fresh process with ``--repeats``), and reports the median steps/s of
each loop for both and the median of the per-round ratios new/old (the bare loop is the same
code in both: its ratio shows how much the machine drifted). Saved to
benchmarks/results/train_throughput_vs_old.json unless ``--quick``.

    python benchmarks/train_throughput.py --against /tmp/old --rounds 5 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attn_core import checkpoint  # noqa: E402
from attn_core.card import machine  # noqa: E402
from attn_core.device import select_device  # noqa: E402
from attn_core.presets import get_preset  # noqa: E402
from attn_core.retraining.job import TrainingJob  # noqa: E402
from attn_core.runs import RunStore  # noqa: E402
from attn_core.tasks import get_task  # noqa: E402
from attn_core.training.config import JobConfig, TrainConfig  # noqa: E402
from attn_core.training.settings import warmup_of  # noqa: E402
from attn_core.training.step import compile_mode  # noqa: E402
from attn_core.training.trainer import Trainer, init_model, make_optimizer  # noqa: E402
from benchmarks import record  # noqa: E402

PRESET = "induction-2l"
RESULTS = Path(__file__).resolve().parent / "results" / "train_throughput.json"
VS_OLD = Path(__file__).resolve().parent / "results" / "train_throughput_vs_old.json"
ROOT = Path(__file__).resolve().parents[1]


def bare_step(model, opt, task, cfg: TrainConfig, data, device) -> None:
    """One plain PyTorch step: sample, forward, loss, backward, optimizer step."""
    batch = task.sample(cfg.batch_size, data).to(device)
    loss = task.loss(model(batch.tokens), batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def bare(model, task, cfg: TrainConfig, device) -> float:
    """Steps/s of the plain loop; with ``cfg.compile`` the model goes through torch.compile
    (CUDA graphs on CUDA, as the Trainer's compiled step), the rest stays as it is."""
    model = model.to(device).train()
    opt = make_optimizer(model, cfg)
    data = torch.Generator().manual_seed(cfg.seed)
    forward = model
    if cfg.compile:
        forward = torch.compile(model, mode=compile_mode(device), dynamic=False)
    graphs = cfg.compile and compile_mode(device) == "reduce-overhead"
    start = time.perf_counter()
    for _ in range(cfg.steps):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        bare_step(forward, opt, task, cfg, data, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return cfg.steps / (time.perf_counter() - start)


def trainer(model, task, cfg: TrainConfig, device) -> float:
    seen = []
    t = Trainer(model, task, cfg, callbacks=[seen.append])
    start = time.perf_counter()
    t.run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert len(seen) == cfg.steps
    return cfg.steps / (time.perf_counter() - start)


def alternated(task, cfg: TrainConfig, device, make) -> float:
    """Bare steps and Trainer steps one after the other in one loop: summed bare time / summed
    Trainer time (both see the same machine load)."""
    model = make().to(device).train()
    opt = make_optimizer(model, cfg)
    data = torch.Generator().manual_seed(cfg.seed)
    t = Trainer(make(), task, cfg, callbacks=[lambda m: None])
    t_bare = t_trainer = 0.0
    for _ in range(cfg.steps):
        start = time.perf_counter()
        bare_step(model, opt, task, cfg, data, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        mid = time.perf_counter()
        t.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t_bare += mid - start
        t_trainer += time.perf_counter() - mid
    return t_bare / t_trainer


def job(source: str, cfg: TrainConfig, store: RunStore, **settings) -> tuple[float, float, float]:
    """(steps/s over the training loop, seconds of the rest: setup, before/after, save, and the
    fraction of the loop spent inside Trainer.step); ``settings`` are further JobConfig fields."""
    start = time.perf_counter()
    j = TrainingJob.open(
        JobConfig(
            source,
            steps=cfg.steps,
            lr=cfg.lr,
            seed=cfg.seed,
            device=cfg.device,
            batch_size=cfg.batch_size,
            weight_decay=cfg.weight_decay,
            warmup_steps=cfg.warmup_steps,
            precision=cfg.precision,
            sync_every=cfg.sync_every,
            compile=cfg.compile,
            **settings,
        ),
        store=store,
    )
    res = j.run()
    total = time.perf_counter() - start
    snap = j.snapshot()
    assert res["status"] == "completed", res["message"]
    return snap.steps_per_s, total - snap.train_s, snap.step_s / snap.train_s


def snapshot_reads(source: str, cfg: TrainConfig, store: RunStore) -> list[float]:
    j = TrainingJob.open(
        JobConfig(source, steps=cfg.steps, lr=cfg.lr, device=cfg.device, batch_size=cfg.batch_size), store=store
    ).start()
    times = []
    while not j.snapshot().done:
        t = time.perf_counter()
        snap = j.snapshot()
        _ = (snap.step, snap.status, snap.latest.get("loss"), snap.probe_pattern)
        times.append(time.perf_counter() - t)
        time.sleep(0.001)
    j.join()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the same for every loop)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--quick", action="store_true", help="smoke run: 30 steps, 1 repeat, results not saved")
    ap.add_argument("--against", type=Path, help="a checkout of older code: run its copy of this script alternately")
    ap.add_argument("--rounds", type=int, default=5, help="with --against: alternated rounds")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.repeats, args.rounds = 30, 1, 1
    if args.against is not None:
        return against(args)
    if args.steps <= 0 or args.repeats < 1:
        ap.error("--steps and --repeats must be positive")
    torch.set_num_threads(args.threads)
    device = select_device(args.device)
    preset = get_preset(PRESET)
    task = get_task(preset.task)
    cfg = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=1e-3,
        seed=0,
        device=str(device),
        warmup_steps=warmup_of(args.steps),
    )

    with tempfile.TemporaryDirectory() as tmp:
        source = str(checkpoint.save(init_model(preset.model_config(), 0), Path(tmp) / "model", {"task": preset.task}))
        store = RunStore(Path(tmp) / "runs")
        fresh = lambda: init_model(preset.model_config(), 0)  # noqa: E731
        rates = {"bare": [], "trainer": [], "job": []}
        overhead, step_share, alt = [], [], []
        for r in range(args.repeats + 1):  # round 0 warms up (first optimizer step, allocator, imports)
            b = bare(fresh(), task, cfg, device)
            t = trainer(fresh(), task, cfg, device)
            jr, extra, share = job(source, cfg, store)
            a = alternated(task, cfg, device, fresh)
            if r == 0:
                continue
            rates["bare"].append(b)
            rates["trainer"].append(t)
            rates["job"].append(jr)
            overhead.append(extra)
            step_share.append(share)
            alt.append(a)
            print(
                f"repeat {r}: bare {b:.1f}  trainer {t:.1f}  job {jr:.1f} steps/s; alternated trainer/bare {a:.3f}, "
                f"job loop in Trainer.step {share:.3f}",
                flush=True,
            )
        reads = snapshot_reads(source, cfg, store)

    med = {k: statistics.median(v) for k, v in rates.items()}
    reads_sorted = sorted(reads)
    result = {
        "benchmark": "train_throughput",
        "model": f"{PRESET} architecture ({init_model(preset.model_config(), 0).n_params():,} parameters)",
        "task": preset.task,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "repeats": args.repeats,
        "device": str(device),
        "threads": args.threads,
        "machine": machine(),
        "steps_per_s": {k: {"median": med[k], "all": v} for k, v in rates.items()},
        "ratio_trainer_vs_bare": med["trainer"] / med["bare"],
        "ratio_job_vs_bare": med["job"] / med["bare"],
        "ratio_trainer_vs_bare_per_repeat_median": statistics.median(
            t / b for t, b in zip(rates["trainer"], rates["bare"])
        ),
        "ratio_job_vs_bare_per_repeat_median": statistics.median(j / b for j, b in zip(rates["job"], rates["bare"])),
        "alternated_trainer_vs_bare_median": statistics.median(alt),
        "alternated_trainer_vs_bare_all": alt,
        "job_loop_share_in_trainer_step_median": statistics.median(step_share),
        "ratio_job_vs_bare_estimate": statistics.median(alt) * statistics.median(step_share),
        "job_setup_measure_save_s_median": statistics.median(overhead),
        "snapshot_read_us": {
            "median": 1e6 * statistics.median(reads),
            "p99": 1e6 * reads_sorted[int(0.99 * (len(reads) - 1))],
            "reads": len(reads),
        },
        "targets": {"ratio_trainer_vs_bare": ">= 0.9", "ratio_job_vs_bare": ">= 0.9", "snapshot_read": "< 1 ms"},
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(f"median steps/s: bare {med['bare']:.1f}, trainer {med['trainer']:.1f}, job {med['job']:.1f}")
    print(
        f"trainer/bare {result['ratio_trainer_vs_bare']:.3f}   job/bare {result['ratio_job_vs_bare']:.3f}   "
        f"(per-repeat medians {result['ratio_trainer_vs_bare_per_repeat_median']:.3f}, "
        f"{result['ratio_job_vs_bare_per_repeat_median']:.3f})"
    )
    print(
        f"load-robust: alternated trainer/bare {result['alternated_trainer_vs_bare_median']:.3f}; the job spends "
        f"{result['job_loop_share_in_trainer_step_median']:.3f} of its loop in Trainer.step, so job/bare ~= "
        f"{result['ratio_job_vs_bare_estimate']:.3f}"
    )
    print(f"job setup + before/after measurement + save: {result['job_setup_measure_save_s_median']:.2f} s per run")
    print(
        f"snapshot read: median {result['snapshot_read_us']['median']:.1f} us, "
        f"p99 {result['snapshot_read_us']['p99']:.1f} us over {len(reads)} reads"
    )
    if args.quick:
        print("quick run: results not saved")
        return
    record.save(result, args.out)
    print(f"saved {args.out}")


def _one_run(root: Path, args, out: Path) -> dict:
    """This benchmark as the code under ``root`` has it, in a fresh process; its JSON."""
    cmd = [sys.executable, str(root / "benchmarks" / "train_throughput.py"), "--steps", str(args.steps)]
    cmd += ["--repeats", str(args.repeats), "--threads", str(args.threads), "--device", args.device, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": str(args.threads)}
    subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())


def against(args) -> None:
    """Old (``args.against``) and new (this checkout) alternated ``args.rounds`` times."""
    old_root = args.against.resolve()
    if not (old_root / "benchmarks" / "train_throughput.py").is_file():
        sys.exit(f"{old_root} has no benchmarks/train_throughput.py: give a checkout of the old code")
    loops = ("bare", "trainer", "job")
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for which, root in (("old", old_root), ("new", ROOT)):
                runs[which].append(_one_run(root, args, Path(tmp) / f"{which}-{r}.json"))
            rates = {w: {k: runs[w][-1]["steps_per_s"][k]["median"] for k in loops} for w in runs}
            print(
                f"round {r + 1}: "
                + "; ".join(f"{w} " + ", ".join(f"{k} {v:.1f}" for k, v in rates[w].items()) for w in rates),
                flush=True,
            )
    per = {w: {k: [x["steps_per_s"][k]["median"] for x in runs[w]] for k in loops} for w in runs}
    result = {
        "benchmark": "train_throughput old vs new",
        "old": str(old_root),
        "new": str(ROOT),
        "steps": args.steps,
        "repeats_per_round": args.repeats,
        "rounds": args.rounds,
        "steps_per_s": {w: {k: {"median": statistics.median(v), "all": v} for k, v in per[w].items()} for w in per},
        "ratio_new_vs_old": {k: statistics.median(n / o for n, o in zip(per["new"][k], per["old"][k])) for k in loops},
        "target": "trainer and job new/old >= 1 within the bare loop's drift (nothing here may slow the CPU path)",
        **record.environment(),
    }
    for k in loops:
        print(
            f"{k}: old {result['steps_per_s']['old'][k]['median']:.1f}, new {result['steps_per_s']['new'][k]['median']:.1f} "
            f"steps/s; new/old {result['ratio_new_vs_old'][k]:.3f} (median of {args.rounds} per-round ratios)"
        )
    if args.quick:
        print("quick run: results not saved")
        return
    record.save(result, VS_OLD)
    print(f"saved {VS_OLD}")


if __name__ == "__main__":
    main()
