"""Probes: the inputs a model's sinks and data-space ranks are measured on (``bilinear.sinks``,
``bilinear.ranks``), and the one call each that the CLI and the pages make.

- a user's text (``text``: a .txt/.jsonl/Parquet file or folder, read as retrain reads it:
  ``source.tokenize_text`` tokenizes it with the model folder's own tokenizer.json into the token
  cache): ``n`` non-overlapping windows of ``length`` tokens, evenly spaced over the whole token
  stream (nothing is trained, so no block and no held-out part: a text is long enough when it
  holds one probe);
- else the model's task: ``n`` held-out samples (split test, seed ``seed``), cut to ``length``.

``length`` defaults to 64 tokens (Gu et al.'s probes), cut to the model's context.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attn_core.bilinear.ranks import VARIANCE, Ranks, ranks
from attn_core.bilinear.sinks import EPS, PROBE_LENGTH, Sinks, sinks
from attn_core.checkpoint import LoadedModel
from attn_core.limits import check_count
from attn_core.validate import check_seed, shown

PROBES = 32  # probes by default
MAX_PROBES = 4096


@dataclass(frozen=True)
class Probes:
    """Token ids [n, T] and what they are (one sentence)."""

    tokens: torch.Tensor
    what: str


def check_length(length: int | None, n_ctx: int) -> int:
    """Tokens per probe: ``length`` (2..context), default :data:`PROBE_LENGTH` cut to the context."""
    if length is None:
        return min(PROBE_LENGTH, n_ctx)
    if isinstance(length, bool) or not isinstance(length, int) or not 2 <= length <= n_ctx:
        raise ValueError(f"--length must be a whole number of tokens in 2..{n_ctx} (the context), got {shown(length)}")
    return length


def text_windows(streams: list[np.ndarray], n: int, length: int) -> torch.Tensor:
    """``n`` (at most as many as there are) non-overlapping windows of ``length`` tokens, evenly
    spaced over the concatenation of ``streams`` (a window never spans two streams)."""
    starts = [(i, s) for i, st in enumerate(streams) for s in range(0, len(st) - length + 1, length)]
    if not starts:
        raise ValueError(f"the text has too few tokens for one probe of {length} tokens")
    picks = np.unique(np.linspace(0, len(starts) - 1, min(n, len(starts))).round().astype(int))
    rows = [np.asarray(streams[starts[p][0]][starts[p][1] : starts[p][1] + length], dtype=np.int64) for p in picks]
    return torch.from_numpy(np.stack(rows))


def probes(
    loaded: LoadedModel,
    text: str | Path | None = None,
    n: int = PROBES,
    length: int | None = None,
    seed: int = 0,
    field: str | None = None,
    cache_root: str | Path | None = None,
    progress=None,
) -> Probes:
    """The probes of ``loaded`` (the module doc). Bad input is one ValueError (TextError)."""
    from attn_core.hf.tokenizer import TOKENIZER

    check_count("--samples", n, hi=MAX_PROBES)
    check_seed("--seed", seed)
    T = check_length(length, loaded.config.n_ctx)
    if text is not None:
        folder = loaded.path if loaded.path is not None and Path(loaded.path).is_dir() else None
        if folder is None or not (Path(folder) / TOKENIZER).exists():
            instead = "leave --text out to probe it with its task's samples" if loaded.task is not None else ""
            raise ValueError(
                f"{loaded.name} has no {TOKENIZER} in its folder, so a text cannot be tokenized for it"
                + (f"; {instead}" if instead else "")
            )
        from attn_core.text.source import tokenize_text
        from attn_core.text.task import check_token_file

        # the whole token stream (nothing is trained: no block, no held-out part), from the token cache
        _, [(corpus, stream)] = tokenize_text(Path(folder), loaded.name, str(text), field, None, cache_root, progress)
        check_token_file(stream, loaded.config.d_vocab)
        if stream.n_tokens < T:
            raise ValueError(
                f"the text has {stream.n_tokens:,} tokens, fewer than one probe of {T} (--length {T}); "
                "give more text or a smaller --length"
            )
        tokens = text_windows([stream.array()], n, T)
        files = corpus.names() or [str(text)]
        name = files[0] if len(files) == 1 else f"{len(files)} files"
        return Probes(tokens, f"{tokens.shape[0]} windows of {T} tokens of {name} ({stream.n_tokens:,} tokens)")
    task = loaded.task
    if task is None or task.d_vocab != loaded.config.d_vocab:
        raise ValueError(f"{loaded.name} has no task in its card: give --text FILE, a text to cut its probes from")
    tokens = task.sample(n, seed, split="test").tokens[:, :T].cpu()
    return Probes(tokens, f"{n} held-out {task.name} samples of {tokens.shape[1]} tokens (seed {seed})")


def measure_sinks(
    loaded: LoadedModel, text=None, eps: float = EPS, n: int = PROBES, length=None, seed: int = 0, **options
) -> Sinks:
    """The sinks of ``loaded`` on its probes (:func:`probes`; ``options``: field, cache_root, progress)."""
    p = probes(loaded, text, n, length, seed, **options)
    return sinks(loaded.model, p.tokens, eps, p.what)


def measure_ranks(
    loaded: LoadedModel, text=None, frac: float = VARIANCE, n: int = PROBES, length=None, seed: int = 0, **options
) -> Ranks:
    """Both ranks of every head of ``loaded``, the data space on its probes (:func:`probes`)."""
    p = probes(loaded, text, n, length, seed, **options)
    return ranks(loaded.model, p.tokens, frac, p.what)
