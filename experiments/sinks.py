"""Attention sinks across training, and what each regularizer does to them (issue 30).

Gu et al. 2024 (arXiv 2410.10781) find sinks in every large LM they study, growing with training
and encouraged by weight decay. Here a head is a sink head when some key's importance (the mean
attention it receives over the queries that see it) exceeds eps = 0.3 on probes
(``attn_core.bilinear.sinks``); the sink rate is the share of such heads. Questions: do sinks form
in the models trained here, when, and does a concentration penalty (entropy, Hoyer, top-k mass on
every head) create them?

1. The zoo: sort-2l-mlp and induction-2l trained from scratch (``scratch:<name>``: the preset's
   batch and learning rate, 600 steps by default where the presets train 2000 and 1500), once per
   setting: no regularizer; entropy and topk at lambda 0.1 and 1 and hoyer at 1 on every head;
   weight decay 1 (the recipe's is 0.1); sparsemax attention (alpha-entmax 2, which can give a key
   exactly zero). Checkpoints log-spaced from step 1; each is measured on 32 held-out task samples.
2. A small text model trained here: a Llama-shaped model (rotary, grouped-query attention,
   RMSNorm, SwiGLU; d_model 128, 2 layers x 4 heads) with random weights and a byte-level BPE
   tokenizer trained on a generated corpus (``benchmarks/text_retrain.py``'s), trained on the text
   from scratch (400 steps) with no regularizer, entropy at lambda 0.1 and 1 and topk at 0.1; checkpoints
   log-spaced; each measured on 32 windows of 64 tokens of the corpus (``text.probes``).

    python experiments/sinks.py            # the full run: results/sinks.{json,md}, results/sinks_*.png
    python experiments/sinks.py --quick    # a smoke run (few steps, two settings), nothing saved
    python experiments/sinks.py --render experiments/results/sinks.json   # tables and figures again

Runs go to ``--jobs`` processes with one torch thread each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "experiments" / "results"
ZOO = ("sort-2l-mlp", "induction-2l")
ZOO_SETTINGS = {
    "none": {},
    "entropy 0.1": {"regularizers": ["entropy=0.1"]},
    "entropy 1": {"regularizers": ["entropy=1"]},
    "hoyer 1": {"regularizers": ["hoyer=1"]},
    "topk 0.1": {"regularizers": ["topk=0.1"]},
    "topk 1": {"regularizers": ["topk=1"]},
    "weight decay 1": {"weight_decay": 1.0},
    "sparsemax": {"entmax_alpha": 2.0},
}
TEXT_SETTINGS = ("none", "entropy 0.1", "topk 0.1", "entropy 1")
TEXT_SHAPE = dict(hidden=128, layers=2, heads=4, kv=2, mlp=344, vocab=2048, corpus_mb=2.0, block=64, batch=16)
QUICK_TEXT_SHAPE = dict(hidden=32, layers=2, heads=4, kv=2, mlp=64, vocab=300, corpus_mb=0.1, block=16, batch=4)
PROBES, LENGTH = 32, 64


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def text_model(tmp: Path, shape: dict) -> tuple[Path, Path]:
    """(the generated corpus, a random Llama folder with a BPE tokenizer trained on it)."""
    from benchmarks.text_retrain import corpus, model_folder

    text, folder = tmp / "corpus.txt", tmp / "text-llama"
    if not folder.exists():
        corpus(text, shape["corpus_mb"])
        model_folder(folder, shape, text)
    return text, folder


def train(setting: dict):
    """Train one setting with log-spaced checkpoints; (the job's result, the checkpoints folder,
    the seconds it took). Text runs keep their token cache in ``setting['runs']``."""
    from attn_core.retraining.job import TrainingJob
    from attn_core.training.config import JobConfig
    from attn_core.training.settings import warmup_of

    steps = setting["steps"]
    extra = dict(ZOO_SETTINGS[setting["setting"]])
    if setting["kind"] == "zoo":
        source, more = f"scratch:{setting['model']}", dict(lr=3e-3, warmup_steps=warmup_of(steps))
    else:
        shape = setting["shape"]
        source = setting["folder"]
        more = dict(text=setting["text"], block=shape["block"], batch_size=shape["batch"], lr=3e-3)
    cfg = JobConfig(
        source,
        steps=steps,
        seed=setting["seed"],
        device="cpu",
        eval_every=steps,
        telemetry_every=steps,
        spectrum_every=steps,
        measure_samples=64,
        checkpoint_log=setting["checkpoints"],
        **more,
        **extra,
    )
    start = time.perf_counter()
    job = TrainingJob.open(cfg, store=False)
    res = job.run()
    return res, job.checkpoints.folder, time.perf_counter() - start


def run_one(setting: dict) -> dict:
    """Train and measure every checkpoint's sinks on the setting's probes."""
    import torch

    from attn_core import dynamics as D
    from attn_core.bilinear import sinks

    os.environ["ATTN_LAB_RUNS"] = setting["runs"]  # the text task's token cache
    res, folder, trained = train(setting)
    tokens = torch.tensor(setting["probes"])
    rows = []
    try:
        series = D.series([str(folder)])
        for member in series.members:
            s = sinks(series.load(member).model, tokens)
            rows.append(
                dict(
                    step=member.step,
                    sink_rate=s.rate,
                    rate_first=s.rate_first,
                    strongest=float(s.strongest.mean()),
                    first=float(s.first.mean()),
                    sink_heads=[f"L{l}H{h}" for l, h in torch.nonzero(s.is_sink).tolist()],
                )
            )
        final = s.to_json()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    after = res["after"] or {}
    keep = {k: v for k, v in setting.items() if k != "probes"}
    return dict(
        **keep,
        status=res["status"],
        accuracy=after.get("accuracy", math.nan),
        perplexity=after.get("perplexity"),
        entropy_data=after.get("entropy_data", math.nan),
        curve=rows,
        final_importance=[h["importance"] for h in final["heads"]],
        train_s=trained,
    )


def zoo_probes(model: str) -> list[list[int]]:
    from attn_core.sources import resolve
    from attn_core.text.probes import probes

    return probes(resolve(model), n=PROBES).tokens.tolist()


def plan(args, tmp: Path) -> list[dict]:
    from attn_core.sources import resolve
    from attn_core.text.probes import probes

    runs = str(tmp / "runs")
    os.environ["ATTN_LAB_RUNS"] = runs
    todo, texts = [], []
    for model in args.models:
        from attn_core.presets import PRESETS

        steps = args.steps or PRESETS[model].train.steps
        found = zoo_probes(model)
        for name in args.settings:
            todo.append(dict(kind="zoo", model=model, setting=name, steps=steps, seed=0, checkpoints=args.checkpoints,
                             probes=found, runs=runs))  # fmt: skip
    if args.text_steps:
        shape = QUICK_TEXT_SHAPE if args.quick else TEXT_SHAPE
        text, folder = text_model(tmp, shape)
        found = probes(resolve(str(folder)), text, n=PROBES).tokens.tolist()
        for name in args.text_settings:
            texts.append(dict(kind="text", model="llama-text", setting=name, steps=args.text_steps, seed=0,
                             checkpoints=args.checkpoints, probes=found, runs=runs, text=str(text),
                             folder=str(folder), shape=shape))  # fmt: skip
    return texts + todo  # the longest runs first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(ZOO))
    ap.add_argument("--settings", nargs="*", default=list(ZOO_SETTINGS), choices=list(ZOO_SETTINGS))
    ap.add_argument("--text-settings", nargs="*", default=list(TEXT_SETTINGS), choices=list(ZOO_SETTINGS))
    ap.add_argument("--steps", type=int, default=600, help="zoo steps (0: the preset's)")
    ap.add_argument("--text-steps", type=int, default=400, help="text steps (0: no text model)")
    ap.add_argument("--checkpoints", type=int, default=14, help="log-spaced checkpoints per run")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--quick", action="store_true", help="few steps, two settings; nothing saved")
    ap.add_argument("--render", type=Path, help="only redo the tables and figures from a saved sinks.json")
    args = ap.parse_args()
    if args.render:
        saved = json.loads(args.render.read_text())
        save(saved["rows"], saved["meta"])
        return
    if args.quick:
        args.models, args.settings, args.text_settings = ["sort-2l-mlp"], ["none", "entropy 1"], ["none"]
        args.steps, args.text_steps, args.checkpoints = 30, 8, 4
    start, load_before = time.perf_counter(), os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="sinks-") as tmp:
        todo = plan(args, Path(tmp))
        with ProcessPoolExecutor(max_workers=args.jobs, initializer=_init_worker, initargs=(1,)) as pool:
            futures = {pool.submit(run_one, s): i for i, s in enumerate(todo)}
            for future in as_completed(futures):
                r = future.result()
                rows.append((futures[future], r))
                last = r["curve"][-1]
                print(
                    f"{r['model']:13s} {r['setting']:15s} {r['status']}: sink rate {r['curve'][0]['sink_rate']:.0%} at step "
                    f"{r['curve'][0]['step']} -> {last['sink_rate']:.0%} at step {last['step']} (first token "
                    f"{last['rate_first']:.0%}), entropy {r['entropy_data']:.3f}, trained in {r['train_s']:.0f} s",
                    flush=True,
                )
    rows = [r for _, r in sorted(rows, key=lambda x: x[0])]
    import torch

    meta = dict(
        created=time.strftime("%Y-%m-%d %H:%M"),
        wall_s=time.perf_counter() - start,
        jobs=args.jobs,
        load_average_before=load_before,
        load_average_after=os.getloadavg(),
        machine=f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread per process",
        command=" ".join(["python experiments/sinks.py", *sys.argv[1:]]),
        probes=f"{PROBES} probes of up to {LENGTH} tokens, eps 0.3",
    )
    save(rows, meta, quick=args.quick)


# --- the written result ------------------------------------------------------------------------------


def _final(r: dict) -> dict:
    return r["curve"][-1]


def table(rows: list[dict], kind: str) -> str:
    part = [r for r in rows if r["kind"] == kind]
    score = "held-out perplexity" if kind == "text" else "accuracy"
    lines = [
        f"| model | setting | sink rate at init → end | first token (Gu et al.) at the end | mean strongest importance | sink heads at the end | mean normalized entropy | {score} |",
        "|---|---|---|---:|---:|---|---:|---:|",
    ]
    for r in part:
        c, f = r["curve"], _final(r)
        first = c[0]
        quality = f"{r['perplexity']:.1f}" if kind == "text" and r.get("perplexity") else f"{r['accuracy']:.4f}"
        lines.append(
            f"| {r['model']} | {r['setting']} | {first['sink_rate']:.0%} → {f['sink_rate']:.0%} | {f['rate_first']:.0%} | "
            f"{f['strongest']:.2f} | {' '.join(f['sink_heads']) or '—'} | {r['entropy_data']:.3f} | {quality} |"
        )
    return "\n".join(lines)


def _said(setting: str, end: dict, runs: dict) -> str:
    """``entropy 1 (62%)``, and when the zoo task was not learned (accuracy 5 points below no
    regularizer's) its accuracy: a head that learned nothing may park its attention anywhere."""
    r, ref = runs[setting], runs["none"]
    unlearned = r["kind"] == "zoo" and r["accuracy"] < ref["accuracy"] - 0.05
    return f"{setting} ({end['sink_rate']:.0%}" + (
        f"; accuracy {r['accuracy']:.2f}, not learned)" if unlearned else ")"
    )


def finding(rows: list[dict]) -> str:
    """Sentences computed from the rows: the regularizers' end sink rates against no regularizer."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        runs = {r["setting"]: r for r in rows if r["model"] == model}
        part = {k: _final(r) for k, r in runs.items()}
        base = part.get("none")
        if base is None:
            continue

        more = [_said(k, v, runs) for k, v in part.items() if v["sink_rate"] > base["sink_rate"]]
        less = [_said(k, v, runs) for k, v in part.items() if v["sink_rate"] < base["sink_rate"]]
        same = [k for k, v in part.items() if k != "none" and v["sink_rate"] == base["sink_rate"]]
        said = [f"- **{model}**: {base['sink_rate']:.0%} of heads sink at the end without a regularizer"]
        for what, names in (("more with", more), ("fewer with", less), ("as many with", same)):
            if names:
                said.append(f"{what} {', '.join(names)}")
        out.append("; ".join(said) + ".")
    return "\n".join(out)


def markdown(rows: list[dict], meta: dict) -> str:
    return "\n\n".join([
        "# Attention sinks across training and under each regularizer (issue 30)",
        f"Measured {meta['created']} on {meta['machine']}, {meta['jobs']} processes; {meta['wall_s'] / 60:.1f} min in "
        f"all (load average {meta['load_average_before'][0]:.1f} before, {meta['load_average_after'][0]:.1f} after). "
        f"Reproduce: `{meta['command']}`. Sinks on {meta['probes']} (`attn_core.bilinear.sinks`): a head sinks when "
        "a key seen by at least a quarter of the probe's queries receives more than 0.3 of their attention on average.",
        "## The zoo, trained from scratch (each preset's batch and learning rate)",
        table(rows, "zoo"),
        "## A small Llama-shaped model trained here on text",
        table(rows, "text"),
        "## What the numbers say",
        finding(rows),
        "Figures: `sinks_zoo.png`, `sinks_text.png` (sink rate against the step), `sinks_text_importance.png` "
        "(every head's key importance at the end of the unregularized text run).",
    ])  # fmt: skip


def figures(rows: list[dict]) -> list:
    import pandas as pd
    import torch

    from attn_core.bilinear.sinks import Sinks
    from attn_core.figures.sinks import importance_plot, sink_rate_plot

    plots = []
    for kind, name in (("zoo", "sinks_zoo"), ("text", "sinks_text")):
        frame = pd.DataFrame(
            [dict(model=r["model"], setting=r["setting"], **c) for r in rows if r["kind"] == kind for c in r["curve"]]
        )
        if not frame.empty:
            frame = frame[frame["step"] > 0]
            plot = sink_rate_plot(frame, width=940)
            plot.fig.update_xaxes(type="log")
            plots.append(plot.renamed(name))
    base = next((r for r in rows if r["kind"] == "text" and r["setting"] == "none"), None)
    if base is not None:
        cfg = base["shape"] if "shape" in base else TEXT_SHAPE
        imp = torch.tensor(base["final_importance"], dtype=torch.float64).reshape(cfg["layers"], cfg["heads"], -1)
        T = imp.shape[-1]
        i = torch.arange(T)
        eligible = ((i[None, :] <= i[:, None]).sum(0) >= max(2, math.ceil(T / 4))).expand(cfg["layers"], T)
        s = Sinks(imp, eligible, 0.3, PROBES, f"the text model after {base['steps']} steps (no regularizer)")
        plots.append(importance_plot(s).renamed("sinks_text_importance"))
    return plots


def save(rows: list[dict], meta: dict, quick: bool = False) -> None:
    md = markdown(rows, meta)
    print()
    print(md)
    plots = figures(rows)
    print(f"\n{len(plots)} figures: {', '.join(p.name for p in plots)}")
    if quick:
        return
    from attn_core.figures import write_plot

    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sinks.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    (RESULTS / "sinks.md").write_text(md + "\n")
    for p in plots:
        write_plot(p, RESULTS / f"{p.name}.png", overwrite=True)


if __name__ == "__main__":
    main()
