"""Feature maps and factors of the kernel exp(q . k): exact attention, FAVOR+, random Maclaurin
(SchoenbAt), Nystrom and Nystromformer. The conventions and the maths of every method are in the
package docstring (:mod:`attn_core.kernels`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attn_core import linalg
from attn_core.validate import is_int

METHODS = ("favor", "maclaurin", "schoenbat", "nystrom", "nystromformer")
CAUSAL_METHODS = ("favor", "maclaurin", "schoenbat")  # prefix-sum forms that never look ahead
FEATURES = (8, 16, 32, 64, 128, 256, 512)
# Keyword options each method takes (schoenbat also takes gamma, beta: its output rescaling).
OPTIONS = {
    "favor": ("orthogonal",),
    "maclaurin": ("max_degree",),
    "schoenbat": ("max_degree",),
    "nystrom": ("pinv", "iters", "ridge"),
    "nystromformer": ("pinv", "iters"),
}


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(int(seed))


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")


def _positive_int(value, name: str) -> int:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
    if q.dim() < 2 or q.shape[-1] != k.shape[-1] or q.shape[-2] != k.shape[-2] or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(
            f"q and k must both be [..., n, d] with the same shape, got {list(q.shape)} and {list(k.shape)}"
        )
    if v is not None and (v.shape[:-1] != k.shape[:-1]):
        raise ValueError(
            f"v must be [..., n, d_v] with the n and leading dims of k, got {list(v.shape)} for k {list(k.shape)}"
        )
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


def orthogonal_gaussian(
    m: int, d: int, seed: int = 0, *, orthogonal: bool = True, dtype: torch.dtype = torch.float32, device=None
) -> torch.Tensor:
    """``m`` rows w_i, each marginally N(0, I_d), [m, d]. With ``orthogonal`` the rows come in
    blocks of ``d`` mutually orthogonal directions (Haar: QR with the sign of diag(R) fixed),
    each scaled by an independent chi_d norm, so the estimator stays unbiased."""
    g = _generator(seed)
    if not orthogonal:
        return torch.randn(m, d, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
    blocks = []
    for _ in range(math.ceil(m / d)):
        Q, R = linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
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


def maclaurin_draw(
    m: int, d: int, seed: int = 0, *, max_degree: int = 20, dtype: torch.dtype = torch.float32, device=None
) -> MaclaurinDraw:
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
    return MaclaurinDraw(
        tuple(degrees.tolist()), omega.to(dtype=dtype, device=device), weights.to(dtype=dtype, device=device)
    )


def maclaurin_features(x: torch.Tensor, draw: MaclaurinDraw) -> torch.Tensor:
    """[..., n, m]; E[phi(x) . phi(y)] = sum_{N <= max_degree} (x . y)^N / N!. Real and signed,
    so kernel sums (the softmax denominators) can come out near zero or negative."""
    proj = x @ draw.omega.T  # [..., n, sum(degrees)]
    blocks, start = [torch.ones_like(x[..., :1])], 0
    degrees = torch.tensor(draw.degrees)
    for degree in torch.unique(degrees).tolist():
        count = int((degrees == degree).sum())
        block = proj[..., start : start + count * degree]
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


def nystrom_factors(
    q: torch.Tensor,
    k: torch.Tensor,
    landmarks: int,
    seed: int = 0,
    *,
    pinv: str = "exact",
    iters: int = 6,
    ridge: float = 0.0,
):
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
    # segment sizes by the same index_add_ (bincount has no shape without reading seg)
    counts = torch.zeros(m, dtype=x.dtype, device=x.device).index_add_(
        0, seg, torch.ones(n, dtype=x.dtype, device=x.device)
    )
    return sums / counts[:, None]


def nystromformer_factors(q: torch.Tensor, k: torch.Tensor, landmarks: int, *, pinv: str = "exact", iters: int = 6):
    """Nystromformer: segment-means landmarks Q~, K~ and
    softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T); exact when landmarks >= n."""
    q_l, k_l = segment_means(q, landmarks), segment_means(k, landmarks)
    f1 = torch.softmax(q @ k_l.transpose(-1, -2), dim=-1)
    f2 = torch.softmax(q_l @ k_l.transpose(-1, -2), dim=-1)
    f3 = torch.softmax(q_l @ k.transpose(-1, -2), dim=-1)
    return f1 @ _pinv(f2, pinv, iters), f3.transpose(-1, -2)
