"""The input checks of the bilinear engine, in one place: a layer, heads, token ids, and the
model object a function takes (either one: :func:`check_model` and :func:`check_loaded` convert
it). Each failure is a ValueError (TypeError for an object that is no model) of one sentence that names the valid range (a ``limits.LimitError`` for a view larger than the
memory limit); and the one mask a view takes its visible keys from (``layer_mask``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from attn_core import limits
from attn_core.model import Transformer
from attn_core.sources import LoadedModel
from attn_core.validate import integral, is_int, shown


def check_layer(model: Transformer, layer: int) -> int:
    n = model.cfg.n_layers
    layer = integral(layer)
    if not is_int(layer):
        raise ValueError(f"layer must be an integer in 0..{n - 1}, got {shown(layer)}")
    if not 0 <= layer < n:
        raise ValueError(f"layer {shown(layer)} is outside 0..{n - 1} (this model has {n} layer{'s' * (n != 1)})")
    return int(layer)


def check_heads(model: Transformer, heads: None | int | Sequence[int]) -> list[int]:
    """Every head for None, else the given head(s) as a list, each named once."""
    n = model.cfg.n_heads
    if heads is None:
        return list(range(n))
    heads = integral(heads)
    if not is_int(heads) and (isinstance(heads, (str, bytes, Mapping)) or not isinstance(heads, Iterable)):
        raise TypeError(f"heads must be a head index or a list of them (0..{n - 1}), got {shown(heads)}")
    heads = [heads] if is_int(heads) else [integral(h) for h in heads]
    odd = [h for h in heads if not is_int(h)]
    if odd:
        raise ValueError(f"heads must hold head indices (integers in 0..{n - 1}), got {shown(odd[0])}")
    bad = [h for h in heads if not 0 <= h < n]
    if bad or not heads:
        raise ValueError(
            f"head {shown(bad[0] if bad else heads)} is outside 0..{n - 1} (this model has {n} heads per layer)"
        )
    twice = [h for i, h in enumerate(heads) if h in heads[:i]]
    if twice:
        raise ValueError(f"heads names head {int(twice[0])} twice; name each head once")
    return [int(h) for h in heads]


def check_tokens(model: Transformer, token_ids: Sequence[int], max_len: int | None = None) -> list[int]:
    """Token ids in the vocabulary, at most ``max_len`` (default: the context) of them, whose
    dense view fits the memory limit."""
    ids = check_ids(model, token_ids, max_len)
    n, h = len(ids), model.cfg.n_heads
    limits.check_memory(f"a view of {n} x {n} scores for {h} heads", _view_bytes(h, n))
    return ids


def check_ids(model: Transformer, token_ids: Sequence[int], max_len: int | None = None) -> list[int]:
    """Token ids in the vocabulary, 1..``max_len`` (default: the context) of them; no memory check
    (labels, blocked scores: nothing of n x n)."""
    V = model.cfg.d_vocab
    ids = [int(t) for t in token_ids]
    if not ids:
        raise ValueError("no tokens given")
    bad = [t for t in ids if not 0 <= t < V]
    if bad:
        raise ValueError(f"token id {shown(bad[0])} is outside 0..{V - 1} (the vocabulary has {V} tokens)")
    top = model.cfg.n_ctx if max_len is None else max_len
    if len(ids) > top:
        raise ValueError(f"{len(ids)} tokens exceed the model context of {top}")
    return ids


MAX_SCORE_BYTES = 4 * 2**30  # S of one layer (every head, float32) may take at most this much


def _view_bytes(heads: int, n: int) -> int:
    """A view holds scores and pattern, [heads, n, n] each."""
    return 2 * heads * n * n * limits.FLOAT_BYTES


def longest_dense_view(model: Transformer) -> int:
    """The most tokens a view of ``model`` may have now: its context, cut to what the memory
    limit (:func:`check_tokens`) and one layer's scores (:data:`MAX_SCORE_BYTES`) allow. A page's
    default input length stays within it (a context of 10^6 tokens is not a default)."""
    h, budget = model.cfg.n_heads, limits.memory_limit()
    n = int(min((budget / (2 * h * limits.FLOAT_BYTES)) ** 0.5, (MAX_SCORE_BYTES / (h * limits.FLOAT_BYTES)) ** 0.5))
    while n > 1 and _view_bytes(h, n) > budget:  # the float square root may round up
        n -= 1
    return max(1, min(model.cfg.n_ctx, n))


def layer_mask(model: Transformer, layer: int, n: int) -> torch.Tensor:
    """The model's own mask of ``layer`` on ``n`` tokens, [n, n] bool, True where query i sees key
    j: causal, and within the layer's sliding window when it has one (``cfg.window``). Every
    view, attribution and long view takes the keys a query sees from here."""
    model = check_model(model, "layer_mask")
    return model.mask(n, model.cfg.window(check_layer(model, layer)))


def visible_keys(model: Transformer, layer: int, n: int, query: int) -> list[int]:
    """The key positions query ``query`` sees at ``layer`` in an input of ``n`` tokens, in order."""
    return torch.nonzero(layer_mask(model, layer, n)[query]).flatten().tolist()


def check_loaded(loaded: LoadedModel | Transformer, what: str) -> LoadedModel:
    """The :class:`LoadedModel` of ``loaded``, the one conversion at the top of every function that
    names tokens or reads the card: a LoadedModel (an ``attn_core.load`` model is one) as it is, a
    bare Transformer wrapped with an empty card (no task: token ids are its token names)."""
    if isinstance(loaded, LoadedModel):
        return loaded
    if isinstance(loaded, Transformer):
        return LoadedModel(name="transformer", model=loaded, config=loaded.cfg)
    raise TypeError(
        f"{what} takes a model (attn_core.load, a LoadedModel or a Transformer), not {type(loaded).__name__}"
    )


def check_model(model: Transformer | LoadedModel, what: str) -> Transformer:
    """The :class:`Transformer` of ``model``, the one conversion at the top of every function of
    model maths: the module itself, or a LoadedModel's (an ``attn_core.load`` model's) ``.model``."""
    if isinstance(model, LoadedModel):
        return model.model
    if isinstance(model, Transformer):
        return model
    raise TypeError(
        f"{what} takes a model (attn_core.load, a LoadedModel or a Transformer), not {type(model).__name__}"
    )


def bilinear_problem(model) -> str | None:
    """Why a score of this model (a Transformer or its ModelConfig) is not ``x B y^T`` of its
    layer's input (one clause), or None when it is: QK-norm puts a per-token gain on each side, a
    soft cap bends S (docs/maths.md)."""
    cfg = getattr(model, "cfg", model)
    if cfg.mla:
        return ("its heads are multi-head latent attention: the latent norms put a per-token gain on q and k and a "
                "rotary term is added, so S is not x B y^T")  # fmt: skip
    if cfg.qk_norm != "none":
        return f"its heads apply QK-norm ({cfg.qk_norm}), a per-token gain on q and k, so S is not x B y^T"
    if cfg.attn_softcap is not None:
        return f"its scores are soft-capped (c tanh(S / c), c = {cfg.attn_softcap:g}), so S is not x B y^T"
    return None


def check_bilinear(model: Transformer | LoadedModel, what: str) -> Transformer:
    """:func:`check_model`, refusing in one sentence a model whose scores are not bilinear in the
    layer's input (:func:`bilinear_problem`): ``what`` would not be the model's maths there."""
    model = check_model(model, what)
    problem = bilinear_problem(model)
    if problem:
        raise ValueError(f"{what} is not available for this model: {problem}")
    return model
