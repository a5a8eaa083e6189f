"""Does QK-norm bound a head's B, and does it change sinks? A Llama-shaped and a Qwen3-shaped
model (the same shapes and initial projections; Qwen3 adds per-head RMSNorm of q and k before
the rotation) trained from scratch here on the same text, the same steps, batches and seed.

At log-spaced checkpoints every head is measured on the same probes (windows of the corpus):
- sigma_1 and the stable rank of its B (for a QK-norm head, the core B~ with the norm weights
  folded in, whose scores are scaled per token by the gains the norm puts on each side:
  docs/maths.md);
- max |S|, the largest pre-softmax score on the probes: what QK-norm bounds (the normalised q
  and k have length sqrt(d_head) times the norm weights, so |S| <= d_head max(gamma_q gamma_k) /
  sqrt(d_head));
- the sink rate and token 0's share of attention (``attn_core.bilinear.sinks``, eps 0.3);
- the mean normalised attention entropy over the probes' rows.

    python experiments/qk_norm.py           # the full run: results/qk_norm.{json,md}
    python experiments/qk_norm.py --quick   # a smoke run (a tiny shape, few steps), nothing saved

The two runs train in two processes (one torch thread each).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "experiments" / "results"
SHAPE = dict(hidden=128, layers=2, heads=4, kv=2, mlp=344, vocab=2048, corpus_mb=2.0, block=64, batch=16)
QUICK_SHAPE = dict(hidden=32, layers=2, heads=4, kv=2, mlp=64, vocab=300, corpus_mb=0.1, block=16, batch=4)
FAMILIES = ("llama", "qwen3")
PROBES = 32


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def folders(tmp: Path, shape: dict) -> tuple[Path, dict[str, Path]]:
    """(the generated corpus, {family: a random folder}) with one BPE tokenizer trained on it; the
    Qwen3 folder is the Llama one's shapes with head_dim stated and QK-norm, from the same seed."""
    import torch
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    from benchmarks.text_retrain import corpus

    text = tmp / "corpus.txt"
    corpus(text, shape["corpus_mb"])
    tok = ByteLevelBPETokenizer()
    tok.train(
        [str(text)], vocab_size=shape["vocab"], min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False
    )
    common = dict(
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv"],
        intermediate_size=shape["mlp"],
        vocab_size=tok.get_vocab_size(),
        max_position_embeddings=4 * shape["block"],
        eos_token_id=0,
        bos_token_id=0,
        tie_word_embeddings=False,
    )
    made = {}
    for family, make in (
        ("llama", lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))),
        (
            "qwen3",
            lambda: transformers.Qwen3ForCausalLM(
                transformers.Qwen3Config(head_dim=shape["hidden"] // shape["heads"], **common)
            ),
        ),
    ):
        torch.manual_seed(0)
        folder = tmp / family
        make().save_pretrained(folder, safe_serialization=True)
        tok.save(str(folder / "tokenizer.json"))
        made[family] = folder
    return text, made


def measure(model, tokens) -> dict:
    """Every head's sigma_1, stable rank, max |S|, entropy and sinks on ``tokens`` [n, T]."""
    import torch

    import attn_core as al
    from attn_core import metrics
    from attn_core.bilinear import sinks
    from attn_core.hooks import act_name

    spec = al.spectrum(model)
    cfg = model.cfg
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, lambda n: n.endswith(("attn_scores", "pattern")))
    T = tokens.shape[1]
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    max_score, entropy = [], []
    for layer in range(cfg.n_layers):
        S, A = cache[act_name("attn_scores", layer)], cache[act_name("pattern", layer)]
        max_score += S.masked_fill(~visible, 0).abs().amax(dim=(0, 2, 3)).tolist()
        entropy += metrics.normalized_entropy(A, visible)[..., 1:].mean(dim=(0, 2)).tolist()
    s = sinks(model, tokens)
    return dict(
        bound=score_bound(model),
        sigma_1=spec["spectral_norm"].tolist(),
        stable_rank=spec["stable_rank"].tolist(),
        max_score=max_score,
        entropy=entropy,
        sink_rate=s.rate,
        first=s.first.flatten().tolist(),
    )


def score_bound(model) -> list[float] | None:
    """Per head, the largest |S| per-head QK-norm allows: with q^ = gamma_q * u and |u|^2 = d_head
    (RMS 1), |S| = |q^ . k^| / sqrt(d_head) <= sqrt(d_head) max|gamma_q| max|gamma_k| (a rotation keeps
    lengths, so it holds at every offset); None for a model without per-head QK-norm."""
    cfg = model.cfg
    if getattr(cfg, "qk_norm", "none") != "head":
        return None
    out = []
    for block in model.blocks:
        attn = block.attn
        bound = cfg.d_head**0.5 * float(attn.q_norm.w.detach().abs().max()) * float(attn.k_norm.w.detach().abs().max())
        out += [bound] * cfg.n_heads
    return out


def run_one(setting: dict) -> dict:
    """Train one family's folder on the text with log-spaced checkpoints and measure each."""
    import torch

    from attn_core import dynamics as D
    from attn_core.retraining.job import TrainingJob
    from attn_core.training.config import JobConfig

    os.environ["ATTN_LAB_RUNS"] = setting["runs"]  # the text task's token cache
    shape, steps = setting["shape"], setting["steps"]
    cfg = JobConfig(
        setting["folder"],
        text=setting["text"],
        block=shape["block"],
        batch_size=shape["batch"],
        lr=3e-3,
        steps=steps,
        seed=0,
        device="cpu",
        eval_every=steps,
        telemetry_every=steps,
        spectrum_every=steps,
        measure_samples=64,
        checkpoint_log=setting["checkpoints"],
    )
    start = time.perf_counter()
    job = TrainingJob.open(cfg, store=False)
    res = job.run()
    trained = time.perf_counter() - start
    if res["status"] != "completed":
        raise RuntimeError(f"{setting['family']}: {res['status']}: {res['message']}")
    tokens = torch.tensor(setting["probes"])
    curve = []
    try:
        series = D.series([str(job.checkpoints.folder)])
        for member in series.members:
            curve.append(dict(step=member.step, **measure(series.load(member).model, tokens)))
    finally:
        shutil.rmtree(job.checkpoints.folder, ignore_errors=True)
    after = res["after"] or {}
    return dict(family=setting["family"], steps=steps, perplexity=after.get("perplexity"), train_s=trained, curve=curve)


def summary(row: dict) -> dict:
    """The end of a run, and the largest values over its checkpoints, as medians / maxima over heads."""
    end = row["curve"][-1]
    return dict(
        sigma_1=statistics.median(end["sigma_1"]),
        sigma_1_max=max(end["sigma_1"]),
        stable_rank=statistics.median(end["stable_rank"]),
        max_score=max(end["max_score"]),
        max_score_ever=max(max(c["max_score"]) for c in row["curve"]),
        bound=max(end["bound"]) if end.get("bound") else None,
        entropy=statistics.mean(end["entropy"]),
        sink_rate=end["sink_rate"],
        first=statistics.mean(end["first"]),
    )


def table(rows: list[dict]) -> str:
    lines = [
        "| model | perplexity | σ1 of B (median / max over heads) | stable rank (median) | max \\|S\\| at the end "
        "(over training) | QK-norm's bound on \\|S\\| (largest head) | entropy (mean) | sink rate | "
        "token 0's share (mean) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = summary(r)
        ppl = f"{r['perplexity']:.1f}" if r.get("perplexity") else "?"
        bound = "none" if s["bound"] is None else f"{s['bound']:.1f}"
        lines.append(
            f"| {r['family']} | {ppl} | {s['sigma_1']:.2f} / {s['sigma_1_max']:.2f} | {s['stable_rank']:.2f} | "
            f"{s['max_score']:.1f} ({s['max_score_ever']:.1f}) | {bound} | {s['entropy']:.3f} | {s['sink_rate']:.0%} | "
            f"{s['first']:.3f} |"
        )
    return "\n".join(lines)


def curves(rows: list[dict]) -> str:
    """Per checkpoint: step, then per family the median sigma_1, max |S| and the sink rate."""
    by = {r["family"]: {c["step"]: c for c in r["curve"]} for r in rows}
    steps = sorted(set.intersection(*(set(v) for v in by.values())))
    head = "| step | " + " | ".join(f"{f}: σ1 (median) / max \\|S\\| / sink rate" for f in by) + " |"
    lines = [head, "|---|" + "---|" * len(by)]
    for step in steps:
        cells = []
        for f in by:
            c = by[f][step]
            cells.append(f"{statistics.median(c['sigma_1']):.2f} / {max(c['max_score']):.1f} / {c['sink_rate']:.0%}")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(rows: list[dict], meta: dict) -> str:
    return "\n\n".join(
        [
            "# QK-norm against a plain Llama: B, scores and sinks over training",
            f"Command: `{meta['command']}`; {meta['steps']} steps each, {meta['when']}, {meta['machine']}.",
            "## At the end",
            table(rows),
            "## Over training",
            curves(rows),
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--checkpoints", type=int, default=10, help="log-spaced checkpoints per run")
    ap.add_argument("--quick", action="store_true", help="a tiny shape, few steps; nothing saved")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.checkpoints = 6, 3
    if args.steps < 1 or args.checkpoints < 2:
        ap.error("--steps must be at least 1 and --checkpoints at least 2")
    shape = QUICK_SHAPE if args.quick else SHAPE
    tmp = Path(tempfile.mkdtemp(prefix="qk-norm-"))
    try:
        from attn_core.sources import resolve
        from attn_core.text.probes import probes

        runs = str(tmp / "runs")
        os.environ["ATTN_LAB_RUNS"] = runs
        text, made = folders(tmp, shape)
        found = probes(resolve(str(made["llama"])), text, n=PROBES).tokens.tolist()
        todo = [
            dict(
                family=f,
                folder=str(made[f]),
                text=str(text),
                shape=shape,
                steps=args.steps,
                checkpoints=args.checkpoints,
                probes=found,
                runs=runs,
            )
            for f in FAMILIES
        ]
        with ProcessPoolExecutor(max_workers=2, initializer=_init_worker) as pool:
            rows = list(pool.map(run_one, todo))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    meta = dict(
        command="python experiments/qk_norm.py" + (" --quick" if args.quick else ""),
        steps=args.steps,
        when=time.strftime("%Y-%m-%d"),
        machine=f"{os.cpu_count()} CPUs, {platform.machine()}, load {os.getloadavg()[0]:.1f}",
    )
    md = markdown(rows, meta)
    print(md)
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "qk_norm.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
        (RESULTS / "qk_norm.md").write_text(md + "\n")


if __name__ == "__main__":
    main()
