"""Sinks, entropy and reach of the heads of a rotary text model over 8192 tokens (issue 36).

A Llama-shaped model (rotary, grouped-query attention, RMSNorm, SwiGLU; 4 layers x 4 heads,
d_model 128, 2 key heads, context 8192) with a byte-level BPE tokenizer is made by transformers
with random weights (``benchmarks/text_retrain.py``'s corpus and tokenizer: pseudo-English,
Zipf-distributed words, each paragraph repeating one of its sentences), then trained here on
that text in blocks of 256 tokens (``TrainingJob``, no regularizer). On the last 8192 tokens of
the corpus, every head's blocked scores (``bilinear.blocked``: never 8192 x 8192) give per query
row the sink mass (weight on token 0), the entropy and the top-1 key. Reported per head:

- sink mass and entropy (nats) averaged over bins of query positions (0-255 is the trained
  length; past it, rotary positions the model never saw in training);
- where the top-1 key is: the share of queries whose top key is token 0 (the sink), the query
  itself, and at offsets 1, 2-3, 4-15, 16-255, 256 and more back.

    python experiments/long_context.py            # results/long_context.{json,md}
    python experiments/long_context.py --quick    # a tiny model, 1024 tokens, a few steps, nothing saved
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "experiments" / "results"
FULL = dict(hidden=128, layers=4, heads=4, kv=2, mlp=344, vocab=2048, corpus_mb=2.0, block=256, batch=16, steps=500,
            ctx=8192, tokens=8192, bins=(0, 256, 1024, 2048, 4096, 8192))  # fmt: skip
QUICK = dict(hidden=32, layers=2, heads=4, kv=2, mlp=64, vocab=300, corpus_mb=0.2, block=32, batch=4, steps=4,
             ctx=1024, tokens=1024, bins=(0, 32, 256, 1024))  # fmt: skip
OFFSETS = (("sink (token 0)", None, None), ("self", 0, 0), ("1 back", 1, 1), ("2-3", 2, 3), ("4-15", 4, 15),
           ("16-255", 16, 255), ("256+", 256, 10**9))  # fmt: skip

WRITER = """
import json, sys, torch, transformers
from tokenizers import ByteLevelBPETokenizer
shape, folder, text = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
tok = ByteLevelBPETokenizer()
tok.train([text], vocab_size=shape["vocab"], min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
cfg = transformers.LlamaConfig(hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
    num_attention_heads=shape["heads"], num_key_value_heads=shape["kv"], intermediate_size=shape["mlp"],
    vocab_size=tok.get_vocab_size(), max_position_embeddings=shape["ctx"], eos_token_id=0, bos_token_id=0)
torch.manual_seed(0)
transformers.LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
tok.save(folder + "/tokenizer.json")
"""


def make_model(tmp: Path, shape: dict) -> tuple[Path, Path]:
    import subprocess

    from benchmarks.text_retrain import corpus

    text, folder = tmp / "corpus.txt", tmp / "llama-8k"
    corpus(text, shape["corpus_mb"])
    r = subprocess.run(
        [sys.executable, "-c", WRITER, json.dumps(shape), str(folder), str(text)], capture_output=True, text=True
    )
    if r.returncode != 0:
        sys.exit(f"making the model with transformers failed:\n{r.stderr[-2000:]}")
    return text, folder


def train(folder: Path, text: Path, shape: dict):
    from attn_core.retraining.job import TrainingJob
    from attn_core.training.config import JobConfig

    cfg = JobConfig(str(folder), text=str(text), block=shape["block"], batch_size=shape["batch"], steps=shape["steps"],
                    lr=3e-3, seed=0, device="cpu", eval_every=shape["steps"], measure_samples=32)  # fmt: skip
    job = TrainingJob.open(cfg, store=False)
    res = job.run()
    if res["status"] != "completed":
        sys.exit(f"training failed: {res.get('message')}")
    return job.model.eval(), res


def measure(model, ids: list[int], bins: tuple[int, ...]) -> list[dict]:
    import torch

    from attn_core.bilinear.blocked import layer_qk, row_stats

    rows = []
    for layer in range(model.cfg.n_layers):
        qk = layer_qk(model, ids, layer)
        for head in range(model.cfg.n_heads):
            s = row_stats(qk, head, k=1, offsets=1)
            q = torch.arange(s.n)
            top1 = s.top_keys[:, 0]
            back = q - top1
            where = {}
            for name, lo, hi in OFFSETS:
                hit = top1 == 0 if lo is None else (back >= lo) & (back <= hi) & (top1 != 0)
                where[name] = float(hit[1:].double().mean())  # query 0 sees only token 0
            by_bin = []
            for lo, hi in zip(bins, bins[1:]):
                part = slice(max(lo, 1), min(hi, s.n))
                by_bin.append(
                    dict(
                        queries=f"{lo}-{hi - 1}", sink=float(s.sink[part].mean()), entropy=float(s.entropy[part].mean())
                    )
                )
            rows.append(dict(layer=layer, head=head, top1=where, by_position=by_bin,
                             median_top1_offset=float(back[1:].double().median())))  # fmt: skip
    return rows


def markdown(result: dict) -> str:
    heads = result["heads"]
    bins = [b["queries"] for b in heads[0]["by_position"]]
    out = [
        f"Sink mass (weight on token 0) by query position, {result['tokens']} tokens (trained on blocks of {result['block']}):",
        "",
    ]
    out += ["| head | " + " | ".join(bins) + " |", "|---|" + "---|" * len(bins)]
    out += [
        f"| L{h['layer']}H{h['head']} | " + " | ".join(f"{b['sink']:.3f}" for b in h["by_position"]) + " |"
        for h in heads
    ]
    out += [
        "",
        "Entropy (nats) by query position:",
        "",
        "| head | " + " | ".join(bins) + " |",
        "|---|" + "---|" * len(bins),
    ]
    out += [
        f"| L{h['layer']}H{h['head']} | " + " | ".join(f"{b['entropy']:.2f}" for b in h["by_position"]) + " |"
        for h in heads
    ]
    names = [n for n, _, _ in OFFSETS]
    out += [
        "",
        "Where the top-1 key is (share of queries):",
        "",
        "| head | " + " | ".join(names) + " | median offset |",
    ]
    out += ["|---|" + "---|" * (len(names) + 1)]
    out += [
        f"| L{h['layer']}H{h['head']} | "
        + " | ".join(f"{h['top1'][n]:.2f}" for n in names)
        + f" | {h['median_top1_offset']:.0f} |"
        for h in heads
    ]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model, a few steps, nothing saved")
    args = ap.parse_args()
    shape = QUICK if args.quick else FULL
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["ATTN_LAB_RUNS"] = str(tmp / "runs")
        text, folder = make_model(tmp, shape)
        start = time.perf_counter()
        model, res = train(folder, text, shape)
        trained_s = time.perf_counter() - start
        from attn_core.hf.tokenizer import load_tokenizer

        tok = load_tokenizer(folder)
        body = text.read_text()
        ids = tok.encode(body[-40 * shape["tokens"] :]).ids[-shape["tokens"] :]  # the corpus's last tokens
        if len(ids) < shape["tokens"]:
            sys.exit(f"the corpus has only {len(ids)} tokens at its end")
        start = time.perf_counter()
        heads = measure(model, ids, shape["bins"])
        measured_s = time.perf_counter() - start
    after = res.get("after") or {}
    result = dict(shape={k: v for k, v in shape.items() if k != "bins"}, tokens=shape["tokens"], block=shape["block"],
                  perplexity_after=after.get("perplexity"), train_s=trained_s, measure_s=measured_s, heads=heads)  # fmt: skip
    md = markdown(result)
    print(md)
    print(
        f"\ntrained {shape['steps']} steps in {trained_s:.0f} s; held-out perplexity {after.get('perplexity')}; measured in {measured_s:.1f} s"
    )
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "long_context.json").write_text(json.dumps(result, indent=2) + "\n")
        (RESULTS / "long_context.md").write_text(md + "\n")


if __name__ == "__main__":
    main()
