"""Batch least squares of a score target in the whitened basis of the batch, and Eckart-Young
truncation: the "Batch least squares", "Damping", "Whitened basis" and "Rank d_k + p"
sections of :mod:`attn_core.grow`'s docstring derive what these functions compute."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attn_core import linalg

RIDGE = 1e-8
REFINE_STEPS = 3
RANK_RTOL = 1e-10  # singular values of the rows below this fraction of the largest are zero
COMPLEMENT_WEIGHT = 1e-6  # metric weight of directions no row reaches, relative to the largest
MAX_UNKNOWNS = 72 * 72  # r_q * r_k: H is dense, (r_q r_k)^2 float64 numbers


# --- batch least squares in the whitened basis -------------------------------------------------------


def centre_rows(A: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """C(A): each row minus its mean over the visible entries; masked entries 0."""
    w = mask.to(A.dtype)
    mean = (A * w).sum(-1, keepdim=True) / w.sum(-1, keepdim=True).clamp_min(1)
    return (A - mean) * w


@dataclass
class Basis:
    """A complete orthonormal basis V [d', d'] whose first ``rank`` columns span some rows (centred
    or not), and scales s [d']: the RMS of the rows along those directions, ``COMPLEMENT_WEIGHT``
    times the largest along the rest. The coordinates x V / s of the rows have identity second
    moment on the span."""

    V: torch.Tensor
    s: torch.Tensor
    rank: int

    @classmethod
    def of_rows(cls, rows: torch.Tensor, centre: bool, rtol: float = RANK_RTOL) -> Basis:
        A = rows - rows.mean(0) if centre else rows
        _, s, Vh = linalg.svd_full(A / math.sqrt(rows.shape[0]))
        r = int((s > rtol * s[0]).sum()) if s.numel() and s[0] > 0 else 0
        if r == 0:
            raise ValueError("the attention input of this head is zero on the batch: nothing to fit")
        rest = s.new_full((Vh.shape[0] - r,), COMPLEMENT_WEIGHT * float(s[0]))
        return cls(Vh.T, torch.cat([s[:r], rest]), r)

    @property
    def lift(self) -> torch.Tensor:
        """M = V diag(1/s) [d', d']: coordinates are x M, forms are Z = M_q Y M_k^T."""
        return self.V / self.s

    @property
    def span_lift(self) -> torch.Tensor:
        """The first ``rank`` columns of M: coordinates on the rows' span [d', rank]."""
        return self.lift[:, : self.rank]

    @property
    def metric(self) -> torch.Tensor:
        """R = M^{-1} = diag(s) V^T [d', d']: Y = R_q Z R_k^T is Z in whitened coordinates."""
        return self.s[:, None] * self.V.T


def solve_psd(H: torch.Tensor, rhs: torch.Tensor, ridge: float = RIDGE, steps: int = REFINE_STEPS) -> torch.Tensor:
    """Iterated Tikhonov for H y = rhs, H symmetric PSD: Cholesky of H + lambda I with
    lambda = ridge * tr(H) / dim, then y <- y + (H + lambda I)^{-1} (rhs - H y), ``steps`` times."""
    dim = H.shape[0]
    lam = ridge * H.diagonal().sum() / dim
    if lam <= 0:
        return torch.zeros_like(rhs)
    L, info = torch.linalg.cholesky_ex(H + lam * torch.eye(dim, dtype=H.dtype, device=H.device))
    if info.item() != 0:
        raise ValueError("the normal equations are not positive semi-definite (non-finite attention inputs?)")
    y = torch.zeros_like(rhs)
    for _ in range(steps):
        y = y + torch.cholesky_solve((rhs - H @ y)[:, None], L)[:, 0]
    return y


@dataclass
class ScoreFit:
    """The least-squares fit of a score target: Z = M_q Y M_k^T minimises
    sum_b ||C(target_b - X_b Z X_b^T)||^2 (C: visible entries, centred per row when ``centred``)."""

    Y: torch.Tensor  # [r_q, r_k]
    q: Basis
    k: Basis
    centred: bool

    @property
    def Z(self) -> torch.Tensor:
        return self.q.span_lift @ self.Y @ self.k.span_lift.T

    @property
    def Y_full(self) -> torch.Tensor:
        """Y in the complete whitened coordinates [d', d'] (zero off the span)."""
        d = self.q.V.shape[0]
        return torch.nn.functional.pad(self.Y, (0, d - self.k.rank, 0, d - self.q.rank))


def fit_scores(
    X: torch.Tensor,
    target: torch.Tensor,
    mask: torch.Tensor,
    centre: bool = True,
    ridge: float = RIDGE,
    damping: float = 0.0,
) -> ScoreFit:
    """Solve the batch normal equations (module doc) for ``X`` [n, T, d'], ``target`` [n, T, T]
    and ``mask`` [T, T]. ``centre=False`` fits the raw visible entries (the seed's problem)."""
    rows = X.reshape(-1, X.shape[-1])
    q = Basis.of_rows(rows, centre=False)
    k = Basis.of_rows(rows, centre=centre) if centre else q
    if q.rank * k.rank > MAX_UNKNOWNS:
        raise ValueError(
            f"the attention input spans {q.rank} dimensions: the exact fit would solve for "
            f"{q.rank * k.rank} unknowns, more than {MAX_UNKNOWNS} (d_model up to about "
            f"{math.isqrt(MAX_UNKNOWNS)}); use a smaller model"
        )
    u, w = X @ q.span_lift, X @ k.span_lift  # [n, T, r_q], [n, T, r_k]
    vis = mask.to(X.dtype)
    K = torch.einsum("ij,bjc,bje->bice", vis, w, w)  # [n, T, r_k, r_k] key Gram of every query row
    if centre:
        m = torch.einsum("ij,bjc->bic", vis, w)
        K = K - m[..., :, None] * m[..., None, :] / vis.sum(1).clamp_min(1)[None, :, None, None]
    A = torch.einsum("bia,bie->biae", u, u)  # [n, T, r_q, r_q]
    rq, rk = q.rank, k.rank
    H = (A.reshape(-1, rq * rq).T @ K.reshape(-1, rk * rk)).reshape(rq, rq, rk, rk)
    H = H.permute(0, 2, 1, 3).reshape(rq * rk, rq * rk)  # index (a, c), (a', c') of Y[a, c]
    t = centre_rows(target, mask) if centre else target * vis
    rhs = torch.einsum("bia,bij,bjc->ac", u, t, w).reshape(-1)
    if damping > 0:
        inv = (1 / (q.s[: q.rank, None] * k.s[None, : k.rank]) ** 2).reshape(-1)
        lam = damping * (H.diagonal() / inv).sum() / inv.numel()
        H = H + lam * torch.diag(inv)
    return ScoreFit(solve_psd(H, rhs, ridge).reshape(rq, rk), q, k, centre)


def scores_of(X: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
    """X_b Z X_b^T for every sequence, [n, T, T]."""
    return X @ Z @ X.transpose(-1, -2)


def low_rank(Y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eckart-Young: Y = P diag(sigma) Q^T; returns (P_k sigma_k^(1/2), sigma, Q_k sigma_k^(1/2)), the
    factors padded with zero columns to k when Y has fewer singular values, so that
    ||Y - left right^T||_F^2 = sum_{i > k} sigma_i^2 is the least over rank <= k."""
    P, sigma, Qh = linalg.svd(Y)
    root = sigma[:k].sqrt()
    pad = k - root.shape[0]
    left = torch.nn.functional.pad(P[:, :k] * root, (0, pad))
    right = torch.nn.functional.pad(Qh[:k].T * root, (0, pad))
    return left, sigma, right
