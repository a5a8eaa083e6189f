"""How many singular modes of each head carry the task, and which heads stay the same head through
training (issue 35; ``attn_core.surgery``).

1. **Loss against R, every head of the zoo.** For each zoo model (trained here on its task) and
   each head, B is cut to its R strongest singular modes (``attn-lab edit --rank R``, the other
   heads untouched) and the task loss measured on 128 held-out samples. R* is the smallest R whose
   loss is within 1% of the full model's, with an absolute floor of 1e-3 nats (the zoo's losses are
   near zero: 1% of 3e-6 nats is below float noise): ``loss(R) <= 1.01 loss_full + 1e-3``. Beside
   it, the head's stable rank ||B||_F^2/||B||_2^2 and its weight-space and data-space ranks at 90%
   of the variance (``spectrum --json``, ``bilinear.ranks``, on 32 task samples).
2. **A text model trained here.** A Llama-shaped model (rotary, grouped-query attention; d_model
   128, 2 layers x 4 query heads / 2 key-value heads of d_head 32; ``experiments/sinks.py``'s
   recipe: a generated corpus and a byte-level BPE tokenizer trained on it) trained from scratch
   on the corpus, then the same R* per head with the next-token loss on windows of the corpus
   (``attn-lab edit --text``). Its modes are rotation planes (16 per head), as ``attribute``
   splits rotary heads; data rank on 32 windows of the corpus.
3. **The same head along training.** induction-2l's architecture trained from scratch with its
   preset's recipe (seed 0), checkpoints log-spaced; every checkpoint is diffed against the final
   model (``attn-lab diff``): per layer the matching and the distance of each matched pair. The
   final model's induction head is the layer-1 head of highest prefix-matching score; the table
   gives, per checkpoint, the task loss, whether every head is matched to itself, and that head's
   distance to its final B and to the previous checkpoint's.

    python experiments/edit_modes.py            # results/edit_modes.{json,md}, results/edit_modes_rank.png
    python experiments/edit_modes.py --quick    # a smoke run (two zoo models, a tiny text model, 40 steps), nothing saved
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "experiments" / "results"
ZOO = ("induction-2l", "copy-1l", "reverse-1l", "sort-2l-mlp", "modadd-1l-mlp", "recall-2l-merged")
REL, FLOOR = 0.01, 1e-3


def ranks_to_try(k: int) -> list[int]:
    if k <= 32:
        return list(range(1, k + 1))
    return sorted({r for r in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256) if r < k} | {k})


def loss_vs_rank(name, samples: int, inputs=None, label: str | None = None) -> list[dict]:
    """Per head of ``name`` (a name or a LoadedModel): the loss against the rank its B is cut to
    (on ``inputs``, else its task's held-out samples), R*, and its stable, weight and data ranks."""
    from attn_core import surgery
    from attn_core.bilinear import ranks
    from attn_core.sources import resolve

    loaded = resolve(name) if isinstance(name, str) else name  # a name, or a LoadedModel
    inputs = inputs or surgery.edit_inputs(loaded, samples=samples)
    full = surgery.quick_loss(loaded.model, inputs)["loss"]
    both = ranks(loaded.model, inputs.tokens[:32])
    rows = []
    cfg = loaded.config
    for l in range(cfg.n_layers):
        for h in range(cfg.n_heads):
            modes = surgery.head_modes(loaded.model, l, h)
            curve = {}
            for r in ranks_to_try(modes.k):
                edited = surgery.edit_model(loaded, [surgery.HeadEdit(l, h, rank=r)]).loaded.model
                curve[r] = surgery.quick_loss(edited, inputs)["loss"]
            star = min(r for r, v in curve.items() if v <= (1 + REL) * full + FLOOR)
            zeroed = surgery.edit_model(loaded, [surgery.HeadEdit(l, h, ablate="zero")]).loaded.model
            form = surgery.head_form64(loaded.model, l, h)
            rows.append(
                dict(
                    model=label or name,
                    head=f"L{l}H{h}",
                    k=modes.k,
                    full_loss=full,
                    rank_1_loss=curve[min(curve)],
                    ablated_loss=surgery.quick_loss(zeroed, inputs)["loss"],
                    r_star=star,
                    stable_rank=float(form.stable_rank),
                    weight_rank=int(both.weight_rank[l, h]),
                    data_rank=float(both.data_rank[l, h]),
                    curve={str(r): v for r, v in curve.items()},
                )
            )
    return rows


def text_model_rows(tmp: Path, quick: bool, steps: int, samples: int) -> tuple[list[dict], dict]:
    """Train the text model from scratch on its corpus; (its per-head rows, how it trained)."""
    from attn_core import dynamics as D
    from attn_core import surgery
    from attn_core.sources import resolve
    from experiments.sinks import QUICK_TEXT_SHAPE, TEXT_SHAPE, text_model, train

    shape = dict(QUICK_TEXT_SHAPE if quick else TEXT_SHAPE, corpus_mb=0.05 if quick else 0.5)
    os.environ["ATTN_LAB_RUNS"] = str(tmp / "runs")  # the text task's token cache
    text, folder = text_model(tmp, shape)
    setting = dict(kind="text", setting="none", steps=steps, seed=0, checkpoints=2, text=str(text),
                   folder=str(folder), shape=shape)  # fmt: skip
    res, ckpts, seconds = train(setting)
    if res["status"] != "completed":
        raise RuntimeError(f"the text model did not train: {res.get('message')}")
    try:
        series = D.series([str(ckpts)])
        trained = series.load(series.members[-1])
    finally:
        shutil.rmtree(ckpts, ignore_errors=True)
    label = f"llama-text (step {series.steps[-1]})"
    # next-token windows of the corpus, tokenized by the folder's tokenizer (a checkpoint has none)
    inputs = surgery.edit_inputs(resolve(str(folder)), text, samples=samples, length=64)
    rows = loss_vs_rank(trained, samples, inputs, label)
    about = dict(
        shape=shape,
        steps=steps,
        seconds=seconds,
        perplexity_before=(res.get("before") or {}).get("perplexity"),
        perplexity_after=(res.get("after") or {}).get("perplexity"),
        label=label,
    )
    return rows, about


def along_training(steps: int, samples: int) -> dict:
    from attn_core import dynamics as D
    from attn_core import surgery
    from attn_core.bilinear import head_detector_scores
    from attn_core.retraining.job import TrainingJob
    from attn_core.tasks import get_task
    from attn_core.training.config import JobConfig
    from attn_core.training.settings import warmup_of

    cfg = JobConfig(
        "scratch:induction-2l",
        steps=steps,
        lr=3e-3,
        seed=0,
        warmup_steps=warmup_of(steps),
        device="cpu",
        eval_every=steps,
        telemetry_every=steps,
        spectrum_every=steps,
        checkpoint_log=min(24, max(4, steps // 4)),
    )
    job = TrainingJob.open(cfg, store=False)
    job.run()
    folder = job.checkpoints.folder
    try:
        series = D.series([str(folder)])
        models = [series.load(s) for s in series.steps]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    final = models[-1]
    ind = int(head_detector_scores(final.model, n_samples=32)["induction"][1].argmax())
    inputs = D.task_inputs(get_task("induction"), samples, seed=0)  # checkpoints carry no card
    rows, prev = [], None
    for step, m in zip(series.steps, models):
        d = surgery.diff(m, final)
        prev_d = None if prev is None else float(surgery.layer_distances(prev.model, m.model, 1)[ind, ind])
        rows.append(
            dict(
                step=step,
                loss=surgery.quick_loss(m.model, inputs)["loss"],
                identity=all(i == j for ld in d.layers for i, j in ld.pairs),
                induction_matched_from=next((i for i, j in d.layers[1].pairs if j == ind), None),
                induction_to_final=float(d.layers[1].distance[ind, ind]),
                induction_to_previous=prev_d,
                mean_matched_distance=[
                    float(sum(ld.distance[i, j] for i, j in ld.pairs) / len(ld.pairs)) for ld in d.layers
                ],
                pairs={str(ld.layer): ld.pairs for ld in d.layers},
            )
        )
        prev = m
    drops = [
        ((rows[i]["loss"] - rows[i + 1]["loss"]) / max(1, rows[i + 1]["step"] - rows[i]["step"]), rows[i + 1]["step"])
        for i in range(len(rows) - 1)
    ]
    steepest = max(drops)[1] if drops else None
    return dict(steps=steps, induction_head=f"L1H{ind}", steepest_loss_fall_step=steepest, rows=rows)


def rank_table(rows: list[dict]) -> list[str]:
    lines = [
        "| model | head | k | full loss | head ablated (zero) | loss at R=1 | R* | stable rank | weight rank (90%) "
        "| data rank (90%) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['head']} | {r['k']} | {r['full_loss']:.3g} | {r['ablated_loss']:.3g} | "
            f"{r['rank_1_loss']:.3g} | {r['r_star']} | "
            f"{r['stable_rank']:.2f} | {r['weight_rank']} | {r['data_rank']:.2f} |"
        )
    return lines


def markdown(zoo: list[dict], text_rows: list[dict], text: dict, train: dict, meta: dict) -> str:
    lines = [
        "# Surgery on B: modes that carry the task, and the same head along training (issue 35)",
        "",
        f"Measured {meta['when']} on {meta['machine']}, torch {meta['torch']}, {meta['threads']} thread(s); "
        f"{meta['minutes']:.1f} min in all (load average {meta['load_before']:.1f} before, {meta['load_after']:.1f} after). "
        "Reproduce: `python experiments/edit_modes.py`.",
        "",
        f"R* = the smallest rank R of one head's B (the others untouched) with task loss <= {1 + REL:g} x the full "
        f'loss + {FLOOR:g} nats, on {meta["samples"]} held-out samples. "head ablated": the loss with the head\'s '
        "output zeroed, what the head is worth at all (an R* of 1 means little where this is within the 1% too).",
        "",
        *rank_table(zoo),
        "",
        f"## A text model trained here: {text['label']}",
        "",
        f"Llama-shaped (rotary, 4 query / 2 key-value heads of d_head 32, d_model {text['shape']['hidden']}, "
        f"{text['shape']['layers']} layers, BPE vocabulary {text['shape']['vocab']}) trained from scratch for "
        f"{text['steps']} steps on a generated {text['shape']['corpus_mb']:g} MB corpus "
        f"(`experiments/sinks.py`'s recipe) in {text['seconds']:.0f} s; held-out perplexity "
        f"{text['perplexity_before']:.1f} -> {text['perplexity_after']:.1f}. Loss: next-token loss on "
        f"{meta['samples']} windows of 64 tokens of the corpus; a mode is a rotation plane (k = 16 per head).",
        "",
        *rank_table(text_rows),
        "",
    ]
    lines += [
        "",
        f"## induction-2l from scratch ({train['steps']} steps, seed 0): diff of every checkpoint against the final model",
        "",
        f"Induction head (final, highest layer-1 prefix matching): {train['induction_head']}; steepest loss fall per "
        f"step ends at step {train['steepest_loss_fall_step']}.",
        "",
        "| step | task loss | every head matched to itself | induction head: distance to final B | to previous checkpoint | mean matched distance per layer |",
        "|---:|---:|---|---:|---:|---|",
    ]
    for r in train["rows"]:
        prev = "" if r["induction_to_previous"] is None else f"{r['induction_to_previous']:.3f}"
        mean = ", ".join(f"{v:.3f}" for v in r["mean_matched_distance"])
        lines.append(
            f"| {r['step']} | {r['loss']:.3g} | {'yes' if r['identity'] else 'no'} | {r['induction_to_final']:.3f} | {prev} | {mean} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: two zoo models, 40 steps, nothing saved")
    ap.add_argument("--steps", type=int, default=600, help="training steps of the induction-2l run")
    ap.add_argument("--text-steps", type=int, default=400, help="training steps of the text model")
    ap.add_argument("--samples", type=int, default=128, help="held-out samples the loss is measured on")
    args = ap.parse_args()
    import torch

    start, load_before = time.time(), os.getloadavg()[0]
    names = ZOO[:2] if args.quick else ZOO
    samples = 16 if args.quick else args.samples
    zoo = [row for name in names for row in loss_vs_rank(name, samples)]
    with tempfile.TemporaryDirectory(prefix="edit-modes-") as tmp:
        text_rows, text_about = text_model_rows(Path(tmp), args.quick, 8 if args.quick else args.text_steps, samples)
    train = along_training(40 if args.quick else args.steps, samples)
    for r in zoo + text_rows:
        print(
            f"{r['model']:18s} {r['head']}: R* {r['r_star']:3d} of {r['k']:3d}, stable rank {r['stable_rank']:.2f}, "
            f"data rank {r['data_rank']:.2f}, loss at R=1 {r['rank_1_loss']:.3g} (full {r['full_loss']:.3g}, "
            f"ablated {r['ablated_loss']:.3g})"
        )
    for r in train["rows"]:
        print(
            f"step {r['step']:5d}: loss {r['loss']:.3g}, identity {r['identity']}, "
            f"{train['induction_head']} to final {r['induction_to_final']:.3f}"
        )
    if args.quick:
        return
    meta = dict(
        when=time.strftime("%Y-%m-%d %H:%M"),
        machine=f"{platform.machine()}, {os.cpu_count()} cores",
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        minutes=(time.time() - start) / 60,
        load_before=load_before,
        load_after=os.getloadavg()[0],
        samples=samples,
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "edit_modes.json").write_text(
        json.dumps(dict(meta=meta, zoo=zoo, text_model=dict(text_about, heads=text_rows), training=train), indent=2)
        + "\n"
    )
    (RESULTS / "edit_modes.md").write_text(markdown(zoo, text_rows, text_about, train, meta))
    try:
        import pandas as pd

        from attn_core.figures import write_plot
        from attn_core.figures.surgery import loss_vs_rank_plot

        frame = pd.DataFrame(
            [
                dict(head=r["head"], rank=int(k), loss=v, full_loss=r["full_loss"])
                for r in zoo
                if r["model"] == "induction-2l"
                for k, v in r["curve"].items()
            ]
        )
        path = RESULTS / "edit_modes_rank.png"
        path.unlink(missing_ok=True)
        write_plot(loss_vs_rank_plot(frame, "induction-2l: task loss against the rank of one head's B"), path)
    except Exception as e:  # no browser for the PNG: the tables stand alone
        print(f"figure not written: {e}")


if __name__ == "__main__":
    main()
