"""Seeded synthetic tasks for toy transformers.

Every task yields whole sequences ``seq`` [batch, n_ctx + 1] and a boolean ``scored`` of the same
shape marking which tokens the model must predict. The model reads ``tokens = seq[:, :-1]`` and
is scored on ``targets = seq[:, 1:]`` where ``mask = scored[:, 1:]`` (next-token prediction).
Accuracy is the fraction of scored tokens whose argmax is right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attn_core.device import same_device
from attn_core.validate import short_list

LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # [b, T] model input
    targets: torch.Tensor  # [b, T] next tokens
    mask: torch.Tensor  # [b, T] bool, positions that are scored

    def to(self, device) -> Batch:
        return Batch(self.tokens.to(device), self.targets.to(device), self.mask.to(device))


def _distinct(n_rows: int, k: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """n_rows rows of k distinct values from range(vocab), on the generator's device."""
    return torch.rand(n_rows, vocab, generator=g, device=g.device).argsort(dim=-1)[:, :k]


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    token_names: tuple[str, ...]
    seq_len: int  # n_ctx + 1 tokens per sequence
    _generate: Callable[[int, torch.Generator, str], tuple[torch.Tensor, torch.Tensor]]
    accuracy_bar: float = 0.95

    @property
    def d_vocab(self) -> int:
        return len(self.token_names)

    @property
    def n_ctx(self) -> int:
        return self.seq_len - 1

    def sample(self, n: int, seed: int | torch.Generator = 0, split: str = "train") -> Batch:
        """``n`` sequences; the same seed always gives the same batch. Drawn on the generator's
        device: an int seed draws on the CPU (the same batch on every machine); a CUDA generator
        draws on the GPU (its own stream: no copy from the host and no wait)."""
        if n <= 0:
            raise ValueError(f"number of samples must be positive, got {n}")
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        g = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed))
        seq, scored = self._generate(n, g, split)
        seq, scored = seq.to(g.device), scored.to(g.device)  # a generator that drew on the CPU anyway
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), scored[:, 1:].contiguous())

    def loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(logits[batch.mask], batch.targets[batch.mask])

    def accuracy(self, logits: torch.Tensor, batch: Batch) -> float:
        right = logits.argmax(-1)[batch.mask] == batch.targets[batch.mask]
        return right.float().mean().item()

    def names(self, token_ids) -> list[str]:
        return [self.token_names[int(t)] for t in token_ids]

    def encode(self, text: str) -> list[int]:
        """Parse space-separated token names ("a b c"); unknown names raise with the vocabulary."""
        words = text.split()
        if not words:
            raise ValueError("no tokens given")
        index = {n: i for i, n in enumerate(self.token_names)}
        bad = [w for w in words if w not in index]
        if bad:
            raise ValueError(
                f"unknown tokens [{short_list(bad, 3)}]; this task's vocabulary is: {' '.join(self.token_names)}"
            )
        if len(words) > self.n_ctx:
            raise ValueError(f"{len(words)} tokens exceed the model context of {self.n_ctx}")
        return [index[w] for w in words]


# --- generators ------------------------------------------------------------------------------


def _induction(n_ctx: int = 24, vocab: int = 26, min_period: int = 4, max_period: int = 10):
    """A random period of distinct letters repeated to fill the context; the period length varies
    per sample, so only content (previous-token + induction heads), not position, predicts it."""

    def gen(n, g, split):
        L = n_ctx + 1
        period = torch.randint(min_period, max_period + 1, (n,), generator=g, device=g.device)
        block = _distinct(n, max_period, vocab, g)
        pos = torch.arange(L, device=g.device)[None, :]
        seq = block.gather(1, pos % period[:, None])
        scored = pos > period[:, None]  # predicting token t needs its earlier occurrence at t-period
        return seq, scored

    return gen


def _recall(n_pairs: int = 6, n_queries: int = 6, n_symbols: int = 24):
    """Multi-query associative recall: k1 v1 ... kn vn ? q1 a1 q2 a2 ..., each answer a_j the
    value stored with key q_j; every answer is scored.

    Keys and values are drawn from one alphabet (the keys distinct, the values never equal to a
    key of the same sequence), so a token's role shows only in its position, as in the induction
    task: the model must learn a previous-token head and an induction-style lookup. With disjoint
    key and value vocabularies a two-layer attention-only model settles for "attend to every
    value" and stalls near 50% accuracy."""

    def gen(n, g, split):
        perm = torch.rand(n, n_symbols, generator=g, device=g.device).argsort(dim=-1)
        keys = perm[:, :n_pairs]
        pool = perm[:, n_pairs:]
        values = pool.gather(1, torch.randint(0, n_symbols - n_pairs, (n, n_pairs), generator=g, device=g.device))
        pairs = torch.stack([keys, values], dim=-1).reshape(n, 2 * n_pairs)
        which = _distinct(n, n_queries, n_pairs, g)
        asked = torch.stack([keys.gather(1, which), values.gather(1, which)], dim=-1).reshape(n, 2 * n_queries)
        query = torch.full((n, 1), n_symbols, device=g.device)
        seq = torch.cat([pairs, query, asked], dim=1)
        scored = torch.zeros_like(seq, dtype=torch.bool)
        scored[:, 2 * n_pairs + 2 :: 2] = True
        return seq, scored

    return gen


def _copy_or_reverse(length: int, n_digits: int, reverse: bool):
    def gen(n, g, split):
        src = torch.randint(0, n_digits, (n, length), generator=g, device=g.device)
        out = src.flip(1) if reverse else src
        sep = torch.full((n, 1), n_digits, device=g.device)
        seq = torch.cat([src, sep, out], dim=1)
        scored = torch.zeros_like(seq, dtype=torch.bool)
        scored[:, length + 1 :] = True
        return seq, scored

    return gen


def _sort(length: int, n_values: int):
    def gen(n, g, split):
        src = _distinct(n, length, n_values, g)
        sep = torch.full((n, 1), n_values, device=g.device)
        seq = torch.cat([src, sep, src.sort(dim=1).values], dim=1)
        scored = torch.zeros_like(seq, dtype=torch.bool)
        scored[:, length + 1 :] = True
        return seq, scored

    return gen


def _modular_addition(p: int, train_fraction: float, split_seed: int = 1234):
    """a b = (a+b) mod p. Pairs are split once, by a fixed seed, into train and held-out test
    pairs, so test accuracy measures generalisation, not memorisation."""
    perm = torch.randperm(p * p, generator=torch.Generator().manual_seed(split_seed))
    n_train = int(round(train_fraction * p * p))
    split_pairs = {"train": perm[:n_train], "test": perm[n_train:]}
    on_device: dict = {}  # (split, device) -> the pairs there, copied once

    def gen(n, g, split):
        pool = split_pairs[split]
        if not same_device(g.device, pool.device):
            if (split, g.device) not in on_device:
                on_device[split, g.device] = pool.to(g.device)
            pool = on_device[split, g.device]
        idx = pool[torch.randint(0, len(pool), (n,), generator=g, device=g.device)]
        a, b = idx // p, idx % p
        eq = torch.full_like(a, p)
        seq = torch.stack([a, b, eq, (a + b) % p], dim=1)
        scored = torch.zeros_like(seq, dtype=torch.bool)
        scored[:, -1] = True
        return seq, scored

    gen.all_pairs = split_pairs  # exposed for full-batch training and exhaustive evaluation
    return gen


def _names_digits(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def _build() -> dict[str, Task]:
    tasks = [
        Task(
            "induction",
            "A random period of distinct letters, repeated; predict the next letter "
            "from the earlier repeat (previous-token + induction heads).",
            tuple(LETTERS),
            25,
            _induction(),
        ),
        Task(
            "recall",
            "Associative recall: six key-value pairs of letters, then '?' and the six keys in a "
            "new order, each followed by its value, which is predicted.",
            tuple(LETTERS[:24]) + ("?",),
            25,
            _recall(),
        ),
        Task(
            "copy",
            "Copy eight digits after the separator '|'.",
            tuple(_names_digits(10)) + ("|",),
            17,
            _copy_or_reverse(8, 10, reverse=False),
        ),
        Task(
            "reverse",
            "Write eight digits in reverse order after the separator '|'.",
            tuple(_names_digits(10)) + ("|",),
            17,
            _copy_or_reverse(8, 10, reverse=True),
        ),
        Task(
            "sort",
            "Sort six distinct numbers (0-15) after the separator '|'.",
            tuple(_names_digits(16)) + ("|",),
            13,
            _sort(6, 16),
        ),
        Task(
            "modadd",
            "Modular addition a b = (a + b) mod 23, trained on 80% of the pairs and scored on the held-out 20%.",
            tuple(_names_digits(23)) + ("=",),
            4,
            _modular_addition(23, 0.8),
        ),
    ]
    return {t.name: t for t in tasks}


TASKS: dict[str, Task] = _build()


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}") from None
