"""Retraining an imported model on text (``attn_core.text``): held-out perplexity before and after,
attention entropy, and training throughput in tokens/s, on a generated corpus (no download).

A small Llama-shaped model (grouped-query attention, rotary, RMSNorm, SwiGLU) is made by
transformers with random weights and a byte-level BPE tokenizer is trained on the corpus
(English-like pseudo-words, Zipf-distributed, each paragraph repeating one of its sentences so
that copying from context pays). The model is first trained on the text without a regularizer
(the "pretrained" parent), then retrained from that run with ``entropy`` on every head at several
strengths, with ``--train all`` and ``--train qk --kl``:

    python benchmarks/text_retrain.py            # d_model 128, 2 layers, 400 + 150 steps
    python benchmarks/text_retrain.py --quick    # a tiny model, a few steps, nothing saved

Prints per setting: held-out perplexity before and after, mean normalized attention entropy on
held-out text before and after, and tokens/s (steps/s x batch x block, the training loop only).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import record  # noqa: E402
from benchmarks.text_tokenize import words  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "text_retrain.json"
FULL = dict(hidden=128, layers=2, heads=4, kv=2, mlp=344, vocab=2048, corpus_mb=2.0, block=64, batch=16,
            pretrain=400, retrain=150, lambdas=(0.1, 1.0))  # fmt: skip
QUICK = dict(hidden=32, layers=2, heads=4, kv=2, mlp=64, vocab=300, corpus_mb=0.1, block=16, batch=4,
             pretrain=6, retrain=4, lambdas=(1.0,))  # fmt: skip


def corpus(path: Path, mb: float) -> None:
    """Paragraphs of Zipf-distributed sentences; each paragraph says one of its sentences again."""
    rng = random.Random(0)
    vocab = words(rng, 3000)
    weights = [1 / (r + 1) for r in range(len(vocab))]
    out, size = [], 0
    while size < mb * 2**20:
        sentences = [" ".join(rng.choices(vocab, weights, k=rng.randrange(5, 12))).capitalize() + "." for _ in range(4)]
        sentences.append(rng.choice(sentences[:3]))
        out.append(" ".join(sentences))
        size += len(out[-1]) + 1
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


def model_folder(folder: Path, shape: dict, text: Path) -> None:
    import torch
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train(
        [str(text)], vocab_size=shape["vocab"], min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False
    )
    cfg = transformers.LlamaConfig(
        hidden_size=shape["hidden"], num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv"], intermediate_size=shape["mlp"], vocab_size=tok.get_vocab_size(),
        max_position_embeddings=4 * shape["block"], eos_token_id=0, bos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))


def retrain(source: str, text: Path, shape: dict, steps: int, **settings) -> dict:
    from attn_core.retraining.job import TrainingJob
    from attn_core.training.config import JobConfig

    cfg = JobConfig(
        source=source, text=str(text), block=shape["block"], batch_size=shape["batch"], steps=steps,
        eval_every=max(1, steps // 3), measure_samples=64, seed=0, **settings,
    )  # fmt: skip
    job = TrainingJob.open(cfg)
    res = job.run()
    assert res["status"] == "completed", res["message"]
    snap = job.snapshot()
    tokens_per_s = shape["batch"] * shape["block"] * snap.step / snap.step_s if snap.step_s else None
    return dict(
        run=res["run_id"],
        perplexity_before=round(res["before"]["perplexity"], 2),
        perplexity_after=round(res["after"]["perplexity"], 2),
        entropy_before=round(res["before"]["entropy_data"], 4),
        entropy_after=round(res["after"]["entropy_data"], 4),
        tokens_per_s=round(tokens_per_s) if tokens_per_s else None,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: a tiny model, a few steps, nothing saved")
    args = ap.parse_args()
    shape = QUICK if args.quick else FULL
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["ATTN_LAB_RUNS"] = str(tmp / "runs")
        text, folder = tmp / "corpus.txt", tmp / "llama"
        corpus(text, shape["corpus_mb"])
        model_folder(folder, shape, text)
        base = retrain(str(folder), text, shape, shape["pretrain"], lr=3e-3)
        rows = [dict(setting=f"pretrain (all, no regularizer, {shape['pretrain']} steps, lr 3e-3)", **base)]
        parent = f"run:{base['run']}"
        for lam in (0.0, *shape["lambdas"]):
            reg = [f"entropy={lam}"] if lam else []
            rows.append(
                dict(setting=f"all, entropy={lam}", **retrain(parent, text, shape, shape["retrain"], regularizers=reg))
            )
        for lam in shape["lambdas"]:
            setting = dict(regularizers=[f"entropy={lam}"], train="qk", kl=1.0)
            rows.append(
                dict(setting=f"qk + kl=1, entropy={lam}", **retrain(parent, text, shape, shape["retrain"], **setting))
            )
    for r in rows:
        r.pop("run")
        print(json.dumps(r))
    result = dict(shape={k: v for k, v in shape.items()}, rows=rows, **record.environment())
    if not args.quick:
        record.save(result, RESULTS)


if __name__ == "__main__":
    main()
