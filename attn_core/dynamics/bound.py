"""The entropy floor of softmax attention given the size of its logits (Zhai et al. 2023,
"Stabilizing Transformer Training by Preventing Attention Entropy Collapse", Theorem 3.1).

For logits s in R^n (one query's row over its n visible keys) whose centred norm is at most
sigma, ||s - mean(s) 1||_2 <= sigma, the entropy of softmax(s) is at least

    h(n, sigma) = log(1 + (n-1) beta) + (n-1) beta Delta / (1 + (n-1) beta),
    Delta = sigma sqrt(n / (n-1)),   beta = exp(-Delta)                       (h(1, .) = 0)

and this is attained (one logit at sigma sqrt((n-1)/n), the others equal), so it is the exact
floor. The derivation is in docs/maths.md ("The entropy floor"). For a head on a sequence, the
visible logits of row i are a row of L = S * M (S the scores, M the mask, 0 elsewhere) and part
of a row of S, so their norm is at most sigma = min(||L||_2, ||S||_2): ``H(A_i) >= h(n_i, sigma)``
with the measured logits' spectral norm, a floor that falls exponentially with it. Zhai et al.
bound ||S||_2 further by sigma(W_K W_Q^T) ||X X^T||_2 (S = X B X^T without biases); the measured
norm gives the tighter bound. (Masking can make ||L||_2 larger than ||S||_2, hence the minimum.)

All in float64 (the largest singular values: float32 Gram eigenvalues, about 1e-6 relative); softmax heads only (alpha-entmax rows can put exactly zero weight on a key).
"""

from __future__ import annotations

import math

import torch

from attn_core import linalg


def entropy_floor(n: torch.Tensor | int, sigma: torch.Tensor | float) -> torch.Tensor:
    """h(n, sigma) above, in nats, broadcast over ``n`` (keys, >= 1) and ``sigma`` (>= 0), on the
    device of whichever is a tensor (float64 always)."""
    device = next((t.device for t in (n, sigma) if isinstance(t, torch.Tensor)), None)
    n = torch.as_tensor(n, dtype=torch.float64, device=device)
    sigma = torch.as_tensor(sigma, dtype=torch.float64, device=device).clamp_min(0)
    m = (n - 1).clamp_min(0)
    delta = sigma * torch.sqrt(n / m.clamp_min(1))
    beta = torch.exp(-delta)
    mass = m * beta  # the low keys' total weight relative to the high one
    floor = torch.log1p(mass) + mass * delta / (1 + mass)
    return torch.where(m > 0, floor, torch.zeros_like(floor))


def visible_logits(S: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """L = S where a key is visible, 0 elsewhere (float64), ``S`` [..., T, T], ``mask`` [T, T]."""
    return S.double().masked_fill(~mask.to(torch.bool), 0.0)


def largest_singular_value(A: torch.Tensor) -> torch.Tensor:
    """||A||_2 of every matrix of ``A`` [..., m, k], float64 on A's device: the square root of the
    largest eigenvalue of the Gram matrix A A^T, formed and solved in float32 after scaling A by its
    largest entry (no overflow, no underflow). Only the largest eigenvalue is wanted, and it is
    well conditioned (Weyl: perturbing the Gram by E moves it by at most ||E||_2), so float32 gives
    it to about 1e-6 relative. Every singular value in float64 (``torch.linalg.svdvals``) was 75 of
    87 s per checkpoint of ``dynamics`` on a text; this takes 0.44-0.64 s where that took
    0.77-0.95 s for [32, 8, 128, 128] scores (both min of 3 in one process, 2 loaded cores). Checked
    against the dense float64 value in tests/unit/test_dynamics_bound_speed.py."""
    scale = A.detach().abs().amax((-2, -1), keepdim=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    scaled = (A / scale).float()
    gram = scaled @ scaled.mT if scaled.shape[-2] <= scaled.shape[-1] else scaled.mT @ scaled
    top = linalg.eigvalsh(gram)[..., -1].double().clamp_min(0).sqrt()
    return top * scale[..., 0, 0].double()


def spectral_norm(S: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """min(||L||_2, ||S||_2), [...]: a bound on the norm of every row's visible logits (largest
    singular values: :func:`largest_singular_value`, about 1e-6 relative)."""
    visible = S.masked_fill(~mask.to(device=S.device, dtype=torch.bool), 0.0)  # L, in S's dtype
    return torch.minimum(largest_singular_value(visible), largest_singular_value(S))


def row_floors(S: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The floor of every row's entropy, [..., T] nats: h(n_i, sigma), n_i the row's visible keys and
    sigma = :func:`spectral_norm`."""
    sigma = spectral_norm(S, mask)  # [...]
    n = mask.to(torch.bool).sum(-1).to(torch.float64).to(S.device)  # [T]
    return entropy_floor(n, sigma[..., None])


def normalized_row_floors(S: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """:func:`row_floors` / log n_i (0 for rows with one key): the floor of the normalized entropy."""
    n = mask.to(torch.bool).sum(-1).to(torch.float64).to(S.device)
    logn = torch.where(n > 1, n.log(), torch.ones_like(n))
    return torch.where(n > 1, row_floors(S, mask) / logn, torch.zeros_like(n))


def floor_logits(n: int, sigma: float, device: torch.device | str | None = None) -> torch.Tensor:
    """The logits that attain the floor: one at sigma sqrt((n-1)/n), the rest at -sigma/sqrt(n(n-1)),
    float64 on ``device`` (that of the scores they stand beside; default the CPU)."""
    if n < 2:
        return torch.zeros(n, dtype=torch.float64, device=device)
    s = torch.full((n,), -sigma / math.sqrt(n * (n - 1)), dtype=torch.float64, device=device)
    s[0] = sigma * math.sqrt((n - 1) / n)
    return s
