"""One interface for every method (factors, linear attention, approximate patterns) and relative
positional encoding by FFT (Luo et al. 2021); see the package docstring (:mod:`attn_core.kernels`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attn_core import limits
from attn_core.kernels.features import (
    OPTIONS,
    _check_method,
    _check_qkv,
    _scale_stabilize,
    favor_features,
    maclaurin_draw,
    maclaurin_features,
    nystrom_factors,
    nystromformer_factors,
    orthogonal_gaussian,
    schoenbat_postscale,
    schoenbat_prenorm,
)

# --- one interface for every method --------------------------------------------------------------


def factors(
    q: torch.Tensor, k: torch.Tensor, method: str = "favor", features: int = 256, seed: int = 0, **options
) -> tuple[torch.Tensor, torch.Tensor]:
    """(phi_q, phi_k), [..., n, r] each, with K_hat[i, j] = c_i phi_q[i] . phi_k[j] ~ exp(q_i . k_j).

    Options: favor ``orthogonal=True``; maclaurin/schoenbat ``max_degree=20``;
    nystrom ``pinv="exact"|"newton"``, ``iters=6``, ``ridge=0``; nystromformer ``pinv``, ``iters``.
    The papers' pseudo-inverse is ``pinv="newton", iters=6``; the default is the exact one because
    six iterations are far from converged on the ill-conditioned kernels of trained heads."""
    _check_method(method)
    _check_qkv(q, k)
    features = limits.check_count("features", features, hi=limits.MAX_FEATURES)
    rows = q.numel() // max(q.shape[-1], 1) + k.numel() // max(k.shape[-1], 1)
    limits.check_memory(
        f"{method} with {features} features on {q.shape[-2]} tokens",
        limits.FLOAT_BYTES * (2 * rows * features + features * (q.shape[-1] + features)),
    )
    unknown = sorted(set(options) - set(OPTIONS[method]))
    if unknown:
        raise ValueError(f"{method} takes no option {unknown[0]!r}; its options are {', '.join(OPTIONS[method])}")
    d = q.shape[-1]
    if method == "favor":
        W = orthogonal_gaussian(features, d, seed, dtype=q.dtype, device=q.device, **options)
        return favor_features(q, W, "row"), favor_features(k, W, "global")
    if method in ("maclaurin", "schoenbat"):
        if method == "schoenbat":
            q, k = schoenbat_prenorm(q), schoenbat_prenorm(k)
        draw = maclaurin_draw(features, d, seed, dtype=q.dtype, device=q.device, **options)
        # Only the query side is rescaled (per row, so it cancels): a key-side constant would
        # have to be global, and with signed features its rounding would reach earlier outputs
        # through cancelling sums; unscaled keys keep the causal form exactly causal.
        return _scale_stabilize(maclaurin_features(q, draw)), maclaurin_features(k, draw)
    if method == "nystrom":
        return nystrom_factors(q, k, features, seed, **options)
    return nystromformer_factors(q, k, features, **options)


def _safe_denominator(den: torch.Tensor) -> torch.Tensor:
    # Signed estimators (Maclaurin, Nystrom) can sum to ~0; keep the division finite.
    tiny = torch.finfo(den.dtype).tiny
    return torch.where(den.abs() < tiny, torch.full_like(den, tiny), den)


def linear_attention(
    phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, causal: bool = False, chunk: int = 128
) -> torch.Tensor:
    """sum_j (phi_q[i] . phi_k[j]) v_j / sum_j phi_q[i] . phi_k[j] in O(n r d).

    Causal: the sequence is cut into chunks; each chunk sees the exclusive prefix sums of the
    earlier chunks' phi_k^T v (one cumsum over chunk totals, not an [n, r, d] cumsum) plus its own
    keys through a small masked [chunk, chunk] product."""
    if not causal:
        num = phi_q @ (phi_k.transpose(-1, -2) @ v)
        den = phi_q @ phi_k.sum(-2).unsqueeze(-1)
        return num / _safe_denominator(den)
    n = phi_q.shape[-2]
    pad = (-n) % chunk
    if pad:  # zero rows add nothing to the sums
        phi_q, phi_k, v = (F.pad(t, (0, 0, 0, pad)) for t in (phi_q, phi_k, v))
    qc, kc, vc = (t.unflatten(-2, (-1, chunk)) for t in (phi_q, phi_k, v))  # [..., c, chunk, r|d]
    kv = kc.transpose(-1, -2) @ vc  # [..., c, r, d]
    z = kc.sum(-2, keepdim=True).transpose(-1, -2)  # [..., c, r, 1]
    # Exclusive prefix sums by shifting (not cumsum - self, whose rounding would carry the
    # chunk's own, partly future, keys into its past).
    kv_before, z_before = (F.pad(t.cumsum(-3), (0, 0, 0, 0, 1, 0))[..., :-1, :, :] for t in (kv, z))
    mask = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).tril()
    within = (qc @ kc.transpose(-1, -2)).masked_fill(~mask, 0.0)  # [..., c, chunk, chunk]
    num = qc @ kv_before + within @ vc
    den = qc @ z_before + within.sum(-1, keepdim=True)
    return (num / _safe_denominator(den)).flatten(-3, -2)[..., :n, :]


def factor_pattern(phi_q: torch.Tensor, phi_k: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """The approximate pattern: rows of phi_q phi_k^T (causally masked) normalised to sum 1,
    [..., n, n]. O(n^2): for analysis, not for speed."""
    kernel = phi_q @ phi_k.transpose(-1, -2)
    if causal:
        n = kernel.shape[-1]
        kernel = kernel.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=kernel.device).tril(), 0.0)
    return kernel / _safe_denominator(kernel.sum(-1, keepdim=True))


def _split_postscale(method: str, options: dict) -> tuple[dict, dict]:
    post = {key: options.pop(key) for key in ("gamma", "beta") if key in options}
    if post and method != "schoenbat":
        raise ValueError("gamma/beta (output rescaling) only apply to method 'schoenbat'")
    return options, post


def approx_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    method: str = "favor",
    features: int = 256,
    seed: int = 0,
    causal: bool = False,
    **options,
) -> torch.Tensor:
    """The method's estimate of softmax(q k^T) v, [..., n, d_v], in O(n r d).
    ``schoenbat`` also takes ``gamma``/``beta`` for its output rescaling."""
    _check_qkv(q, k, v)
    options, post = _split_postscale(method, dict(options))
    out = linear_attention(*factors(q, k, method, features, seed, **options), v, causal)
    return schoenbat_postscale(out, **post) if method == "schoenbat" else out


def approx_pattern(
    q: torch.Tensor,
    k: torch.Tensor,
    method: str = "favor",
    features: int = 256,
    seed: int = 0,
    causal: bool = False,
    **options,
) -> torch.Tensor:
    """The method's estimate of softmax(q k^T), [..., n, n] (rows sum to 1, entries may be
    negative for the signed methods)."""
    options, _ = _split_postscale(method, dict(options))
    return factor_pattern(*factors(q, k, method, features, seed, **options), causal=causal)


def kernel_estimate(
    q: torch.Tensor, k: torch.Tensor, method: str = "favor", features: int = 256, seed: int = 0, **options
) -> torch.Tensor:
    """The raw (unstabilised, unnormalised) random-feature estimate of exp(q k^T), [..., n_q, n_k],
    for ``favor`` and ``maclaurin``, whose expectation over seeds is the kernel."""
    d = q.shape[-1]
    if method == "favor":
        W = orthogonal_gaussian(features, d, seed, dtype=q.dtype, device=q.device, **options)
        phi_q, phi_k = favor_features(q, W), favor_features(k, W)
    elif method == "maclaurin":
        draw = maclaurin_draw(features, d, seed, dtype=q.dtype, device=q.device, **options)
        phi_q, phi_k = maclaurin_features(q, draw), maclaurin_features(k, draw)
    else:
        raise ValueError(f"kernel_estimate is defined for 'favor' and 'maclaurin', got {method!r}")
    return phi_q @ phi_k.transpose(-1, -2)


# --- relative positional encoding by FFT ---------------------------------------------------------


def toeplitz_dense(t: torch.Tensor) -> torch.Tensor:
    """The Toeplitz matrix T[i, j] = t[j - i + n - 1] from its 2n - 1 diagonals, [..., n, n]."""
    n = (t.shape[-1] + 1) // 2
    offsets = torch.arange(n, device=t.device)
    return t[..., offsets[None, :] - offsets[:, None] + n - 1]


def toeplitz_matmul(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """T x for the Toeplitz T[i, j] = t[j - i + n - 1] in O(n log n): T sits in the top-left
    corner of a circulant of size L >= 2n - 1 whose first column is
    [t_0, t_-1, ..., t_-(n-1), 0..., t_(n-1), ..., t_1] (t_s = the diagonal j - i = s), and a
    circulant is diagonalised by the FFT. t: [..., 2n - 1]; x: [..., n, c] -> [..., n, c]."""
    n = x.shape[-2]
    if t.shape[-1] != 2 * n - 1:
        raise ValueError(f"need 2n - 1 = {2 * n - 1} diagonals for n = {n}, got {t.shape[-1]}")
    L = 2 * n
    column = torch.cat([t[..., :n].flip(-1), torch.zeros_like(t[..., :1]), t[..., n:].flip(-1)], dim=-1)
    spectrum = torch.fft.rfft(column, n=L, dim=-1).unsqueeze(-1)  # [..., L/2 + 1, 1]
    return torch.fft.irfft(spectrum * torch.fft.rfft(x, n=L, dim=-2), n=L, dim=-2)[..., :n, :]


def rpe_toeplitz(b: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """exp(b) over the 2n - 1 offsets j - i (b[..., s + n - 1] is the bias of offset s), shifted
    by max(b) (a constant that cancels) and with the future offsets zeroed when causal."""
    n = (b.shape[-1] + 1) // 2
    if causal:
        b = torch.cat([b[..., :n], torch.full_like(b[..., n:], float("-inf"))], dim=-1)
    return torch.exp(b - b.amax(dim=-1, keepdim=True))


def rpe_linear_attention(
    phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """sum_j T[i, j] (phi_q[i] . phi_k[j]) v_j / sum_j T[i, j] phi_q[i] . phi_k[j] with
    T = exp(B): the Toeplitz product of [phi_k (x) v | phi_k] by FFT, then one contraction with
    phi_q. O(n log n r d) time, O(n r d) memory."""
    r, dv = phi_k.shape[-1], v.shape[-1]
    keyed = torch.cat([(phi_k.unsqueeze(-1) * v.unsqueeze(-2)).flatten(-2), phi_k], dim=-1)
    mixed = toeplitz_matmul(rpe_toeplitz(b, causal), keyed)  # [..., n, r (dv + 1)]
    num = (phi_q.unsqueeze(-1) * mixed[..., : r * dv].unflatten(-1, (r, dv))).sum(-2)
    den = (phi_q * mixed[..., r * dv :]).sum(-1, keepdim=True)
    return num / _safe_denominator(den)


def rpe_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    b: torch.Tensor,
    method: str = "favor",
    features: int = 256,
    seed: int = 0,
    causal: bool = False,
    **options,
) -> torch.Tensor:
    """The method's estimate of softmax(q k^T + B) v with B[i, j] = b[j - i + n - 1]."""
    _check_qkv(q, k, v)
    options, post = _split_postscale(method, dict(options))
    out = rpe_linear_attention(*factors(q, k, method, features, seed, **options), v, b, causal)
    return schoenbat_postscale(out, **post) if method == "schoenbat" else out


def exact_rpe_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """softmax(q k^T + B) v, dense."""
    scores = q @ k.transpose(-1, -2) + toeplitz_dense(b)
    if causal:
        n = scores.shape[-1]
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
