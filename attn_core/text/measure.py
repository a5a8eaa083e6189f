"""What a run on text measures before and after (and the trainer's held-out evaluation): held-out
loss, perplexity and next-token accuracy, per-head attention entropy and top-1 mass on held-out
text, the vocabulary view's entropy, the spectrum of B of every head and, for rotary heads, a
summary of sigma_1(B(delta)) over the offsets.

Sized to the run: the held-out blocks read are chosen by tokens (``tokens``: the trainer asks for
a share of what it trains on between evaluations, a job for a share of the whole run, see
``training.trainer.eval_tokens`` and ``retraining.job``), at most ``samples`` blocks and at most
the held-out blocks there are. The forward runs at the run's precision (bf16 autocast for a bf16
run; the loss is reduced in float32) and keeps only Q and K of the layers measured
(``regularizers.qk_cache``), so every layer keeps its fused attention; the heads' entropy and
top-1 mass come from Q and K in blocks of rows (``regularizers.row_summaries``). Blocks are read
in chunks whose logits stay within :data:`CHUNK_BYTES` (a 50k-token vocabulary makes one block's
logits 50 MB at 256 tokens): memory does not grow with the number of blocks measured. Sums stay
on the device and are read once at the end. The result has the keys of
``training.telemetry.measure_run`` (so cards, the Runs page and the CLI read it alike) plus
``perplexity`` and ``tokens``; the vocabulary view's entropy is left out above
``telemetry.VOCAB_VIEW_MAX`` tokens (a V x V view per head).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attn_core import regularizers as R
from attn_core.bilinear.offsets import sigma1_summaries
from attn_core.device import autocast, autocast_dtype, move
from attn_core.training.telemetry import VOCAB_VIEW_MAX, run_measurement
from attn_core.training.trainer import EVAL_SEED_OFFSET

CHUNK_BYTES = 2**28  # logits of one chunk of held-out blocks, as float32


def chunk_blocks(block: int, d_vocab: int, pattern_floats_per_block: int = 0) -> int:
    """Blocks per forward so that a chunk's logits (and patterns) stay within CHUNK_BYTES."""
    per_block = 4 * (block * d_vocab + pattern_floats_per_block)
    return max(1, CHUNK_BYTES // per_block)


def held_out_count(task, samples: int, tokens: int | None = None, split: str = "test") -> int:
    """How many held-out blocks a measurement reads: ``samples``, at most the held-out blocks
    there are, and with ``tokens`` at most the blocks that hold that many tokens (at least one)."""
    n = min(samples, task.data.held_out_blocks) if split == "test" else samples
    if tokens is not None:
        n = min(n, max(1, math.ceil(tokens / task.block)))
    return n


def _held_out(task, samples: int, seed: int, split: str, tokens: int | None = None):
    """The held-out blocks measured (:func:`held_out_count`), drawn with their own seed."""
    return task.sample(held_out_count(task, samples, tokens, split), seed + EVAL_SEED_OFFSET, split=split)


@torch.no_grad()
def evaluate_text(
    model, task, samples: int = 512, seed: int = 0, split: str = "test", device=None, precision="fp32", tokens=None
) -> dict:
    """Loss (nats per token), perplexity and accuracy on held-out blocks (:func:`held_out_count`)."""
    return _run(model, task, samples, seed, split, device, None, precision, tokens)[0]


@torch.no_grad()
def _run(model, task, samples, seed, split, device, heads, precision="fp32", tokens=None):
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    batch = _held_out(task, samples, seed, split, tokens)
    cfg = model.cfg
    step = chunk_blocks(task.block, task.d_vocab)
    dtype = autocast_dtype(precision)
    # on the device until the one read at the end: loss sum, right predictions, per-head sums
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    right = torch.zeros((), dtype=torch.int64, device=device)
    sums = {k: torch.zeros(cfg.n_layers, cfg.n_heads, dtype=torch.float64, device=device) for k in ("entropy", "top1")}
    count = 0
    for lo in range(0, len(batch.tokens), step):
        tokens_ = move(batch.tokens[lo : lo + step], device)  # pinned, without a wait, to a GPU
        targets = move(batch.targets[lo : lo + step], device).reshape(-1)
        cache = R.qk_cache(model, heads) if heads else None
        with autocast(device, dtype):
            logits = model(tokens_, cache=cache)
        if heads:
            conc = R.data_concentration(model, cache, heads)  # NaN where no head was asked for
            for k in sums:
                sums[k] += conc[k].double() * len(tokens_)
            del cache
        flat = logits.reshape(-1, logits.shape[-1])
        loss_sum += F.cross_entropy(flat.float(), targets, reduction="sum").double()
        right += (flat.argmax(-1) == targets).sum()
        count += targets.numel()
        del logits, flat
    model.train(was_training)
    n = len(batch.tokens)
    read = torch.cat([loss_sum[None], right.double()[None], *(v.flatten() / n for v in sums.values())]).cpu()
    loss = float(read[0]) / count
    out = {
        "accuracy": float(read[1]) / count,
        "loss": loss,
        "perplexity": math.exp(loss) if loss < 700 else math.inf,
        "samples": n,
        "tokens": count,
    }
    per_head = read[2:].float().reshape(2, cfg.n_layers, cfg.n_heads)
    return out, {"entropy": per_head[0], "top1": per_head[1]}


@torch.no_grad()
def text_metrics(model, task, heads=None, samples: int = 512, seed: int = 0, tokens=None, precision="fp32") -> dict:
    """The run's measurement on held-out text (module doc); ``heads`` a selection as
    ``regularizers.parse_heads`` reads it (None: every head)."""
    heads = R.parse_heads(heads, model.cfg)
    ev, data = _run(model, task, samples, seed, "test", None, heads, precision, tokens)
    vocab = None
    if model.cfg.d_vocab <= VOCAB_VIEW_MAX:  # entropy and top-1 mass, read in one copy
        both = torch.stack(list(R.vocab_concentration(model, heads).values())).cpu()
        vocab = {"entropy": both[0], "top1": both[1]}
    out = run_measurement(model, heads, ev, data, vocab)
    if model.cfg.positional == "rotary" and model.cfg.qk == "factored":  # one batched spectrum, one read
        offsets = sigma1_summaries(model, [(r["layer"], r["index"]) for r in out["per_head"]])
        for row, summary in zip(out["per_head"], offsets):
            row["offset_sigma1"] = summary
    return {**out, "perplexity": ev["perplexity"], "tokens": ev["tokens"]}
