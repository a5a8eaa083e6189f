"""Where does the attention token 0 takes go when heads have a learned sink, and what does the
entropy penalty do to each? A small gpt-oss-shaped model (RMSNorm, rotary, q/k/v/o biases, a
sliding layer then a full one, grouped-query attention, 4 routed experts with a router bias and
gpt-oss's clamped SwiGLU) trained here from one random init on the bundled text
(``assets/text/lab-manual.txt``, a byte-level BPE trained on it), with and without one learned
sink logit per head (``attn_sinks``; the sinks start at 0), each with and without an entropy
penalty on every head's rows.

The penalty is the lab's ``entropy`` regularizer (``regularizers.build_penalty``, every head):
lambda times the mean normalised entropy of every attention row of the training batch (the rows
whose query sees at least 2 keys), from the cached Q and K through the row engine. For a head with
a learned sink the sink is one more outcome of the row, H = -sum_j p_j log p_j - p_s log p_s over
the n visible keys and the sink, normalised by log(n + 1) (without one, by log n), with its
gradient reaching the sink logit.

Measured on held-out windows, per head, over the queries 1..T-1 that see token 0: the mean mass on
the learned sink, on token 0, and on every other key ("spread"; the three add up to 1), the
normalised entropy, and the held-out perplexity.

    python experiments/sinks_learned.py           # the full run: results/sinks_learned.{json,md}
    python experiments/sinks_learned.py --quick   # a smoke run (a tiny shape, few steps), nothing saved

The two models train in two processes (one torch thread each).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "experiments" / "results"
SHAPE = dict(d_model=64, heads=4, kv=2, d_head=16, d_mlp=64, experts=4, top=2, vocab=512, block=64, window=16,
             batch=16, steps=2000, lr=3e-3, lam=1.0, probes=32)  # fmt: skip
QUICK = dict(d_model=32, heads=4, kv=2, d_head=8, d_mlp=32, experts=4, top=2, vocab=300, block=16, window=4,
             batch=4, steps=4, lr=3e-3, lam=1.0, probes=4)  # fmt: skip


def config(shape: dict, sinks: bool):
    from attn_core.model import ModelConfig

    return ModelConfig(
        n_layers=2,
        n_heads=shape["heads"],
        n_kv_heads=shape["kv"],
        d_model=shape["d_model"],
        d_head=shape["d_head"],
        d_mlp=shape["d_mlp"],
        n_ctx=shape["block"],
        d_vocab=shape["vocab"],
        normalization="rmsnorm",
        positional="rotary",
        rope_theta=150000.0,
        attn_bias=True,
        gated_mlp=True,
        mlp_act="silu",
        sliding_window=[shape["window"], 0],  # gpt-oss: sliding, then full
        n_experts=shape["experts"],
        experts_per_token=shape["top"],
        router_renorm=True,
        router_bias=True,
        glu_limit=7.0,
        glu_alpha=1.702,
        attn_sinks=sinks,
    )


def models(shape: dict):
    """(plain, with sinks): one random init; the sink model's logits start at 0."""
    import torch

    from attn_core.model import Transformer

    torch.manual_seed(0)
    plain = Transformer(config(shape, False))
    with_sinks = Transformer(config(shape, True))
    state = plain.state_dict()
    for l in range(2):
        state[f"blocks.{l}.attn.sinks"] = torch.zeros(shape["heads"])
    with_sinks.load_state_dict(state)
    return plain, with_sinks


def normalised_entropy(A, mask, sinks: bool):
    """Normalised entropy of every row of A [b, h, T, T] under ``mask`` [T, T], [b, h, T], and which
    rows count (at least 2 visible keys, as the penalty's): with ``sinks`` the sink's mass 1 - sum_j A_ij is one more
    outcome (module doc)."""
    import torch

    def plogp(p):
        return torch.where(p > 0, p * torch.log(p.clamp_min(1e-30)), torch.zeros_like(p))

    H, keys = -plogp(A).sum(-1), mask.sum(-1).to(A.dtype).expand(A.shape[:-1])
    n = keys + 1 if sinks else keys
    if sinks:
        H = H - plogp((1 - A.sum(-1)).clamp(0, 1))
    return H / torch.log(n.clamp_min(2)), keys >= 2


def train(model, task, shape: dict, lam: float) -> dict:
    import torch

    from attn_core.regularizers import build_penalty

    opt = torch.optim.AdamW(model.parameters(), lr=shape["lr"], weight_decay=0.0)
    penalty = build_penalty({"entropy": lam}, model) if lam else None
    start = time.perf_counter()
    for step in range(shape["steps"]):
        batch = task.sample(shape["batch"], seed=step)
        cache = penalty.cache() if penalty else None
        logits = model(batch.tokens, cache=cache) if penalty else model(batch.tokens)
        loss = task.loss(logits, batch)
        if penalty:
            loss = loss + sum(penalty(model, batch, cache).values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return dict(train_s=time.perf_counter() - start)


def measure(model, task, shape: dict) -> dict:
    """Per head on held-out windows (module doc): learned sink, token 0, spread, entropy; perplexity."""
    import torch

    from attn_core.hooks import act_name

    model.eval()
    batch = task.sample(shape["probes"], seed=12345, split="test")
    tokens = batch.tokens
    T = tokens.shape[1]
    out = dict(learned=[], token0=[], spread=[], entropy=[], sink_logit=[])
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, [act_name("pattern", l) for l in range(model.cfg.n_layers)])
        ppl = math.exp(float(task.loss(logits, batch)))
        for l in range(model.cfg.n_layers):
            A = cache[act_name("pattern", l)].double()  # [b, h, T, T]
            mask = model.mask(T, model.cfg.window(l))
            sees0 = mask[1:, 0]  # queries 1..T-1 that see token 0
            s = (1 - A.sum(-1))[..., 1:][..., sees0] if model.cfg.attn_sinks else torch.zeros(1)
            first = A[..., 1:, 0][..., sees0]
            learned = s.mean((0, 2)) if model.cfg.attn_sinks else torch.zeros(model.cfg.n_heads, dtype=torch.float64)
            token0 = first.mean((0, 2))
            H, rows = normalised_entropy(A, mask, model.cfg.attn_sinks)
            out["learned"] += learned.tolist()
            out["token0"] += token0.tolist()
            out["spread"] += (1 - learned - token0).tolist()
            out["entropy"] += ((H * rows).sum((0, 2)) / rows.sum((0, 2))).tolist()
            z = model.blocks[l].attn.form().sink
            out["sink_logit"] += [math.nan] * model.cfg.n_heads if z is None else z.tolist()
    out["perplexity"] = ppl
    return out


def run_one(setting: tuple[dict, bool]) -> list[dict]:
    """One model (plain, or with sinks) trained from the shared init without, then with, the penalty."""
    import torch

    from attn_core.text.bundled import corpus_task, read_corpus, train_tokenizer

    shape, sinks = setting
    torch.set_num_threads(1)
    text = read_corpus()
    task = corpus_task(text, train_tokenizer(text, shape["vocab"]), shape["block"], "lab-manual.txt")
    shape = {**shape, "vocab": task.d_vocab}
    rows = []
    for lam in (0.0, shape["lam"]):
        model = models(shape)[int(sinks)]
        timing = train(model, task, shape, lam)
        rows.append(dict(model="learned sinks" if sinks else "plain", lam=lam, **timing, **measure(model, task, shape)))
    return rows


def run(shape: dict) -> list[dict]:
    """Both models, in two processes (one torch thread each)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as pool:
        plain, sinks = pool.map(run_one, [(shape, False), (shape, True)])
    return [r for pair in zip(plain, sinks) for r in pair]


def table(rows: list[dict], heads: int) -> str:
    """Means over heads per layer (layer 0 sliding, layer 1 full)."""
    lines = [
        "| model | entropy penalty λ | held-out perplexity | layer | learned sink | token 0 | spread | normalised entropy |"
        " sink logits (min .. max) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for l, kind in enumerate(("0 (sliding)", "1 (full)")):
            part = slice(l * heads, (l + 1) * heads)

            def m(key, r=r, part=part):
                return statistics.mean(r[key][part])

            z = r["sink_logit"][part]
            logits = "none" if any(math.isnan(v) for v in z) else f"{min(z):.2f} .. {max(z):.2f}"
            lines.append(
                f"| {r['model']} | {r['lam']:g} | {r['perplexity']:.1f} | {kind} | {m('learned'):.3f} | "
                f"{m('token0'):.3f} | {m('spread'):.3f} | {m('entropy'):.3f} | {logits} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a tiny shape and few steps; nothing saved")
    args = ap.parse_args()
    shape = QUICK if args.quick else SHAPE
    start = time.perf_counter()
    rows = run(shape)
    text = table(rows, shape["heads"])
    print(text)
    took = time.perf_counter() - start
    print(f"{len(rows)} runs of {shape['steps']} steps in {took:.0f} s")
    if args.quick:
        return
    meta = dict(
        command="python experiments/sinks_learned.py",
        shape=shape,
        seconds=took,
        when=time.strftime("%Y-%m-%d"),
        machine=f"{platform.machine()}, {platform.python_version()}",
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sinks_learned.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=2) + "\n")
    md = f"# Learned sinks and the entropy penalty\n\nCommand: `{meta['command']}`, {meta['when']}, {took:.0f} s.\n\n"
    (RESULTS / "sinks_learned.md").write_text(md + text + "\n")


if __name__ == "__main__":
    main()
