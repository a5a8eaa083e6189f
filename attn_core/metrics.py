"""Concentration of attention rows: how few keys a query looks at.

Every function takes **probabilities** ``p`` of shape ``[..., n]`` (rows of an attention
pattern, or ``row_probs(scores)`` for rows of pre-softmax scores) and an optional boolean
``mask`` of the same shape, True where a key is visible. Masked entries are ignored and each
row is measured on its own visible keys: a causal row i has n_i = i + 1 keys, so entropy / log n
uses log n_i. Every function is differentiable where the maths allows (attn_core.regularizers
reuses them; docs/maths.md has the list); all return ``[...]``, one value per row.

    entropy            H(p) = -sum p log p                  0 (one-hot) .. log n (uniform)
    normalized_entropy H(p) / log n                          0 .. 1        (n = 1: 0)
    hoyer              (sqrt n - |p|_1/|p|_2) / (sqrt n - 1) 0 (uniform) .. 1 (one-hot; n = 1: 1)
    topk_mass          sum of the k largest p                k/n .. 1
    participation_ratio (sum p)^2 / sum p^2                  1 (one-hot) .. n (uniform)
    gini               Gini coefficient of p                 0 (uniform) .. 1 - 1/n (one-hot)
    first_key_mass     p_0, the weight on the first key      0 .. 1        (an attention sink's)

Without chosen keys (an attention sink's column, ``bilinear.sinks``): :func:`drop_keys` removes
them from the mask and renormalizes each row over the keys left, and ``concentration(...,
exclude=keys)`` measures those rows; a row with no mass left is masked out entirely.
"""

from __future__ import annotations

import math

import torch

METRICS = ("entropy", "normalized_entropy", "hoyer", "topk_mass", "participation_ratio", "gini")
# Rows with fewer visible keys than this say nothing about concentration (a causal first row
# always attends to itself); summaries skip them.
MIN_KEYS = 2


def _mask(p: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return torch.ones_like(p, dtype=torch.bool)
    return mask.to(torch.bool).expand_as(p)


def _zeroed(p: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    m = _mask(p, mask)
    return p.masked_fill(~m, 0.0), m


def n_visible(p: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Number of visible keys per row, as p's dtype."""
    return _mask(p, mask).sum(-1).to(p.dtype)


def row_probs(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax of score rows over their visible keys (masked keys get probability 0)."""
    m = _mask(scores, mask)
    return torch.softmax(scores.masked_fill(~m, float("-inf")), dim=-1).masked_fill(~m, 0.0)


def entropy(p: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Shannon entropy in nats, with 0 log 0 = 0 (and a finite gradient there); never below 0
    (an entry rounded just above 1 would give a term just below 0)."""
    p, _ = _zeroed(p, mask)
    safe = torch.where(p > 0, p, torch.ones_like(p))
    return (-(p * safe.log()).sum(-1)).clamp_min(0)


def normalized_entropy(p: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy / log(n_visible); a row with one visible key counts as fully concentrated (0)."""
    n = n_visible(p, mask)
    log_n = n.clamp_min(2).log()
    return torch.where(n > 1, entropy(p, mask) / log_n, torch.zeros_like(n))


def hoyer(p: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-12) -> torch.Tensor:
    """Hoyer's sparsity (sqrt n - |p|_1 / |p|_2) / (sqrt n - 1): scale-free, 0 for a uniform row,
    1 for a one-hot row (and for a row with one visible key)."""
    p, _ = _zeroed(p, mask)
    n = n_visible(p, mask)
    l1 = p.abs().sum(-1)
    l2 = p.pow(2).sum(-1).clamp_min(eps * eps).sqrt()
    root = n.sqrt()
    return torch.where(n > 1, (root - l1 / l2) / (root - 1).clamp_min(eps), torch.ones_like(n))


def topk_mass(p: torch.Tensor, k: int = 1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mass of the k largest visible entries (all of it when a row has <= k visible keys)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    p, _ = _zeroed(p, mask)
    k = min(k, p.shape[-1])
    return p.topk(k, dim=-1).values.sum(-1)


def first_key_mass(p: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The weight on the first key (position 0, where attention sinks form), 0 where hidden."""
    p, _ = _zeroed(p, mask)
    return p[..., 0]


def participation_ratio(p: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-12) -> torch.Tensor:
    """(sum p)^2 / sum p^2, i.e. 1 / sum p^2 for probabilities: the effective number of keys."""
    p, _ = _zeroed(p, mask)
    return p.sum(-1).pow(2) / p.pow(2).sum(-1).clamp_min(eps)


def gini(p: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-12) -> torch.Tensor:
    """Gini coefficient over the visible keys, sum_i (2i - n - 1) p_(i) / (n sum p) with p_(i)
    ascending: 0 for a uniform row, 1 - 1/n for a one-hot row."""
    p, m = _zeroed(p, mask)
    n = m.sum(-1, keepdim=True).to(p.dtype)
    sorted_p = p.sort(dim=-1).values
    # Masked entries are zeros sorted first; ranks among the visible keys start after them,
    # and the zeros contribute nothing whatever their rank.
    i = torch.arange(1, p.shape[-1] + 1, dtype=p.dtype, device=p.device) - (p.shape[-1] - n)
    num = ((2 * i - n - 1) * sorted_p).sum(-1)
    return num / (n.squeeze(-1) * p.sum(-1)).clamp_min(eps)


def drop_keys(p: torch.Tensor, mask: torch.Tensor | None, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows of ``p`` renormalized over their visible keys that are not in ``keys``, the mask
    without ``keys``). ``keys`` is a bool tensor that broadcasts against ``p`` (True: drop the
    key; [nk] for the same keys in every row, [..., 1, nk] per head). A row whose remaining mass
    is zero (every visible key dropped, or all its mass on them) gets no visible key at all, so
    summaries skip it (:func:`informative_rows`)."""
    m = _mask(p, mask) & ~keys.to(torch.bool)
    kept = p.masked_fill(~m, 0.0)
    total = kept.sum(-1, keepdim=True)
    m = m & (total > 0)
    return (kept / total.clamp_min(torch.finfo(p.dtype).tiny)).masked_fill(~m, 0.0), m


def concentration(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    k: int = 1,
    from_scores: bool = False,
    exclude: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Every metric of every row: ``{name: [...]}``. ``x`` holds probabilities, or pre-softmax
    scores when ``from_scores`` (a masked softmax is taken first). ``exclude`` (bool, True for a
    key to leave out, e.g. a sink) measures the rows renormalized without those keys
    (:func:`drop_keys`)."""
    p = row_probs(x, mask) if from_scores else x
    if exclude is not None:
        p, mask = drop_keys(p, mask, exclude)
    return {
        "entropy": entropy(p, mask),
        "normalized_entropy": normalized_entropy(p, mask),
        "hoyer": hoyer(p, mask),
        "topk_mass": topk_mass(p, k, mask),
        "participation_ratio": participation_ratio(p, mask),
        "gini": gini(p, mask),
    }


def summarize(values: torch.Tensor, valid: torch.Tensor | None = None, dim: int = -1) -> dict[str, torch.Tensor]:
    """Mean, min and max over ``dim`` of per-row values, counting only rows where ``valid``.
    A slice with no valid row gives NaN."""
    if valid is None:
        valid = torch.ones_like(values, dtype=torch.bool)
    valid = valid.expand_as(values)
    count = valid.sum(dim).to(values.dtype)
    nan = torch.full_like(count, math.nan)
    total = values.masked_fill(~valid, 0).sum(dim)
    mean = torch.where(count > 0, total / count.clamp_min(1), nan)
    lo = values.masked_fill(~valid, math.inf).amin(dim)
    hi = values.masked_fill(~valid, -math.inf).amax(dim)
    return {"mean": mean, "min": torch.where(count > 0, lo, nan), "max": torch.where(count > 0, hi, nan)}


def informative_rows(
    mask: torch.Tensor | None, shape: torch.Size, min_keys: int = MIN_KEYS, device: torch.device | None = None
) -> torch.Tensor:
    """Rows with at least ``min_keys`` visible keys, ``[...]`` for a mask of ``shape``, on the
    mask's device; without a mask (every key visible) on ``device``, which a caller whose rows
    live on a GPU must give (the rows' device: the mask multiplies them)."""
    if mask is None:
        return torch.full(shape[:-1], shape[-1] >= min_keys, dtype=torch.bool, device=device)
    return mask.expand(shape).sum(-1) >= min_keys
