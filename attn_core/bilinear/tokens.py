"""A model's tokens as a user sees them: their names, typed text, and inputs to look at.

Every function takes the :class:`~attn_core.sources.LoadedModel` (what ``sources.resolve``
returns): the names come from its task, or its folder's ``tokenizer.json`` (typed text is then
tokenized by it), or the vocabulary file its card names (a Hugging Face ``vocab.json``, read
only inside the model's folder), else the ids.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from attn_core import checkpoint
from attn_core.bilinear.checks import check_ids, check_loaded, check_tokens
from attn_core.hf import tokenizer as hf_tokenizer
from attn_core.sources import LoadedModel
from attn_core.validate import check_seed, short_list

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@functools.lru_cache(maxsize=8)
def _tokenizer_and_names(folder: str, mtime_ns: int, d_vocab: int) -> tuple[Tokenizer, tuple[str, ...]] | None:
    tok = hf_tokenizer.load_tokenizer(Path(folder))
    return None if tok is None else (tok, tuple(hf_tokenizer.token_strings(tok, d_vocab)))


def tokenizer(loaded: LoadedModel) -> Tokenizer | None:
    """The model folder's own tokenizer.json (read once per file version), or None."""
    found = _tokenizer_entry(check_loaded(loaded, "tokenizer"))
    return found[0] if found else None


def _tokenizer_entry(loaded: LoadedModel):
    path = loaded.path
    if path is None or not path.is_dir():
        return None
    try:
        mtime = (path / hf_tokenizer.TOKENIZER).stat().st_mtime_ns
    except OSError:
        return None
    return _tokenizer_and_names(str(path), mtime, loaded.model.cfg.d_vocab)


def _task(loaded: LoadedModel):
    """The model's task when its vocabulary is the task's, else None."""
    task = loaded.task
    return task if task is not None and task.d_vocab == loaded.model.cfg.d_vocab else None


def token_names(loaded: LoadedModel) -> list[str]:
    """Names of every token: the task's, those of the vocabulary file the card names (read only
    inside the model's folder, bounded and checked: ``checkpoint.read_vocab``), else the ids."""
    loaded = check_loaded(loaded, "token_names")
    V = loaded.model.cfg.d_vocab
    task = _task(loaded)
    if task is not None:
        return list(task.token_names)
    found = _tokenizer_entry(loaded)
    if found is not None:
        return list(found[1])
    folder = loaded.path if loaded.path is not None and Path(loaded.path).is_dir() else None
    name = loaded.card.vocab_file
    if folder is None or name is None:
        return [str(i) for i in range(V)]
    try:
        st = os.stat(Path(folder) / name)
        stamp = (st.st_mtime_ns, st.st_size)
    except (OSError, ValueError):  # read_vocab says what is wrong
        stamp = None
    return list(_vocab(str(folder), name, V, stamp))


def position_labels(loaded: LoadedModel, tokens: Sequence[int]) -> list[str]:
    """The label "position:name" of each token of an input, as every view's axes show it."""
    loaded = check_loaded(loaded, "position_labels")
    names = token_names(loaded)
    return [f"{p}:{names[t]}" for p, t in enumerate(check_ids(loaded.model, tokens))]


@functools.lru_cache(maxsize=8)
def _vocab(folder: str, name: str, V: int, stamp) -> tuple[str, ...]:
    """The checked vocabulary, read once per file version (``stamp``: its mtime and size)."""
    return tuple(checkpoint.read_vocab(Path(folder), name, V))


@functools.lru_cache(maxsize=64)
def _encoded(tok: Tokenizer, text: str) -> tuple[tuple[int, ...], ValueError | None]:
    """``text`` tokenized by ``tok`` (bounded in time: ``hf.tokenizer.encode``), or the error,
    remembered: a page's rerun does not wait for a tokenizer that timed out again."""
    try:
        return tuple(hf_tokenizer.encode(tok, text)), None
    except ValueError as e:  # LimitError and CheckpointError included
        return (), e


def _text_ids(tok: Tokenizer, text: str) -> list[int]:
    """``text`` by the tokenizer, refused when it holds pieces the tokenizer does not know."""
    ids, error = _encoded(tok, text)
    if error is not None:
        raise error
    unknown = hf_tokenizer.unknown_token(tok)
    if unknown is not None and unknown[0] not in text and unknown[1] in ids:
        n = ids.count(unknown[1])
        raise ValueError(
            f"{n} of the {len(ids)} tokens of the text are {unknown[0]!r}, the tokenizer's unknown token: it does "
            "not know those pieces. The model has a tokenizer.json, so typed tokens are text, not token ids; "
            "type text in its vocabulary"
        )
    return list(ids)


def encode_first(loaded: LoadedModel, text: str, n: int) -> tuple[list[int], int]:
    """(the first ``n`` tokens of ``text`` by the model's tokenizer.json, how many it has in all):
    a text longer than an input may be, cut (:func:`input_ids` refuses it). ValueError without a
    tokenizer."""
    loaded = check_loaded(loaded, "encode_first")
    tok = tokenizer(loaded)
    if tok is None:
        raise ValueError(f"{loaded.name} has no tokenizer.json: give tokens, not text")
    ids = _text_ids(tok, text)
    return check_tokens(loaded.model, ids[:n]), len(ids)


def input_ids(loaded: LoadedModel, text: str) -> list[int]:
    """Space-separated tokens: names of the task's vocabulary, or ids / vocabulary entries for a
    model without a task; with a tokenizer.json, the text as that tokenizer splits it (a piece it
    does not know, which would be its unknown token, is refused: "1 2 3" meant as ids included).
    Raises ValueError naming what is wrong."""
    loaded = check_loaded(loaded, "encode")
    model = loaded.model
    task = _task(loaded)
    if task is not None:
        n = len(text.split())
        if n > task.n_ctx:  # before the task lists every unknown name
            raise ValueError(f"{n} tokens exceed the model context of {task.n_ctx}")
        return task.encode(text)
    tok = tokenizer(loaded)
    if tok is not None:
        return check_tokens(model, _text_ids(tok, text))
    words = text.split()
    if not words:
        raise ValueError("no tokens given")
    if len(words) > model.cfg.n_ctx:
        raise ValueError(f"{len(words)} tokens exceed the model context of {model.cfg.n_ctx}")
    index = {n: i for i, n in enumerate(token_names(loaded))}
    unknown = [w for w in words if w not in index and not w.lstrip("-").isdigit()]
    if unknown:
        raise ValueError(
            f"{len(unknown)} unknown token{'s' * (len(unknown) != 1)} ({short_list(unknown)}): "
            f"give token ids 0..{model.cfg.d_vocab - 1} or names of the vocabulary"
        )
    return check_tokens(model, [index[w] if w in index else int(w) for w in words])


def sample_tokens(loaded: LoadedModel, seed: int = 0) -> list[int]:
    """The input of one held-out sample of the model's task."""
    loaded = check_loaded(loaded, "sample_tokens")
    task = loaded.task
    if task is None:
        raise ValueError("this model has no task in its card; type tokens or use random tokens instead")
    return task.sample(1, seed=check_seed("the sample seed", seed), split="test").tokens[0].tolist()


def random_tokens(loaded: LoadedModel, seed: int = 0, length: int | None = None) -> list[int]:
    """Uniform random tokens (seeded), ``length`` defaulting to the context (at most 64)."""
    loaded = check_loaded(loaded, "random_tokens")
    cfg = loaded.model.cfg
    length = min(cfg.n_ctx, 64) if length is None else length
    if not 1 <= length <= cfg.n_ctx:
        raise ValueError(f"length {length} is outside 1..{cfg.n_ctx}")
    g = torch.Generator().manual_seed(check_seed("the random seed", seed))
    return torch.randint(0, cfg.d_vocab, (length,), generator=g).tolist()
