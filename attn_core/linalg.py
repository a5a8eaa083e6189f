"""The matrix decompositions of attn_core (QR, singular values and vectors, symmetric eigenvalues),
each computed where :func:`attn_core.device.decomposition_device` says and returned on
the device of the matrices given: a spectrum of head-sized cores on a GPU is solved on the host,
where a batch of 64 x 64 matrices takes tens of microseconds a matrix instead of cuSOLVER's
milliseconds one after another (the GPU check, docs/results.md); a decomposition that autograd records (a
penalty's, inside a training step) stays on the device. No other module calls ``torch.linalg``'s
decompositions (an architecture test says so)."""

from __future__ import annotations

import torch

from attn_core.device import decomposition_device, move


def _solve(op: str, A: torch.Tensor, fn) -> tuple[torch.Tensor, ...]:
    """``fn`` of ``A`` where ``op`` is best run, its results back on ``A``'s device."""
    differentiable = A.requires_grad and torch.is_grad_enabled()
    where = decomposition_device(A.device, op, A.shape[-2], A.shape[-1], differentiable)
    out = fn(move(A, where))
    out = out if isinstance(out, tuple) else (out,)
    return tuple(move(t, A.device) for t in out)


def qr(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, R) of every matrix of ``A`` [..., m, n]: the reduced QR (``torch.linalg.qr``)."""
    return _solve("qr", A, lambda a: tuple(torch.linalg.qr(a)))


def svd(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U, S, Vh) of every matrix of ``A`` [..., m, n], the thin SVD (``full_matrices=False``)."""
    return _solve("svd", A, lambda a: tuple(torch.linalg.svd(a, full_matrices=False)))


def svd_full(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U, S, Vh) of every matrix of ``A`` [..., m, n] with square U and Vh (``full_matrices=True``)."""
    return _solve("svd", A, lambda a: tuple(torch.linalg.svd(a, full_matrices=True)))


def svdvals(A: torch.Tensor) -> torch.Tensor:
    """The singular values of every matrix of ``A`` [..., m, n], descending, [..., min(m, n)]."""
    return _solve("svd", A, torch.linalg.svdvals)[0]


def eigvalsh(A: torch.Tensor) -> torch.Tensor:
    """The eigenvalues of every symmetric matrix of ``A`` [..., n, n], ascending."""
    return _solve("eigh", A, torch.linalg.eigvalsh)[0]
