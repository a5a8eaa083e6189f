"""Text as a task: next-token prediction on fixed-length blocks of a tokenized corpus, with the
toys' :class:`~attn_core.tasks.Task` interface, so the trainer, the live job, sweeps and the run
store take it as they take a toy.

A :class:`TextTask` samples blocks of ``block + 1`` tokens (the model reads ``block`` and is
scored on every next token). Training blocks start anywhere in the training part of the stream,
drawn by the task's generator (deterministic under ``--seed``); held-out blocks are the
non-overlapping blocks of the held-out part (the ``--eval-text`` corpus, or the last
:data:`HELD_OUT_FRACTION` of the stream), in an order drawn by the seed, repeating only when
more are asked for than there are. Its ``evaluate`` and ``measure`` read held-out text in
chunks of bounded memory (:mod:`attn_core.text.measure`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from attn_core.tasks import Batch, Task
from attn_core.text.corpus import TextError
from attn_core.text.tokens import TokenFile
from attn_core.training.text_defaults import DEFAULT_BLOCK, HELD_OUT_FRACTION, MAX_DEFAULT_BATCH, MIN_BLOCK, STEP_MEMORY

if TYPE_CHECKING:
    from tokenizers import Tokenizer

NAME = "text"


@dataclass
class TextData:
    """The token streams of a text task (memory maps) and how they are cut into blocks."""

    train: np.ndarray
    held_out: np.ndarray
    block: int
    d_vocab: int
    tokenizer: Tokenizer | None = None
    facts: dict = field(default_factory=dict)

    @property
    def held_out_blocks(self) -> int:
        """Non-overlapping held-out blocks (consecutive blocks share their boundary token)."""
        return (len(self.held_out) - 1) // self.block

    def generate(self, n: int, g: torch.Generator, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` blocks of ``block + 1`` tokens and their (all True) scored mask, on the CPU (the
        blocks are read from the memory-mapped stream; ``Task.sample`` moves them)."""
        L = self.block + 1
        # drawn on the generator's device (a CUDA generator on a GPU: Task.sample), read on the host
        if split == "train":
            starts = torch.randint(0, len(self.train) - L + 1, (n,), generator=g, device=g.device).tolist()
            stream = self.train
        else:
            order = torch.randperm(self.held_out_blocks, generator=g, device=g.device).tolist()
            starts = [order[i % len(order)] * self.block for i in range(n)]
            stream = self.held_out
        seq = torch.from_numpy(np.stack([np.asarray(stream[s : s + L], dtype=np.int64) for s in starts]))
        return seq, torch.ones_like(seq, dtype=torch.bool)


@dataclass(frozen=True, eq=False)
class TextTask(Task):
    """A :class:`~attn_core.tasks.Task` on text (see the module); build it with :func:`text_task`."""

    data: TextData | None = None
    # blocks are read from host memory: the trainer draws them on the CPU and copies them to a GPU
    # through pinned memory without waiting (training.trainer.Trainer._batch)
    host_batches = True

    @property
    def d_vocab(self) -> int:
        return self.data.d_vocab

    @property
    def block(self) -> int:
        return self.data.block

    @property
    def facts(self) -> dict:
        """What the corpus is (files, bytes, tokens, the split, the cache entry): JSON-ready."""
        return dict(self.data.facts)

    def loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Mean cross-entropy over every position (all are scored: no gather of the logits)."""
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1))

    def accuracy(self, logits: torch.Tensor, batch: Batch) -> float:
        return (logits.argmax(-1).reshape(-1) == batch.targets.reshape(-1)).float().mean().item()

    def names(self, token_ids) -> list[str]:
        tok = self.data.tokenizer
        if tok is None:
            return [str(int(t)) for t in token_ids]
        out = []
        for t in token_ids:
            text = tok.decode([int(t)], skip_special_tokens=False) or tok.id_to_token(int(t)) or f"#{int(t)}"
            out.append(text.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r"))
        return out

    def encode(self, text: str) -> list[int]:
        if self.data.tokenizer is None:
            raise ValueError("this text task has no tokenizer")
        ids = self.data.tokenizer.encode(text, add_special_tokens=False).ids
        if not ids:
            raise ValueError("no tokens given")
        if len(ids) > self.n_ctx:
            raise ValueError(f"{len(ids)} tokens exceed the block of {self.n_ctx}")
        return ids

    def evaluate(
        self, model, samples: int = 512, seed: int = 0, split: str = "test", device=None, precision="fp32", tokens=None
    ) -> dict:
        """Held-out loss, perplexity and accuracy in chunks of bounded memory (the trainer's
        held-out evaluation takes this instead of one forward over every block), at the run's
        ``precision``, on at most ``tokens`` held-out tokens (:mod:`attn_core.text.measure`)."""
        from attn_core.text import measure

        return measure.evaluate_text(model, self, samples, seed, split, device, precision, tokens)

    def measure(self, model, heads=None, samples: int = 512, seed: int = 0, tokens=None, precision="fp32") -> dict:
        """A run's before/after measurement on held-out text (``telemetry.measure_run`` takes it)."""
        from attn_core.text import measure

        return measure.text_metrics(model, self, heads, samples, seed, tokens, precision)


def text_task(data: TextData) -> TextTask:
    files = data.facts.get("files") or []
    what = files[0] if len(files) == 1 else f"{len(files)} files"
    return TextTask(
        name=NAME,
        description=f"Next-token prediction on {what} ({data.facts.get('tokens', 0):,} tokens) in blocks of {data.block}.",
        token_names=(),
        seq_len=data.block + 1,
        _generate=data.generate,
        accuracy_bar=0.0,
        data=data,
    )


def check_block(block: int | None, n_ctx: int) -> int:
    """The block length: ``block``, or :data:`DEFAULT_BLOCK` cut to the context."""
    if block is None:
        return min(n_ctx, DEFAULT_BLOCK)
    if isinstance(block, bool) or not isinstance(block, int) or not MIN_BLOCK <= block <= n_ctx:
        raise ValueError(f"--block must be an integer in {MIN_BLOCK}..{n_ctx} (the model's context), got {block!r}")
    return block


def step_bytes_per_block(cfg, block: int, kl: float = 0.0) -> int:
    """Estimated bytes that one block of ``block`` tokens adds to a training step of the model
    ``cfg`` (fp32): per token, the logits and what the loss keeps and hands back (4 x the
    vocabulary; 6 x with the KL term, whose recomputed logits and the starting model's
    log-probabilities add theirs), and per layer the activations kept for backward (16 d_model +
    3 d_mlp + 2 heads x block). It errs high: ``benchmarks/text_batch_memory.py`` measures what a
    block adds to a step's peak RSS on the CPU (docs/training.md)."""
    vocab = (6 if kl > 0 else 4) * cfg.d_vocab
    layers = cfg.n_layers * (16 * cfg.d_model + 3 * cfg.d_mlp + 2 * cfg.n_heads * block)
    return 4 * block * (vocab + layers)


def default_batch(cfg, block: int, kl: float = 0.0, device: str = "cuda") -> int:
    """Blocks per step of a text run whose batch size is neither given nor in its parent's recipe
    (an imported model): the largest power of two, at most :data:`MAX_DEFAULT_BATCH`, whose step
    is estimated (:func:`step_bytes_per_block`) to add at most :data:`STEP_MEMORY`, and on the
    CPU to take at most ``training.estimate.CPU_STEP_FLOPS`` operations (a CPU computes a step of
    64 blocks of 256 tokens of a 1M-parameter model in half a minute); at least 1. It depends on
    the model, the settings and the kind of device only (not on the machine's speed), so a
    command gives the same batches wherever it runs: 64 for small vocabularies on a GPU, 4 for
    GPT-2 small at block 256 on a GPU and 1 on the CPU."""
    from attn_core.training.estimate import CPU_STEP_FLOPS, step_flops

    fit = STEP_MEMORY // step_bytes_per_block(cfg, block, kl)
    if str(device).startswith("cpu"):
        fit = min(fit, int(CPU_STEP_FLOPS // step_flops(cfg, block, 1, kl)))
    return max(1, min(MAX_DEFAULT_BATCH, 1 << max(0, int(fit).bit_length() - 1)))


def check_token_file(tf: TokenFile | None, d_vocab: int) -> None:
    """Refuse token ids the model does not have: a tokenizer.json of another model."""
    if tf is not None and tf.meta["max_id"] >= d_vocab:
        raise TextError(
            f"the tokenizer gave token id {tf.meta['max_id']}, but the model has only {d_vocab} tokens: "
            "the tokenizer.json does not belong to this model"
        )


def split_streams(
    main: TokenFile, held: TokenFile | None, block: int, d_vocab: int
) -> tuple[np.ndarray, np.ndarray, dict]:
    """(train stream, held-out stream, facts of the split) for blocks of ``block`` tokens; a text
    too short for one training and one held-out block is refused, saying how many are needed, and
    so is a held-out text that is the training text itself (the same files and bytes)."""
    need = block + 1
    for tf in (main, held):
        check_token_file(tf, d_vocab)
    stream = main.array()
    if held is not None and held.meta.get("corpus_sha256") == main.meta.get("corpus_sha256"):
        raise TextError(
            "the held-out text (--eval-text) is the text trained on: perplexity on it would not be held out; "
            "give another text, or leave --eval-text out to hold out the end of the text"
        )
    if held is not None:
        for tf, what in ((main, "the text"), (held, "the held-out text (--eval-text)")):
            if tf.n_tokens < need:
                raise TextError(
                    f"{what} has {tf.n_tokens:,} tokens, fewer than one block of {need} (--block {block} + 1)"
                )
        return stream, held.array(), {"held_out": "eval-text"}
    n = len(stream)
    n_held = max(need, math.ceil(HELD_OUT_FRACTION * n))
    if n - n_held < need:
        raise TextError(
            f"the text has {n:,} tokens, fewer than the {2 * need:,} needed for one block of {need} to train on and "
            "one held out; give more text, a smaller --block, or a held-out text with --eval-text"
        )
    return stream[: n - n_held], stream[n - n_held :], {"held_out": f"the last {HELD_OUT_FRACTION:.0%} of the stream"}
