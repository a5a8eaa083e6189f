"""What a run on text measures before and after (and the trainer's held-out evaluation): held-out
loss, perplexity and next-token accuracy, per-head attention entropy and top-1 mass on held-out
text, the spectrum of B of every head and, for rotary heads, a summary of sigma_1(B(delta))
over the offsets.

Held-out blocks are read in chunks so that a chunk's logits and kept attention patterns stay
within :data:`CHUNK_BYTES` (a 50k-token vocabulary makes one block's logits 50 MB at 256 tokens):
memory does not grow with the number of blocks measured. The result has the keys of
``training.telemetry.measure`` (so cards, the Runs page and the CLI read it alike) plus
``perplexity`` and ``tokens``; the vocabulary view's entropy is left out above
``telemetry.VOCAB_VIEW_MAX`` tokens (a V x V view per head).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attn_core import regularizers as R
from attn_core.bilinear.offsets import sigma1_summary
from attn_core.hooks import act_name
from attn_core.regularizers.heads import by_layer
from attn_core.training.telemetry import VOCAB_VIEW_MAX, summarize
from attn_core.training.trainer import EVAL_SEED_OFFSET

CHUNK_BYTES = 2**28  # logits (and kept patterns) of one chunk of held-out blocks, as float32


def chunk_blocks(block: int, d_vocab: int, pattern_floats_per_block: int = 0) -> int:
    """Blocks per forward so that a chunk's logits (and patterns) stay within CHUNK_BYTES."""
    per_block = 4 * (block * d_vocab + pattern_floats_per_block)
    return max(1, CHUNK_BYTES // per_block)


def _held_out(task, samples: int, seed: int, split: str):
    """The held-out blocks measured: ``samples`` of them, at most as many as there are."""
    n = min(samples, task.data.held_out_blocks) if split == "test" else samples
    return task.sample(n, seed + EVAL_SEED_OFFSET, split=split)


@torch.no_grad()
def evaluate(model, task, samples: int = 512, seed: int = 0, split: str = "test", device=None) -> dict:
    """Loss (nats per token), perplexity and accuracy on ``samples`` held-out blocks."""
    return _run(model, task, samples, seed, split, device, heads=None)[0]


@torch.no_grad()
def _run(model, task, samples, seed, split, device, heads):
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    batch = _held_out(task, samples, seed, split)
    names = [act_name("pattern", l) for l in by_layer(heads)] if heads else []
    T = task.block
    step = chunk_blocks(T, task.d_vocab, len(names) * model.cfg.n_heads * T * T)
    loss_sum, right, count = 0.0, 0, 0
    cfg = model.cfg
    sums = {k: torch.zeros(cfg.n_layers, cfg.n_heads, dtype=torch.float64) for k in ("entropy", "top1")}
    for lo in range(0, len(batch.tokens), step):
        tokens = batch.tokens[lo : lo + step].to(device)
        targets = batch.targets[lo : lo + step].to(device).reshape(-1)
        if names:
            logits, cache = model.run_with_cache(tokens, names_filter=names)
            conc = R.data_concentration(model, cache, heads)
            for k in sums:
                sums[k] += conc[k].double().cpu() * len(tokens)
            del cache
        else:
            logits = model(tokens)
        flat = logits.reshape(-1, logits.shape[-1])
        loss_sum += float(F.cross_entropy(flat.float(), targets, reduction="sum"))
        right += int((flat.argmax(-1) == targets).sum())
        count += targets.numel()
        del logits, flat
    model.train(was_training)
    loss = loss_sum / count
    out = {
        "accuracy": right / count,
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 700 else math.inf,
        "samples": len(batch.tokens),
        "tokens": count,
    }
    n = len(batch.tokens)
    return out, {k: (v / n).float() for k, v in sums.items()}  # NaN where no head was asked for


@torch.no_grad()
def measure(model, task, heads=None, samples: int = 512, seed: int = 0) -> dict:
    """The run's measurement on held-out text (module doc); ``heads`` a selection as
    ``regularizers.parse_heads`` reads it (None: every head)."""
    heads = R.parse_heads(heads, model.cfg)
    ev, data = _run(model, task, samples, seed, "test", None, heads)
    vocab = R.vocab_concentration(model, heads) if model.cfg.d_vocab <= VOCAB_VIEW_MAX else None
    out = summarize(model, heads, ev, data, None if vocab is None else {k: v.cpu() for k, v in vocab.items()})
    if model.cfg.positional == "rotary" and model.cfg.qk == "factored":
        for row in out["per_head"]:
            row["offset_sigma1"] = sigma1_summary(model, row["layer"], row["index"])
    return {**out, "perplexity": ev["perplexity"], "tokens": ev["tokens"]}
