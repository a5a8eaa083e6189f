"""Kernelized approximations of one attention head (seed 002).

One convention everywhere: ``q``, ``k``, ``v`` are ``[..., n, d]`` (any leading batch/head dims) and
the head's pattern is ``softmax(q k^T)`` -- the 1/sqrt(d_qk) is already folded into ``q``
(:func:`head_qkv` does this), so every method estimates the kernel ``exp(q . k)``.

Each method writes its estimate of the kernel matrix in factored form,
``K_hat[i, j] ~ c_i * phi_q[i] . phi_k[j]`` with ``c_i > 0`` a per-query constant (it cancels when a
row is normalised, which is what lets the stabilizers below subtract maxima), so

    attention:  out_i = sum_j (phi_q[i] . phi_k[j]) v_j / sum_j phi_q[i] . phi_k[j]

costs O(n r d) by associativity (:func:`linear_attention`), causal by prefix sums.

Methods (``METHODS``):

- ``favor``: FAVOR+ positive orthogonal random features (Choromanski et al. 2021),
  ``phi(x) = m^-1/2 exp(W x - |x|^2/2)``; unbiased for ``exp(q . k)``.
- ``maclaurin``: random Maclaurin features (Kar & Karnick 2012) as used by SchoenbAt: degree
  ``N >= 1`` drawn with ``P(N) ~ 2^-(N+1)``, feature ``sqrt(a_N / P(N)) prod_{i<=N} <w_i, x>`` with
  Rademacher ``w_i``, ``a_N = 1/N!``, plus the exact constant term; unbiased for the Maclaurin series
  of ``exp`` truncated at ``max_degree``.
- ``schoenbat``: the same features after SchoenbAt's pre-normalisation (centre, standardise,
  unit norm, times d^-1/4) and with its output rescaling ``gamma * sign(o) |o|^beta``. The
  pre-normalisation changes the kernel (it is a different attention), so against the head's own
  softmax its error does not vanish as m grows. Two bugs of the reference code are not carried
  over: its PostSBN reads ``out`` before assigning it (and ``out ** beta`` is NaN for negative
  outputs, hence the sign-preserving power here), and its linear attention clamps the
  denominator at 1.0, which biases every row whose kernel sum is below 1.
- ``nystrom``: Skyformer's Nystrom approximation of the Gaussian kernel
  ``G(q, k) = exp(-|q - k|^2 / 2)`` on the joint point set ``[Q; K]`` with uniformly sampled
  landmarks and a pseudo-inverse (exact, or by Newton iterations as in the papers);
  ``exp(q . k) = e^{|q|^2/2} G(q, k) e^{|k|^2/2}`` turns it back into softmax attention. Exact when
  the landmarks are all 2n points (in exact arithmetic: for far-apart points G is numerically
  singular and the pseudo-inverse drops what it cannot resolve).
- ``nystromformer``: Nystromformer's segment-means landmarks (deterministic) and its product
  ``softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T)``. Exact when features >= n (same caveat).

Causal forms: ``favor``, ``maclaurin`` and ``schoenbat`` never look ahead (output i depends on
keys/values 0..i only). The Nystrom methods build their landmarks from the whole sequence; with
``causal=True`` their kernel estimate is masked causally, which approximates a causal head's
pattern for analysis but is not an autoregressive model.

Relative positional encoding (Luo et al. 2021): ``softmax(q k^T + B)`` with ``B[i, j] = b[j - i]``
is kernelized as ``(phi_q phi_k^T) * T`` with the Toeplitz ``T = exp(B)``; ``T`` is applied to the
key-side sums in O(n log n) by FFT through a circulant embedding (:func:`toeplitz_matmul`).

Every random draw comes from a ``torch.Generator`` seeded by ``seed`` on the CPU, so a method is a
deterministic function of (inputs, features, seed) on any device.
"""
from __future__ import annotations

import gc
import json
import math
import numbers
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

import torch
import torch.nn.functional as F
from attn_core.hooks import act_name

METHODS = ("favor", "maclaurin", "schoenbat", "nystrom", "nystromformer")
CAUSAL_METHODS = ("favor", "maclaurin", "schoenbat")  # prefix-sum forms that never look ahead
FEATURES = (8, 16, 32, 64, 128, 256, 512)
BENCH_METHODS = ("favor", "maclaurin", "nystrom", "nystromformer")  # schoenbat costs what maclaurin does
# Keyword options each method takes (schoenbat also takes gamma, beta: its output rescaling).
OPTIONS = {"favor": ("orthogonal",), "maclaurin": ("max_degree",), "schoenbat": ("max_degree",),
           "nystrom": ("pinv", "iters", "ridge"), "nystromformer": ("pinv", "iters")}


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(int(seed))


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: Optional[torch.Tensor] = None) -> None:
    if q.dim() < 2 or q.shape[-1] != k.shape[-1] or q.shape[-2] != k.shape[-2] or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"q and k must both be [..., n, d] with the same shape, got {list(q.shape)} and {list(k.shape)}")
    if v is not None and (v.shape[:-1] != k.shape[:-1]):
        raise ValueError(f"v must be [..., n, d_v] with the n and leading dims of k, got {list(v.shape)} for k {list(k.shape)}")
    if q.shape[-2] < 1 or q.shape[-1] < 1:
        raise ValueError(f"empty q: {list(q.shape)}")


# --- exact attention ---------------------------------------------------------------------------

def exact_pattern(q: torch.Tensor, k: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """softmax(q k^T) with an optional causal mask, [..., n, n]."""
    scores = q @ k.transpose(-1, -2)
    if causal:
        n = scores.shape[-1]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """softmax(q k^T) v through torch's fused scaled_dot_product_attention (the fast baseline)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0)


# --- FAVOR+ ------------------------------------------------------------------------------------

def orthogonal_gaussian(m: int, d: int, seed: int = 0, *, orthogonal: bool = True,
                        dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """``m`` rows w_i, each marginally N(0, I_d), [m, d]. With ``orthogonal`` the rows come in
    blocks of ``d`` mutually orthogonal directions (Haar: QR with the sign of diag(R) fixed),
    each scaled by an independent chi_d norm, so the estimator stays unbiased."""
    g = _generator(seed)
    if not orthogonal:
        return torch.randn(m, d, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    blocks = []
    for _ in range(math.ceil(m / d)):
        Q, R = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
        blocks.append((Q * torch.sign(torch.diagonal(R))).T)
    directions = torch.cat(blocks)[:m]
    norms = torch.randn(m, d, generator=g, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (directions * norms).to(dtype=dtype, device=device)


def favor_features(x: torch.Tensor, W: torch.Tensor, stabilizer: str = "none") -> torch.Tensor:
    """phi(x) = m^-1/2 exp(W x - |x|^2/2), [..., n, m]; E[phi(x) . phi(y)] = exp(x . y).

    ``stabilizer`` subtracts a maximum inside the exp: "row" per row (for queries: a per-query
    constant, cancels in the row normalisation), "global" over all rows and features of the
    last two dims (for keys: one constant per head, cancels too), "none" for the raw estimate."""
    if stabilizer not in ("none", "row", "global"):
        raise ValueError(f"stabilizer must be 'none', 'row' or 'global', got {stabilizer!r}")
    # In place on the one [..., n, m] buffer (the features are the method's memory peak), with
    # m^-1/2 folded into the exponent; the max is a constant (detached): it only shifts it.
    logits = (x @ W.T).sub_(0.5 * (x * x).sum(-1, keepdim=True) + 0.5 * math.log(W.shape[0]))
    if stabilizer != "none":
        logits.sub_(logits.detach().amax(dim=-1 if stabilizer == "row" else (-2, -1), keepdim=True))
    return logits.exp_()


# --- random Maclaurin (SchoenbAt) ----------------------------------------------------------------

@dataclass(frozen=True)
class MaclaurinDraw:
    """One draw of random Maclaurin features for exp: feature 0 is the constant term a_0 = 1,
    features 1..m-1 have the degrees in ``degrees`` (sorted), built from consecutive rows of the
    Rademacher matrix ``omega`` [sum(degrees), d] and scaled by ``weights`` = sqrt(a_N / P(N))."""

    degrees: tuple[int, ...]
    omega: torch.Tensor
    weights: torch.Tensor


def maclaurin_draw(m: int, d: int, seed: int = 0, *, max_degree: int = 20,
                   dtype: torch.dtype = torch.float32, device=None) -> MaclaurinDraw:
    if m < 2:
        raise ValueError(f"random Maclaurin features need at least 2 features (one is the constant), got {m}")
    g = _generator(seed)
    # Degree 0 is kept exactly (no point spending random features on a constant), so degrees
    # 1..max_degree are drawn with P(N) proportional to 2^-(N+1), renormalised.
    support = torch.arange(1, max_degree + 1, dtype=torch.float64)
    p = 2.0 ** -(support + 1)
    p = p / p.sum()
    idx = torch.multinomial(p, m - 1, replacement=True, generator=g)
    degrees = torch.sort(support[idx].long()).values
    omega = torch.randint(0, 2, (int(degrees.sum()), d), generator=g).to(torch.float64) * 2 - 1
    a = 1.0 / torch.exp(torch.lgamma(degrees.to(torch.float64) + 1))  # 1/N!
    weights = torch.sqrt(a / p[degrees - 1] / (m - 1))
    return MaclaurinDraw(tuple(degrees.tolist()), omega.to(dtype=dtype, device=device),
                         weights.to(dtype=dtype, device=device))


def maclaurin_features(x: torch.Tensor, draw: MaclaurinDraw) -> torch.Tensor:
    """[..., n, m]; E[phi(x) . phi(y)] = sum_{N <= max_degree} (x . y)^N / N!. Real and signed,
    so kernel sums (the softmax denominators) can come out near zero or negative."""
    proj = x @ draw.omega.T  # [..., n, sum(degrees)]
    blocks, start = [torch.ones_like(x[..., :1])], 0
    degrees = torch.tensor(draw.degrees)
    for degree in torch.unique(degrees).tolist():
        count = int((degrees == degree).sum())
        block = proj[..., start:start + count * degree]
        blocks.append(block.unflatten(-1, (count, degree)).prod(-1))
        start += count * degree
    phi = torch.cat(blocks, dim=-1)
    return torch.cat([phi[..., :1], phi[..., 1:] * draw.weights], dim=-1)


def schoenbat_prenorm(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """SchoenbAt's pre-normalisation (PreSBN, then the d^-1/4 data normaliser of its RMFA):
    centre and standardise each row, project to the unit sphere, scale by d^-1/4."""
    x = x - x.mean(-1, keepdim=True)
    x = x / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps) * x.shape[-1] ** -0.25


def schoenbat_postscale(out: torch.Tensor, gamma: float = 1.0, beta=1.0) -> torch.Tensor:
    """SchoenbAt's output rescaling gamma * o^beta (PostSBN; learnt parameters in the paper,
    identity by default here), with a sign-preserving power so negative outputs stay finite."""
    beta = torch.as_tensor(beta, dtype=out.dtype, device=out.device)
    return gamma * torch.sign(out) * out.abs() ** beta


def _scale_stabilize(phi: torch.Tensor) -> torch.Tensor:
    """Divide each row of signed query features by its max |value|: a positive per-query constant
    that cancels in the normalisation and keeps high-degree products in range."""
    return phi / phi.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(phi.dtype).tiny)


# --- Nystrom -------------------------------------------------------------------------------------

def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """exp(-|x - y|^2 / 2) = exp(x . y - |x|^2/2 - |y|^2/2), [..., n_x, n_y]."""
    sq_x = 0.5 * (x * x).sum(-1, keepdim=True)
    sq_y = 0.5 * (y * y).sum(-1, keepdim=True)
    return torch.exp(x @ y.transpose(-1, -2) - sq_x - sq_y.transpose(-1, -2))


def newton_pinv(a: torch.Tensor, iters: int = 6) -> torch.Tensor:
    """Moore-Penrose pseudo-inverse by the order-3 Newton-Schulz iteration of Nystromformer
    (also Skyformer's), started at a^T / (|a|_1 |a|_inf), which guarantees convergence."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    scale = a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1)
    x = a.transpose(-1, -2) / scale[..., None, None]
    for _ in range(iters):
        ax = a @ x
        x = 0.25 * x @ (13 * eye - ax @ (15 * eye - ax @ (7 * eye - ax)))
    return x


def _pinv(a: torch.Tensor, pinv: str, iters: int) -> torch.Tensor:
    if pinv == "exact":
        return torch.linalg.pinv(a)
    if pinv == "newton":
        return newton_pinv(a, iters)
    raise ValueError(f"pinv must be 'newton' or 'exact', got {pinv!r}")


def nystrom_factors(q: torch.Tensor, k: torch.Tensor, landmarks: int, seed: int = 0, *,
                    pinv: str = "exact", iters: int = 6, ridge: float = 0.0):
    """Skyformer: Nystrom for the Gaussian kernel on the 2n points [Q; K], ``landmarks`` of them
    drawn uniformly (all 2n when landmarks >= 2n, where the approximation is exact).
    Returns (phi_q, phi_k) with exp(q_i . k_j) ~ e^{|q_i|^2/2} phi_q[i] . phi_k[j]."""
    n = q.shape[-2]
    points = torch.cat([q, k], dim=-2)
    idx = torch.randperm(2 * n, generator=_generator(seed))[:landmarks].to(q.device)
    L = points.index_select(-2, idx)
    W = gaussian_kernel(L, L)
    if ridge:
        W = W + ridge * torch.eye(W.shape[-1], dtype=W.dtype, device=W.device)
    if pinv == "newton":
        # Skyformer's symmetric scaling D^-1/2 W D^-1/2 (D = row sums) before the iteration.
        d = W.sum(-1).rsqrt()
        W_pinv = d[..., :, None] * newton_pinv(d[..., :, None] * W * d[..., None, :], iters) * d[..., None, :]
    else:
        W_pinv = _pinv(W, pinv, iters)
    key_weight = 0.5 * (k * k).sum(-1, keepdim=True)
    key_weight = torch.exp(key_weight - key_weight.amax(dim=-2, keepdim=True))  # per-head constant cancels
    return gaussian_kernel(q, L) @ W_pinv, gaussian_kernel(k, L) * key_weight


def segment_means(x: torch.Tensor, m: int) -> torch.Tensor:
    """Means of ``m`` contiguous, near-equal segments of the rows of x, [..., m, d]."""
    n = x.shape[-2]
    m = min(m, n)
    seg = torch.arange(n, device=x.device) * m // n
    sums = torch.zeros(*x.shape[:-2], m, x.shape[-1], dtype=x.dtype, device=x.device).index_add_(-2, seg, x)
    counts = torch.bincount(seg, minlength=m).to(x.dtype)
    return sums / counts[:, None]


def nystromformer_factors(q: torch.Tensor, k: torch.Tensor, landmarks: int, *,
                          pinv: str = "exact", iters: int = 6):
    """Nystromformer: segment-means landmarks Q~, K~ and
    softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T); exact when landmarks >= n."""
    q_l, k_l = segment_means(q, landmarks), segment_means(k, landmarks)
    f1 = torch.softmax(q @ k_l.transpose(-1, -2), dim=-1)
    f2 = torch.softmax(q_l @ k_l.transpose(-1, -2), dim=-1)
    f3 = torch.softmax(q_l @ k.transpose(-1, -2), dim=-1)
    return f1 @ _pinv(f2, pinv, iters), f3.transpose(-1, -2)


# --- one interface for every method --------------------------------------------------------------

def factors(q: torch.Tensor, k: torch.Tensor, method: str = "favor", features: int = 256,
            seed: int = 0, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """(phi_q, phi_k), [..., n, r] each, with K_hat[i, j] = c_i phi_q[i] . phi_k[j] ~ exp(q_i . k_j).

    Options: favor ``orthogonal=True``; maclaurin/schoenbat ``max_degree=20``;
    nystrom ``pinv="exact"|"newton"``, ``iters=6``, ``ridge=0``; nystromformer ``pinv``, ``iters``.
    The papers' pseudo-inverse is ``pinv="newton", iters=6``; the default is the exact one because
    six iterations are far from converged on the ill-conditioned kernels of trained heads."""
    _check_method(method)
    _check_qkv(q, k)
    features = _positive_int(features, "features")
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


def linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                     causal: bool = False, chunk: int = 128) -> torch.Tensor:
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


def approx_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, method: str = "favor",
                     features: int = 256, seed: int = 0, causal: bool = False, **options) -> torch.Tensor:
    """The method's estimate of softmax(q k^T) v, [..., n, d_v], in O(n r d).
    ``schoenbat`` also takes ``gamma``/``beta`` for its output rescaling."""
    _check_qkv(q, k, v)
    options, post = _split_postscale(method, dict(options))
    out = linear_attention(*factors(q, k, method, features, seed, **options), v, causal)
    return schoenbat_postscale(out, **post) if method == "schoenbat" else out


def approx_pattern(q: torch.Tensor, k: torch.Tensor, method: str = "favor", features: int = 256,
                   seed: int = 0, causal: bool = False, **options) -> torch.Tensor:
    """The method's estimate of softmax(q k^T), [..., n, n] (rows sum to 1, entries may be
    negative for the signed methods)."""
    options, _ = _split_postscale(method, dict(options))
    return factor_pattern(*factors(q, k, method, features, seed, **options), causal=causal)


def kernel_estimate(q: torch.Tensor, k: torch.Tensor, method: str = "favor", features: int = 256,
                    seed: int = 0, **options) -> torch.Tensor:
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


def rpe_linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, b: torch.Tensor,
                         causal: bool = False) -> torch.Tensor:
    """sum_j T[i, j] (phi_q[i] . phi_k[j]) v_j / sum_j T[i, j] phi_q[i] . phi_k[j] with
    T = exp(B): the Toeplitz product of [phi_k (x) v | phi_k] by FFT, then one contraction with
    phi_q. O(n log n r d) time, O(n r d) memory."""
    r, dv = phi_k.shape[-1], v.shape[-1]
    keyed = torch.cat([(phi_k.unsqueeze(-1) * v.unsqueeze(-2)).flatten(-2), phi_k], dim=-1)
    mixed = toeplitz_matmul(rpe_toeplitz(b, causal), keyed)  # [..., n, r (dv + 1)]
    num = (phi_q.unsqueeze(-1) * mixed[..., : r * dv].unflatten(-1, (r, dv))).sum(-2)
    den = (phi_q * mixed[..., r * dv:]).sum(-1, keepdim=True)
    return num / _safe_denominator(den)


def rpe_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, method: str = "favor",
                  features: int = 256, seed: int = 0, causal: bool = False, **options) -> torch.Tensor:
    """The method's estimate of softmax(q k^T + B) v with B[i, j] = b[j - i + n - 1]."""
    _check_qkv(q, k, v)
    options, post = _split_postscale(method, dict(options))
    out = rpe_linear_attention(*factors(q, k, method, features, seed, **options), v, b, causal)
    return schoenbat_postscale(out, **post) if method == "schoenbat" else out


def exact_rpe_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: torch.Tensor,
                        causal: bool = False) -> torch.Tensor:
    """softmax(q k^T + B) v, dense."""
    scores = q @ k.transpose(-1, -2) + toeplitz_dense(b)
    if causal:
        n = scores.shape[-1]
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# --- error analysis on a model's heads -------------------------------------------------------------

@torch.no_grad()
def head_qkv(model, tokens: torch.Tensor, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V of one head from the model's own cache, [batch, pos, d] each, with the score scale
    folded into q so that softmax(q k^T) (causal) is exactly ``cache[act_name("pattern", l)][:, h]``
    for a softmax model (an entmax model's pattern is not a softmax; q k^T are still its scores).
    Merged heads (W_QK = B): q = X B, k = X."""
    from attn_core.bilinear import check_heads, check_layer

    check_layer(model, layer)
    check_heads(model, head)
    cfg = model.cfg
    if tokens.dim() == 1:
        tokens = tokens[None]
    _, cache = model.run_with_cache(tokens)
    X = cache[act_name("attn_in", layer)]  # [batch, pos, d_model]
    attn = model.blocks[layer].attn
    v = X @ attn.W_V[head]
    if cfg.attn_bias:
        v = v + attn.b_V[head]
    if cfg.qk == "merged":
        return X @ attn.W_QK[head], X, v
    d_qk = cfg.head_d_qk(layer, head)  # W_Q/W_K are stored padded to the layer's widest head
    q, k = X @ attn.W_Q[head, :, :d_qk], X @ attn.W_K[head, :, :d_qk]
    if cfg.attn_bias:
        q, k = q + attn.b_Q[head, :d_qk], k + attn.b_K[head, :d_qk]
    return q * d_qk ** -0.5, k, v


def head_spectrum(model, layer: int, head: int) -> dict:
    """Spectral norm, Frobenius norm and stable rank |B|_F^2 / |B|_2^2 of the head's bilinear form
    B = W_Q W_K^T / sqrt(d_qk) (W_QK for a merged head), from :class:`attn_core.bilinear.QKForm`."""
    from attn_core.bilinear import QKForm, check_heads

    check_heads(model, head)
    with torch.no_grad():
        form = QKForm.from_layer(model, layer)[head]
        return {"spectral_norm": float(form.spectral_norm), "frobenius_norm": float(form.frobenius_norm),
                "stable_rank": float(form.stable_rank)}


def balance_qk(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q s, k / s) with s = (mean |k|^2 / mean |q|^2)^(1/4) per sequence (over the last two dims):
    q k^T, hence the pattern, is unchanged, but FAVOR+'s variance (~ exp|q + k|^2) and the Gaussian
    kernel's dynamic range (e^{|k|^2/2}) depend on how the scale is split. head_qkv folds the whole
    1/sqrt(d_qk) into q, leaving |k| several times |q| on trained heads; Performer splits it as
    d^-1/4 on each side. Maclaurin features are invariant to this."""
    ratio = (k * k).sum(-1).mean(-1) / (q * q).sum(-1).mean(-1).clamp_min(torch.finfo(q.dtype).tiny)
    s = ratio.clamp_min(torch.finfo(q.dtype).tiny) ** 0.25
    return q * s[..., None, None], k / s[..., None, None]


def attention_errors(out: torch.Tensor, out_hat: torch.Tensor, p: torch.Tensor, p_hat: torch.Tensor,
                     eps: float = 1e-12) -> dict:
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
def error_curve(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, methods: Sequence[str] = METHODS,
                features: Sequence[int] = FEATURES, seeds: Iterable[int] = range(5), causal: bool = True,
                balance: bool = True, dtype: Optional[torch.dtype] = torch.float64, **options):
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
                rows.append({"method": method, "features": int(m), "seed": int(seed),
                             **attention_errors(out, out_hat, p, p_hat)})
    return pd.DataFrame(rows, columns=ERROR_COLUMNS)


def summarize(df):
    """Mean and standard deviation (over seeds) of each error per method and feature count:
    columns method, features, n_seeds, rel_error_mean, rel_error_std, tv_mean, tv_std, kl_mean, kl_std."""
    grouped = df.groupby(["method", "features"], sort=False)
    summary = grouped[["rel_error", "tv", "kl"]].agg(["mean", "std"])
    summary.columns = [f"{metric}_{stat}" for metric, stat in summary.columns]
    summary = summary.fillna(0.0)  # std of a single seed
    summary.insert(0, "n_seeds", grouped.size())
    return summary.reset_index()


@torch.no_grad()
def head_patterns(model, tokens: torch.Tensor, layer: int, head: int, method: str = "favor", features: int = 64,
                  seed: int = 0, causal: bool = True, balance: bool = True, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact, approximate) patterns of one head, [batch, n, n] each, computed as
    :func:`error_curve` does (balanced q, k in float64), for side-by-side heatmaps."""
    q, k, _ = (t.double() for t in head_qkv(model, tokens, layer, head))
    if balance:
        q, k = balance_qk(q, k)
    return exact_pattern(q, k, causal), approx_pattern(q, k, method, features, seed, causal, **options)


def head_error(model, tokens: torch.Tensor, layer: int, head: int, method: str = "favor", features: int = 64,
               seeds: int = 5, causal: bool = True, balance: bool = True, **options) -> dict:
    """One method at one feature count on one head, as a JSON-ready dict: method, features, seeds,
    rel_error_mean/std, tv_mean/std, kl_mean/std, and the head's spectrum and q/k norms (FAVOR+'s
    variance grows like exp(|q + k|^2), Maclaurin's with |q| |k|)."""
    q, k, v = head_qkv(model, tokens, layer, head)
    row = summarize(error_curve(q, k, v, (method,), (features,), range(seeds), causal, balance, **options)).iloc[0]
    stats = {key: float(row[key]) for key in row.index if key.endswith(("_mean", "_std"))}
    return {"method": method, "features": int(features), "seeds": int(seeds), "layer": layer, "head": head,
            "causal": causal, **stats, **head_spectrum(model, layer, head),
            "q_norm_max": q.norm(dim=-1).max().item(), "k_norm_max": k.norm(dim=-1).max().item()}


# --- speed and memory ------------------------------------------------------------------------------

def _bench_inputs(n: int, heads: int, d_head: int, seed: int, score_std: float = 1.0) -> tuple[torch.Tensor, ...]:
    """Random heads whose scores q . k have standard deviation ``score_std``: q, k ~ N(0, I)
    (score_std^2 / d)^(1/4) each (the Performer convention of splitting the scale evenly between
    q and k), v ~ N(0, I); [1, heads, n, d]."""
    g = _generator(seed)
    q, k, v = (torch.randn(1, heads, n, d_head, generator=g) for _ in range(3))
    scale = (score_std ** 2 / d_head) ** 0.25
    return q * scale, k * scale, v


def accuracy(n: int = 4096, methods: Sequence[str] = BENCH_METHODS, features: int = 256, d_head: int = 64,
             heads: int = 4, score_stds: Sequence[float] = (0.25, 0.5, 1.0), causal: bool = False,
             seed: int = 0) -> list[dict]:
    """Relative output error |out - exact| / |exact| of each method on the benchmark's random
    heads at one length, for several score spreads: the error at the benchmark's speed depends on
    the inputs far more than on n (FAVOR+'s variance grows like exp|q + k|^2). Rows: score_std,
    method, rel_error."""
    rows = []
    for score_std in score_stds:
        q, k, v = _bench_inputs(n, heads, d_head, seed, score_std)
        with torch.no_grad():
            exact = exact_attention(q, k, v, causal)
            for m in methods:
                out = approx_attention(q, k, v, m, features, seed, causal)
                rows.append({"score_std": score_std, "method": m, "rel_error": ((out - exact).norm() / exact.norm()).item()})
    return rows


def _bench_call(method: str, q, k, v, features: int, causal: bool, seed: int):
    if method == "sdpa":
        return exact_attention(q, k, v, causal)
    return approx_attention(q, k, v, method, features, seed, causal)


def _rss_kb(field: str) -> Optional[int]:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _peak_memory_child() -> None:
    """Runs in a fresh interpreter per configuration, so that no allocation of an earlier one is
    reused: one call, then the rise of the resident set over it. Prints one JSON line."""
    cfg = json.loads(sys.stdin.read())
    torch.set_num_threads(cfg["threads"])
    q, k, v = _bench_inputs(cfg["n"], cfg["heads"], cfg["d_head"], cfg["seed"])
    gc.collect()
    before = _rss_kb("VmRSS")
    try:  # reset the kernel's high-water mark (VmHWM) to the current RSS
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        before = None
    with torch.no_grad():
        _bench_call(cfg["method"], q, k, v, cfg["features"], cfg["causal"], cfg["seed"])
    peak = _rss_kb("VmHWM")
    print(json.dumps({"peak_mb": None if peak is None or before is None else max(peak - before, 0) / 1024}))


def _peak_memory(config: dict, timeout: float) -> Optional[float]:
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", "from attn_core.kernels import _peak_memory_child; _peak_memory_child()"],
                          input=json.dumps(config), capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"memory run of {config['method']} at n={config['n']} failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_mb"]


def crossover(rows: list[dict], method: str, baseline: str = "sdpa") -> Optional[int]:
    """The smallest n from which ``method`` is faster than ``baseline`` at every measured length."""
    ms = {(r["method"], r["n"]): r["ms"] for r in rows}
    lengths = sorted({r["n"] for r in rows if r["method"] == method})
    found = None
    for n in reversed(lengths):
        if (baseline, n) not in ms or ms[(method, n)] >= ms[(baseline, n)]:
            break
        found = n
    return found


def benchmark(max_n: int = 16384, repeats: int = 5, methods: Sequence[str] = BENCH_METHODS, d_head: int = 64,
              heads: int = 4, *, min_n: int = 256, features: int = 256, causal: bool = False, seed: int = 0,
              threads: Optional[int] = None, memory: bool = True, timeout: float = 300.0, progress=None) -> dict:
    """Time exact attention (``sdpa``: torch's scaled_dot_product_attention) and each method on one
    batch of ``heads`` float32 heads (:func:`_bench_inputs`) at n = min_n, 2 min_n, ..., max_n.

    ``ms`` is the median of ``repeats`` calls after one warm-up call; the calls of all methods at
    one n are interleaved (sdpa, favor, ..., sdpa, favor, ...) so that a change in the machine's
    load hits every method alike and the ratios stay fair. ``peak_mb`` is measured in a fresh
    subprocess per (n, method): the rise of its resident memory over one call (Linux VmHWM after
    resetting it through /proc/self/clear_refs, minus VmRSS before; None where unavailable or
    ``memory=False``). ``rel_error`` is |out - sdpa| / |sdpa| on the same inputs. ``progress``, if
    given, is called with each finished row. ``threads`` sets torch's intra-op threads for the run
    (restored afterwards; None keeps the current setting): on a machine busy with other work, one
    thread avoids the stalls of two threads waiting on each other at every operation's barrier,
    which hit the many small operations of the approximations far more than sdpa's single kernel.

    Returns {config, rows: [{n, method, ms, ratio, peak_mb, rel_error}], crossover: {method: n or
    None}, speedup_at_max_n: {method: ratio}, accuracy: {n, rows: [{score_std, method, rel_error}]}},
    with ratio = sdpa ms / method ms at the same n; the timed inputs have score_std 1."""
    for method in methods:
        _check_method(method)
    if min_n < 1 or max_n < min_n:
        raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
    for name, value in (("repeats", repeats), ("d_head", d_head), ("heads", heads), ("features", features)):
        _positive_int(value, name)
    lengths = [min_n * 2 ** i for i in range(int(math.log2(max_n / min_n)) + 1)]
    names = ("sdpa", *methods)
    rows: list[dict] = []
    previous_threads = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(_positive_int(threads, "threads"))
        used_threads = torch.get_num_threads()
        for n in lengths:
            q, k, v = _bench_inputs(n, heads, d_head, seed)
            times: dict[str, list[float]] = {m: [] for m in names}
            with torch.no_grad():
                outputs = {m: _bench_call(m, q, k, v, features, causal, seed) for m in names}  # warm-up
                for _ in range(repeats):
                    for m in names:
                        t0 = time.perf_counter()
                        _bench_call(m, q, k, v, features, causal, seed)
                        times[m].append(time.perf_counter() - t0)
            sdpa_ms = 1000 * statistics.median(times["sdpa"])
            for m in names:
                ms = 1000 * statistics.median(times[m])
                config = {"n": n, "method": m, "heads": heads, "d_head": d_head, "features": features,
                          "causal": causal, "seed": seed, "threads": used_threads}
                rows.append({"n": n, "method": m, "ms": ms, "ratio": sdpa_ms / ms,
                             "peak_mb": _peak_memory(config, timeout) if memory else None,
                             "rel_error": ((outputs[m] - outputs["sdpa"]).norm() / outputs["sdpa"].norm()).item()})
                if progress is not None:
                    progress(rows[-1])
            del outputs
    finally:
        torch.set_num_threads(previous_threads)
    return {
        "config": {"min_n": min_n, "max_n": lengths[-1], "repeats": repeats, "d_head": d_head, "heads": heads,
                   "batch": 1, "features": features, "causal": causal, "dtype": "float32", "seed": seed,
                   "inputs": "q, k ~ N(0, I) d^-1/4, v ~ N(0, I)", "torch_threads": used_threads,
                   "torch": torch.__version__},
        "rows": rows,
        "crossover": {m: crossover(rows, m) for m in methods},
        "speedup_at_max_n": {r["method"]: r["ratio"] for r in rows if r["n"] == lengths[-1] and r["method"] != "sdpa"},
        "accuracy": {"n": min(lengths[-1], 4096),
                     "rows": accuracy(min(lengths[-1], 4096), methods, features, d_head, heads, causal=causal, seed=seed)},
    }
