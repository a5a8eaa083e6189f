"""A model's tokens as a user sees them: their names, typed text, and inputs to look at.

Every function takes the :class:`~attn_core.sources.LoadedModel` (what ``sources.resolve``
returns): the names come from its task, or its card's Hugging Face ``vocab.json``, else the ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attn_core.bilinear.checks import check_loaded, check_tokens
from attn_core.sources import LoadedModel


def _task(loaded: LoadedModel):
    """The model's task when its vocabulary is the task's, else None."""
    task = loaded.task
    return task if task is not None and task.d_vocab == loaded.model.cfg.d_vocab else None


def token_names(loaded: LoadedModel) -> list[str]:
    """Names of every token: the task's, the Hugging Face vocab.json's, else the ids."""
    V = check_loaded(loaded, "token_names").model.cfg.d_vocab
    task = _task(loaded)
    if task is not None:
        return list(task.token_names)
    vocab = loaded.card.vocab_file
    names = [str(i) for i in range(V)]
    if vocab and Path(vocab).is_file():
        for word, i in json.loads(Path(vocab).read_text()).items():
            if isinstance(i, int) and 0 <= i < V:
                names[i] = word
    return names


def encode(loaded: LoadedModel, text: str) -> list[int]:
    """Space-separated tokens: names of the task's vocabulary, or ids / vocabulary entries for a
    model without a task. Raises ValueError naming what is wrong."""
    model = check_loaded(loaded, "encode").model
    task = _task(loaded)
    if task is not None:
        return task.encode(text)
    words = text.split()
    if not words:
        raise ValueError("no tokens given")
    index = {n: i for i, n in enumerate(token_names(loaded))}
    ids = []
    for w in words:
        if w in index:
            ids.append(index[w])
        elif w.lstrip("-").isdigit():
            ids.append(int(w))
        else:
            raise ValueError(
                f"unknown token {w!r}: give token ids 0..{model.cfg.d_vocab - 1} or names of the vocabulary"
            )
    return check_tokens(model, ids)


def sample_tokens(loaded: LoadedModel, seed: int = 0) -> list[int]:
    """The input of one held-out sample of the model's task."""
    task = check_loaded(loaded, "sample_tokens").task
    if task is None:
        raise ValueError("this model has no task in its card; type tokens or use random tokens instead")
    return task.sample(1, seed=seed, split="test").tokens[0].tolist()


def random_tokens(loaded: LoadedModel, seed: int = 0, length: int | None = None) -> list[int]:
    """Uniform random tokens (seeded), ``length`` defaulting to the context (at most 64)."""
    cfg = check_loaded(loaded, "random_tokens").model.cfg
    length = min(cfg.n_ctx, 64) if length is None else length
    if not 1 <= length <= cfg.n_ctx:
        raise ValueError(f"length {length} is outside 1..{cfg.n_ctx}")
    g = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, cfg.d_vocab, (length,), generator=g).tolist()
