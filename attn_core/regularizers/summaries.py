"""Per-head summaries of attention that a run measures (telemetry while it trains, the before/after
measurement, the Dynamics page): mean normalized entropy and mean top-1 mass of each head's rows,
on data (``data_concentration``) and on the vocabulary view (``vocab_concentration``), and the
spectrum of B of every head (``head_spectra``).

The rows are summarized from Q and K in blocks of query rows (:func:`row_summaries`: one pass
over each block's scores gives both numbers), so that a measurement keeps no [batch, heads, T, T]
pattern and every layer of the forward keeps its fused attention: ``model(tokens,
cache=qk_cache(model, heads))`` keeps Q and K of the layers measured. A cache that holds patterns
instead is read densely (``metrics``), as before; the two agree to float rounding (tests). Every
summary is a tensor on the model's device, read by the caller in one copy.
"""

from __future__ import annotations

import math

import torch

from attn_core import metrics
from attn_core.bilinear import augment, has_bias, layer_form, model_form, qk_gains, queries_keys
from attn_core.bilinear.queries_keys import LayerQK
from attn_core.bilinear.views import vocab_inputs
from attn_core.hooks import Cache, act_name
from attn_core.model import Transformer
from attn_core.regularizers import rows as rw
from attn_core.regularizers.heads import Heads, all_heads, by_layer


def mean_rows(values: torch.Tensor, p_shape: torch.Size, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over the informative rows (>= 2 visible keys) of ``values`` [b, h, q] or [h, q],
    one value per head [h] (differentiable)."""
    valid = metrics.informative_rows(mask, p_shape, device=values.device).expand_as(values).to(values.dtype)
    if values.dim() == 3:
        return (values * valid).sum((0, 2)) / valid.sum((0, 2)).clamp_min(1)
    return (values * valid).sum(-1) / valid.sum(-1).clamp_min(1)


def data_rows(model: Transformer, cache: dict, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached attention pattern of a layer [b, h, T, T] and its causal mask [T, T]."""
    key = act_name("pattern", layer)
    if key not in cache:
        raise ValueError(f"the forward cache has no {key}; run the model with cache={{}} first")
    A = cache[key]
    T = A.shape[-1]
    return A, model.mask(T, model.cfg.window(layer))


def qk_cache(model: Transformer, heads: Heads | None = None) -> Cache:
    """A forward cache keeping Q and K of the layers of ``heads`` (None: every layer), and their
    pattern for a soft-capped model (whose rows are read from it: :func:`uncapped_qk`)."""
    layers = by_layer(heads or all_heads(model.cfg))
    kinds = ("q", "k", "pattern") if model.cfg.attn_softcap is not None else ("q", "k")
    return Cache(tuple(act_name(kind, l) for l in layers for kind in kinds))


def uncapped_qk(model: Transformer, cache: dict, layer: int, heads) -> LayerQK | None:
    """The layer's Q and K from the cache (``bilinear.queries_keys.layer_qk``: with each head's
    scale and learned sink logit), or None for a soft-capped model, whose rows are read from its
    pattern, or when the cache does not hold them."""
    return None if model.cfg.attn_softcap is not None else queries_keys.layer_qk(model, cache, layer, heads)


def layer_sinks(model: Transformer, layer: int, heads) -> torch.Tensor | None:
    """The learned sink logits of ``heads`` of ``layer`` (the form's, differentiable), [len(heads)];
    None for a model without learned sinks. What the row engine takes as ``sink``."""
    z = model.blocks[layer].attn.form().sink
    return None if z is None else z[list(heads)]


@torch.no_grad()
def row_summaries(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    window: int | None = 0,
    alpha: float = 1.0,
    scale: float = 1.0,
    block: int | None = None,
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalized entropy, top-1 mass) of every query row of ``scale q k^T`` ([b, h, T, w] each),
    [b, h, T] each in the reduction dtype: ``metrics.normalized_entropy`` and ``metrics.topk_mass``
    of the model's rows (softmax, or alpha-entmax) under the mask ``window`` (as
    :func:`attn_core.regularizers.rows.row_values`), from one pass over blocks of query rows with
    the registry's entropy and top-k metrics (``rows.row_metrics``). A ``sink`` logit per head is
    one more outcome of each softmax row (``rows.row_values``)."""
    rows = rw.row_metrics(
        q, k, {"entropy": 1, "topk": 1}, window=window, alpha=alpha, scale=scale, block=block, sink=sink
    )
    return rows["entropy"], 1 - rows["topk"]


@torch.no_grad()
def head_summaries(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    window: int | None = 0,
    alpha: float = 1.0,
    scale: float = 1.0,
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean normalized entropy and mean top-1 mass of each head's informative rows (at least
    ``metrics.MIN_KEYS`` visible keys) over every batch element, [h] each (:func:`row_summaries`)."""
    entropy, top1 = row_summaries(q, k, window=window, alpha=alpha, scale=scale, sink=sink)
    T = k.shape[2]
    valid = (rw.visible_counts(torch.arange(T, device=q.device), T, window, None) >= metrics.MIN_KEYS).to(entropy.dtype)
    count = (valid.sum() * q.shape[0]).clamp_min(1)
    return (entropy * valid[:, None]).sum((0, 2)) / count, (top1 * valid[:, None]).sum((0, 2)) / count


def _empty(model: Transformer) -> dict[str, torch.Tensor]:
    cfg = model.cfg
    device = model.embed.W_E.device
    return {k: torch.full((cfg.n_layers, cfg.n_heads), math.nan, device=device) for k in ("entropy", "top1")}


@torch.no_grad()
def data_concentration(model: Transformer, cache: dict, heads: Heads | None = None) -> dict[str, torch.Tensor]:
    """Per head on the cached forward: ``entropy`` (mean normalized entropy) and ``top1`` (mean
    top-1 mass) over informative rows, each [n_layers, n_heads] (NaN where not selected), on the
    model's device (read them with one copy). From the cached Q and K (:func:`qk_cache`) in
    blocks, else from cached patterns (``run_with_cache``)."""
    cfg = model.cfg
    out = _empty(model)
    for layer, hs in by_layer(heads or all_heads(cfg)).items():
        qk = uncapped_qk(model, cache, layer, hs)
        if qk is not None:
            q, scale = qk.folded()
            H, top = head_summaries(
                q, qk.k, window=cfg.window(layer), alpha=cfg.entmax_alpha, scale=scale, sink=qk.sink
            )
        else:
            A, mask = data_rows(model, cache, layer)
            A = A[:, hs].float()
            H = mean_rows(metrics.normalized_entropy(A, mask), A.shape, mask)
            top = mean_rows(metrics.topk_mass(A, 1, mask), A.shape, mask)
        out["entropy"][layer, hs] = H.to(out["entropy"].dtype)
        out["top1"][layer, hs] = top.to(out["top1"].dtype)
    return out


def vocab_qk(model: Transformer, layer: int, heads) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and K of the vocabulary view of ``heads`` of ``layer``, [1, h, V, w] each: its scores
    ``q k^T`` are ``bilinear.vocab_scores`` (with the query/key biases when the model has them)."""
    aug = has_bias(model)
    x0 = vocab_inputs(model, layer)
    x = augment(x0) if aug else x0
    form = layer_form(model, layer, aug)[list(heads)]
    if form.is_dense:  # merged heads: S = x W_QK x^T
        return (x @ form.dense)[None], x.expand(len(heads), *x.shape)[None]
    q, k = x @ form.left, x @ form.right
    if model.cfg.qk_norm != "none":  # QK-norm's per-token gains, one per row of q and of k
        g_q, g_k = qk_gains(model, layer, x0)
        q, k = q * g_q[list(heads)][..., None], k * g_k[list(heads)][..., None]
    return q[None], k[None]


@torch.no_grad()
def vocab_concentration(model: Transformer, heads: Heads | None = None) -> dict[str, torch.Tensor]:
    """Per head on the vocabulary view: ``entropy`` and ``top1``, [n_layers, n_heads], on the
    model's device; from the view's Q and K in blocks of rows (no V x V view per head is kept).
    NaN for a soft-capped model (the cap is not in these Q and K); a learned sink is one more
    outcome of every row, as in the model."""
    cfg = model.cfg
    out = _empty(model)
    if cfg.attn_softcap is not None:
        return out
    for layer, hs in by_layer(heads or all_heads(cfg)).items():
        q, k = vocab_qk(model, layer, hs)
        sink = layer_sinks(model, layer, hs)
        sink = None if sink is None else sink.float()
        H, top = head_summaries(q.float(), k.float(), window=None, alpha=cfg.entmax_alpha, sink=sink)
        out["entropy"][layer, hs] = H
        out["top1"][layer, hs] = top
    return out


@torch.no_grad()
def head_spectra(model: Transformer) -> dict[str, torch.Tensor]:
    """Singular values of B of every head [n_layers, n_heads, r] (descending) and its stable rank
    [n_layers, n_heads], on the CPU (one copy from the device)."""
    form = model_form(model)
    sigma = form.singular_values.float()
    both = torch.cat([sigma, form.stable_rank.float()[..., None]], -1).cpu()
    return {"singular_values": both[..., :-1], "stable_rank": both[..., -1]}
