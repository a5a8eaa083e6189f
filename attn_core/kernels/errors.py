"""Error analysis on a model's heads: a head's q, k, v from its hook points, errors of every
method against exact softmax as the number of features grows, and their summaries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from attn_core import limits
from attn_core.bilinear.checks import check_heads, check_layer
from attn_core.bilinear.heads import layer_form
from attn_core.hooks import act_name
from attn_core.kernels.attention import approx_attention, approx_pattern
from attn_core.kernels.features import FEATURES, METHODS, _check_method, _check_qkv, _positive_int, exact_pattern
from attn_core.model import Transformer

# --- error analysis on a model's heads -------------------------------------------------------------


@torch.no_grad()
def head_qkv(
    model: Transformer, tokens: torch.Tensor, layer: int, head: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V of one head read from the model's hook points (``act_name("q", l)``, ...), [batch, pos, d]
    each, with the score scale folded into q so that softmax(q k^T) (causal) is exactly
    ``act_name("pattern", l)`` for a softmax model (an entmax model's pattern is not a softmax;
    q k^T are still its scores). Grown heads are cut to their own d_qk columns. Merged heads
    (W_QK = B): q = X B, k = X."""
    check_layer(model, layer)
    check_heads(model, head)
    if tokens.dim() == 1:
        tokens = tokens[None]
    window = model.cfg.window(layer)
    if window and tokens.shape[-1] > window:  # the kernels are causal over the whole prefix
        raise ValueError(
            f"layer {layer} attends within a sliding window of {window} keys, which the kernel "
            f"approximations do not model; use at most {window} tokens or a layer without a window"
        )
    names = [act_name(kind, layer) for kind in ("q", "k", "v")]
    _, cache = model.run_with_cache(tokens, names_filter=names)
    q, k, v = (cache[name][:, head] for name in names)  # [batch, pos, w or d_model or d_head]
    if model.cfg.qk == "merged":
        return q, k.contiguous(), v
    if model.cfg.mla:  # MLA: the whole width (no-position and rotary parts), the head's own scale
        return q * float(model.blocks[layer].attn.form(head).head_scales()), k, v
    d_qk = model.cfg.head_d_qk(layer, head)  # W_Q/W_K are stored padded to the layer's widest head
    return q[..., :d_qk] * d_qk**-0.5, k[..., :d_qk], v


def head_spectrum(model: Transformer, layer: int, head: int) -> dict:
    """Spectral norm, Frobenius norm and stable rank |B|_F^2 / |B|_2^2 of the head's bilinear form
    B = W_Q W_K^T / sqrt(d_qk) (W_QK for a merged head), from :class:`attn_core.bilinear.QKForm`."""
    check_heads(model, head)
    with torch.no_grad():
        form = layer_form(model, layer)[head]
        return {
            "spectral_norm": float(form.spectral_norm),
            "frobenius_norm": float(form.frobenius_norm),
            "stable_rank": float(form.stable_rank),
        }


def balance_qk(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q s, k / s) with s = (mean |k|^2 / mean |q|^2)^(1/4) per sequence (over the last two dims):
    q k^T, hence the pattern, is unchanged, but FAVOR+'s variance (~ exp|q + k|^2) and the Gaussian
    kernel's dynamic range (e^{|k|^2/2}) depend on how the scale is split. head_qkv folds the whole
    1/sqrt(d_qk) into q, leaving |k| several times |q| on trained heads; Performer splits it as
    d^-1/4 on each side. Maclaurin features are invariant to this."""
    ratio = (k * k).sum(-1).mean(-1) / (q * q).sum(-1).mean(-1).clamp_min(torch.finfo(q.dtype).tiny)
    s = ratio.clamp_min(torch.finfo(q.dtype).tiny) ** 0.25
    return q * s[..., None, None], k / s[..., None, None]


def attention_errors(
    out: torch.Tensor, out_hat: torch.Tensor, p: torch.Tensor, p_hat: torch.Tensor, eps: float = 1e-12
) -> dict:
    """rel_error = |out_hat - out|_F / |out|_F over everything; tv = mean over rows of
    1/2 sum_j |p_hat - p|; kl = mean over rows of KL(p || p_hat), with p_hat clipped at ``eps``
    (signed estimators give negative entries) and renormalised."""
    rel = ((out_hat - out).norm() / out.norm().clamp_min(eps)).item()
    tv = (0.5 * (p_hat - p).abs().sum(-1)).mean().item()
    q = p_hat.clamp_min(eps)
    q = q / q.sum(-1, keepdim=True)
    kl = torch.where(p > 0, p * (torch.log(p.clamp_min(eps)) - torch.log(q)), torch.zeros_like(p))
    return {"rel_error": rel, "tv": tv, "kl": kl.sum(-1).mean().item()}


ERROR_COLUMNS = ["method", "features", "seed", "rel_error", "tv", "kl"]


@torch.no_grad()
def error_curve(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    methods: Sequence[str] = METHODS,
    features: Sequence[int] = FEATURES,
    seeds: Iterable[int] = range(5),
    causal: bool = True,
    balance: bool = True,
    dtype: torch.dtype | None = torch.float64,
    **options,
):
    """Errors of each method against exact softmax as the number of features grows:
    a DataFrame with columns method, features, seed, rel_error, tv, kl (one row per run).
    q, k are first rebalanced by :func:`balance_qk` (unless ``balance=False``), as a Performer's
    weights would be, and everything is computed in ``dtype`` (float64 by default) so that the
    curve shows the approximation, not float32 rounding. ``options`` go to every method."""
    import pandas as pd

    for method in methods:
        _check_method(method)
    _check_qkv(q, k, v)
    features = [_positive_int(m, "features") for m in features]
    seeds = list(seeds)
    if not features:
        raise ValueError("need at least one feature count")
    if not seeds:
        raise ValueError("need at least one seed")
    if dtype is not None:
        q, k, v = (t.to(dtype) for t in (q, k, v))
    if balance:
        q, k = balance_qk(q, k)
    p = exact_pattern(q, k, causal)
    out = p @ v
    rows = []
    for method in methods:
        for m in features:
            for seed in seeds:
                out_hat = approx_attention(q, k, v, method, m, seed, causal, **options)
                p_hat = approx_pattern(q, k, method, m, seed, causal, **options)
                rows.append(
                    {
                        "method": method,
                        "features": int(m),
                        "seed": int(seed),
                        **attention_errors(out, out_hat, p, p_hat),
                    }
                )
    return pd.DataFrame(rows, columns=ERROR_COLUMNS)


def error_summary(df):
    """Mean and standard deviation (over seeds) of each error per method and feature count:
    columns method, features, n_seeds, rel_error_mean, rel_error_std, tv_mean, tv_std, kl_mean, kl_std."""
    grouped = df.groupby(["method", "features"], sort=False)
    summary = grouped[["rel_error", "tv", "kl"]].agg(["mean", "std"])
    summary.columns = [f"{metric}_{stat}" for metric, stat in summary.columns]
    summary = summary.fillna(0.0)  # std of a single seed
    summary.insert(0, "n_seeds", grouped.size())
    return summary.reset_index()


@torch.no_grad()
def head_patterns(
    model: Transformer,
    tokens: torch.Tensor,
    layer: int,
    head: int,
    method: str = "favor",
    features: int = 64,
    seed: int = 0,
    causal: bool = True,
    balance: bool = True,
    **options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact, approximate) patterns of one head, [batch, n, n] each, computed as
    :func:`error_curve` does (balanced q, k in float64), for side-by-side heatmaps."""
    q, k, _ = (t.double() for t in head_qkv(model, tokens, layer, head))
    if balance:
        q, k = balance_qk(q, k)
    return exact_pattern(q, k, causal), approx_pattern(q, k, method, features, seed, causal, **options)


def head_error(
    model: Transformer,
    tokens: torch.Tensor,
    layer: int,
    head: int,
    method: str = "favor",
    features: int = 64,
    seeds: int = 5,
    causal: bool = True,
    balance: bool = True,
    **options,
) -> dict:
    """One method at one feature count on one head, as a JSON-ready dict: method, features, seeds,
    rel_error_mean/std, tv_mean/std, kl_mean/std, and the head's spectrum and q/k norms (FAVOR+'s
    variance grows like exp(|q + k|^2), Maclaurin's with |q| |k|)."""
    limits.check_count("features", features, hi=limits.MAX_FEATURES)
    n_seq, n = tokens.shape[0], tokens.shape[-1]
    limits.check_memory(
        f"{method} with {features} features on {n_seq} sequences of {n} tokens",
        limits.FLOAT_BYTES * (n_seq * n * (4 * features + 4 * n) + 4 * features**2),
    )
    q, k, v = head_qkv(model, tokens, layer, head)
    row = error_summary(error_curve(q, k, v, (method,), (features,), range(seeds), causal, balance, **options)).iloc[0]
    stats = {key: float(row[key]) for key in row.index if key.endswith(("_mean", "_std"))}
    return {
        "method": method,
        "features": int(features),
        "seeds": int(seeds),
        "layer": layer,
        "head": head,
        "causal": causal,
        **stats,
        **head_spectrum(model, layer, head),
        "q_norm_max": q.norm(dim=-1).max().item(),
        "k_norm_max": k.norm(dim=-1).max().item(),
    }
