"""The QK form as a type: B = left @ right^T, pure linear algebra (docs/maths.md).

Like TransformerLens' ``FactoredMatrix``: :class:`QKForm` holds B as its factors (the
1/sqrt(d_qk) folded into ``left``) or densely, batched over any leading dims (layers, heads),
transposes with ``.T`` and composes with ``@`` without forming the m x n matrix, and computes
its spectrum lazily, once, from a thin QR of each factor and an SVD of the small r x r core
``R_left R_right^T``, whose singular values are those of B. It knows nothing of models: a
head's form comes from its attention module (:mod:`attn_core.model.form`), a layer's or a
model's from :mod:`attn_core.bilinear.heads`.
"""

from __future__ import annotations

from functools import cached_property

import torch

from attn_core import linalg, metrics


class QKForm:
    """B = left @ right^T (factored) or B itself (dense), batched over leading dims.

    Lazy, cached properties: ``dense`` (also ``B``), ``svd()``, ``singular_values``, ``eigenvalues``,
    ``eigenvalues_sym``, ``symmetric``/``antisymmetric`` (QKForms), norms, stable and effective
    rank. The factored path (rank cap r < min(m, n)) never forms the m x n matrix for them.
    Gradients flow through every property, except that the QR's gradient is undefined when a
    factor is rank-deficient (the zero-padded columns of grown heads): to penalise a grown
    head, build its form from its own d_qk columns. A head's form taken from a model
    (``model.QK[l, h]``, :func:`attn_core.bilinear.heads.qk_form`) also knows its rotary
    B(delta): :meth:`at_offset`.

    >>> import torch
    >>> form = QKForm(left=torch.eye(3)[:, :2] * 2, right=torch.eye(3)[:, :2])
    >>> form.B
    tensor([[2., 0., 0.],
            [0., 2., 0.],
            [0., 0., 0.]])
    >>> form.singular_values, float(form.stable_rank)
    (tensor([2., 2.]), 2.0)
    """

    def __init__(
        self, left: torch.Tensor | None = None, right: torch.Tensor | None = None, dense: torch.Tensor | None = None
    ):
        if (dense is None) == (left is None or right is None):
            raise ValueError("give either dense or both left and right")
        if dense is None and (left.shape[:-2] != right.shape[:-2] or left.shape[-1] != right.shape[-1]):
            raise ValueError(f"factors do not match: left {list(left.shape)}, right {list(right.shape)}")
        self.left, self.right, self._dense = left, right, dense
        self._at_offset = None  # set for a head's form taken from a model (heads.qk_form)

    # shape and access --------------------------------------------------------------------------
    @property
    def is_dense(self) -> bool:
        return self._dense is not None

    @property
    def shape(self) -> torch.Size:
        if self.is_dense:
            return self._dense.shape
        return self.left.shape[:-1] + self.right.shape[-2:-1]

    @property
    def batch_shape(self) -> torch.Size:
        return self.shape[:-2]

    @property
    def rank_cap(self) -> int:
        """An upper bound on the rank: the inner width of the factors, or min(m, n)."""
        m, n = self.shape[-2:]
        return min(m, n) if self.is_dense else min(self.left.shape[-1], m, n)

    @property
    def uses_core(self) -> bool:
        """True when the spectrum comes from the small core (never the dense matrix)."""
        m, n = self.shape[-2:]
        return not self.is_dense and self.left.shape[-1] < min(m, n)

    def __getitem__(self, idx) -> QKForm:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) > len(self.batch_shape):
            raise IndexError(f"index {idx} has more dims than the batch shape {list(self.batch_shape)}")
        if self.is_dense:
            return QKForm(dense=self._dense[idx])
        return QKForm(left=self.left[idx], right=self.right[idx])

    @property
    def T(self) -> QKForm:
        """B^T = R L^T: the factors swap (no copy)."""
        if self.is_dense:
            return QKForm(dense=self._dense.transpose(-1, -2))
        return QKForm(left=self.right, right=self.left)

    def __matmul__(self, other: QKForm | torch.Tensor) -> QKForm:
        """B @ M, factored when either side is: (L R^T) M = L (M^T R)^T, and for two forms
        L1 (R1^T L2) R2^T, the small r1 x r2 middle folded into the narrower side."""
        if isinstance(other, torch.Tensor):
            if self.is_dense:
                return QKForm(dense=self._dense @ other)
            return QKForm(left=self.left, right=other.transpose(-1, -2) @ self.right)
        if not isinstance(other, QKForm):
            return NotImplemented
        if self.is_dense:
            return other.__rmatmul__(self._dense)
        if other.is_dense:
            return self @ other._dense
        middle = self.right.transpose(-1, -2) @ other.left  # [..., r1, r2]
        if self.left.shape[-1] <= other.left.shape[-1]:
            return QKForm(left=self.left, right=other.right @ middle.transpose(-1, -2))
        return QKForm(left=self.left @ middle, right=other.right)

    def __rmatmul__(self, other: torch.Tensor) -> QKForm:
        """M @ B = (M L) R^T."""
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        if self.is_dense:
            return QKForm(dense=other @ self._dense)
        return QKForm(left=other @ self.left, right=self.right)

    @cached_property
    def dense(self) -> torch.Tensor:
        """The matrix itself, [..., m, n]."""
        return self._dense if self.is_dense else self.left @ self.right.transpose(-1, -2)

    @property
    def B(self) -> torch.Tensor:
        """The matrix B itself (:attr:`dense`)."""
        return self.dense

    def at_offset(self, delta: int) -> QKForm:
        """B(delta), the form of a query and a key ``delta = j - i`` positions apart, for a head's
        form taken from a rotary model (``bilinear.heads``); the same B for other models."""
        if self._at_offset is None:
            raise ValueError("at_offset needs a head's form taken from a model (model.QK[l, h] or bilinear.qk_form)")
        return self._at_offset(delta)

    def bilinear(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """f_x(y) = x B y^T for rows x [..., nq, m] and y [..., nk, n] -> [..., nq, nk]; x and y
        broadcast against the batch shape (y defaults to x)."""
        y = x if y is None else y
        if self.is_dense:
            return x @ self._dense @ y.transpose(-1, -2)
        return (x @ self.left) @ (y @ self.right).transpose(-1, -2)

    # spectrum ----------------------------------------------------------------------------------
    @cached_property
    def _qr(self):
        Ql, Rl = linalg.qr(self.left)  # [..., m, r], [..., r, r]
        Qr, Rr = linalg.qr(self.right)
        return Ql, Rl, Qr, Rr

    @cached_property
    def core(self) -> torch.Tensor:
        """R_l R_r^T ([..., r, r]): B = Q_l core Q_r^T with Q_l, Q_r orthonormal columns."""
        _, Rl, _, Rr = self._qr
        return Rl @ Rr.transpose(-1, -2)

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(U [..., m, k], S [..., k], Vh [..., k, n]) with B = U diag(S) Vh; k = r on the
        factored path, min(m, n) on the dense one (computed once)."""
        return self._svd

    @cached_property
    def _svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self.uses_core:
            return linalg.svd(self.dense)
        Ql, _, Qr, _ = self._qr
        Uc, S, Vhc = linalg.svd(self.core)
        return Ql @ Uc, S, Vhc @ Qr.transpose(-1, -2)

    @cached_property
    def singular_values(self) -> torch.Tensor:
        """Descending, [..., k] (k = r factored: the rest are zero)."""
        if "_svd" in self.__dict__:
            return self._svd[1]
        return linalg.svdvals(self.core if self.uses_core else self.dense)

    @cached_property
    def eigenvalues(self) -> torch.Tensor:
        """Complex eigenvalues, by decreasing modulus. Factored: those of the r x r core
        W_K^T W_Q / sqrt(d_qk), which are the nonzero eigenvalues of B (plus zeros)."""
        self._need_square("eigenvalues")
        core = self.right.transpose(-1, -2) @ self.left if self.uses_core else self.dense
        ev = torch.linalg.eigvals(core)
        order = ev.abs().argsort(dim=-1, descending=True)
        return ev.gather(-1, order)

    @cached_property
    def symmetric(self) -> QKForm:
        """(B + B^T) / 2 = [L | R] [R | L]^T / 2, rank <= 2r."""
        self._need_square("a symmetric part")
        if self.is_dense:
            return QKForm(dense=(self._dense + self._dense.transpose(-1, -2)) / 2)
        return QKForm(left=torch.cat([self.left, self.right], -1), right=torch.cat([self.right, self.left], -1) / 2)

    @cached_property
    def antisymmetric(self) -> QKForm:
        """(B - B^T) / 2 = [L | R] [R | -L]^T / 2; f_x(x) does not see it."""
        self._need_square("an antisymmetric part")
        if self.is_dense:
            return QKForm(dense=(self._dense - self._dense.transpose(-1, -2)) / 2)
        return QKForm(left=torch.cat([self.left, self.right], -1), right=torch.cat([self.right, -self.left], -1) / 2)

    @cached_property
    def eigenvalues_sym(self) -> torch.Tensor:
        """Real eigenvalues of (B + B^T)/2, descending: the quadratic form x B x^T. Factored
        (2r < m): [L | R] = Q R_F and the eigenvalues of the symmetric core R_F J R_F^T."""
        sym = self.symmetric
        if sym.uses_core:
            F = sym.left  # [..., m, 2r]
            r = self.left.shape[-1]
            Q, RF = linalg.qr(F)
            eye = torch.eye(r, dtype=F.dtype, device=F.device)
            zero = torch.zeros_like(eye)
            J = torch.cat([torch.cat([zero, eye], -1), torch.cat([eye, zero], -1)], -2) / 2
            core = RF @ J @ RF.transpose(-1, -2)
            ev = linalg.eigvalsh((core + core.transpose(-1, -2)) / 2)
        else:
            ev = linalg.eigvalsh(sym.dense)
        return ev.flip(-1)

    def _need_square(self, what: str) -> None:
        m, n = self.shape[-2:]
        if m != n:
            raise ValueError(f"{what} needs a square matrix, this one is {m} x {n}")

    # norms and ranks ---------------------------------------------------------------------------
    @property
    def frobenius_norm(self) -> torch.Tensor:
        return self.singular_values.pow(2).sum(-1).sqrt()

    @property
    def spectral_norm(self) -> torch.Tensor:
        return self.singular_values[..., 0]

    @property
    def nuclear_norm(self) -> torch.Tensor:
        return self.singular_values.sum(-1)

    @property
    def stable_rank(self) -> torch.Tensor:
        """||B||_F^2 / ||B||_2^2 (0 for B = 0)."""
        s = self.singular_values
        top = s[..., 0].pow(2)
        return torch.where(top > 0, s.pow(2).sum(-1) / top.clamp_min(torch.finfo(s.dtype).tiny), torch.zeros_like(top))

    @property
    def effective_rank(self) -> torch.Tensor:
        """exp(H(sigma / sum sigma)) (Roy and Vetterli; 0 for B = 0)."""
        s = self.singular_values
        total = s.sum(-1, keepdim=True)
        p = s / total.clamp_min(torch.finfo(s.dtype).tiny)
        return torch.where(total[..., 0] > 0, metrics.entropy(p).exp(), torch.zeros_like(total[..., 0]))

    def __repr__(self) -> str:
        kind = "dense" if self.is_dense else f"factored r={self.left.shape[-1]}"
        return f"QKForm({kind}, shape={list(self.shape)})"
