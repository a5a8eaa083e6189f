"""A head's modes, and B edited mode by mode on the head's own factors (docs/maths.md, "Surgery").

**Modes.** A plain head's modes are the singular pairs of ``B = W_Q W_K^T / sqrt(d_qk) =
U diag(sigma) V^T`` (``QKForm.svd()``, from the head's own d_qk columns), strongest first; a merged
head's, those of ``W_QK``. A rotary head has no one B (each key sits at its own offset): its modes
are its rotation planes, as ``attribute`` splits the score (plane c = dims (c, c + r/2), then the
offset-free dims past r as one mode), indexed in that order; a plane's ``sigma`` is the Frobenius
norm of its part of B at offset 0, ``||W_Q[:, p] W_K[:, p]^T||_F / sqrt(d_qk)``.

**An edit** is one factor per mode, ``f`` (1 keeps a mode, 0 drops it, any other number scales
it): ``B' = U diag(f sigma) V^T``. It is written into the head's **query** weights alone, the
model keeping its shape (W_Q' has the same d_head), W_K and the biases unchanged:

    W_Q' = W_Q + U diag((f - 1) sigma) V^T pinv(W_K^T) sqrt(d_qk)

so that ``W_Q' W_K^T / sqrt(d_qk) = B'`` (the rows of V^T lie in W_K's column space: V^T
pinv(W_K^T) W_K^T = V^T). Putting the whole edit on the query side is what grouped-query attention
needs: W_K is shared by the query heads of a key/value group, so an edit that touched it would
change them all; W_Q[h] is the head's own. The biases are kept: the score's key side
``y W_K + b_K`` is unchanged, and its query side ``x W_Q' + b_Q`` carries the edited B. A rotary
head's plane c is scaled by multiplying its two query columns by f_c (the rotation acts within the
plane, so this scales that plane's term of every score, as ``attribute`` measures it). A merged
head's ``W_QK`` is B itself: ``W_QK' = W_QK + U diag((f - 1) sigma) V^T``. All in float64, written
back in the model's dtype; a factor vector of ones changes no weight.

**QK-norm.** A normed head's score is ``g_q(i) g_k(j) x_i B~ x_j^T`` with gains 1/rms of the
un-normed q and k (docs/maths.md): its modes are those of the core B~ (the norm weights folded
in). The gains are taken before the norm weight, so an edit written into W_Q would change them;
with QK-norm across heads (OLMo 2) each query head has its own slice of the q_norm weight, after
the gain, and an edit is written there instead: a plane's two entries times f_c (rotary heads), or
the whole slice times f when every mode is scaled alike (``edit`` refuses the rest). A per-head
norm's weight is shared by the layer's heads, so no weight of one head alone can carry an edit.

An MLA head's (multi-head latent attention, attn_core/model/mla.py) modes are the singular pairs
of its absorbed B in residual-stream terms (the no-position term; the latent norms' gains come
before the up-projections, so an edit of B is the edit of that term of every score, and the
decoupled rotary term is kept); the edit is written into the head's own query up-projection W_UQ^h
(q_b_proj's rows of that head, :meth:`attn_core.model.mla.MLAScore.edited`), so no other head's B
changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_core.bilinear import QKForm
from attn_core.model import Transformer


@dataclass(frozen=True)
class Modes:
    """A head's modes: ``sigma`` [k] (float64, CPU), ``kind`` "singular" or "plane" and a name per mode."""

    layer: int
    head: int
    kind: str
    sigma: torch.Tensor
    names: list[str]

    @property
    def k(self) -> int:
        return len(self.names)


def planes(model: Transformer) -> list[list[int]]:
    """The query/key columns of each rotation plane of a rotary head (``attribute``'s order)."""
    cfg = model.cfg
    r, half = cfg.rotary_dims, cfg.rotary_dims // 2
    return [[c, c + half] for c in range(half)] + ([list(range(r, cfg.d_head))] if r < cfg.d_head else [])


def _factors(model: Transformer, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(W_Q [d, w], W_K [d, w], 1/sqrt(w)) of one factored head, its own w columns, float64; with
    QK-norm the core's (the norm weights folded in) and its own scale."""
    form = model.blocks[layer].attn.form(head)
    if form.norm != "none":
        core = form.core()
        return core.left.detach().double(), core.right.detach().double(), 1.0
    W_Q, W_K = form.factors(own=True)
    return W_Q.detach().double(), W_K.detach().double(), W_Q.shape[-1] ** -0.5


def head_form64(model: Transformer, layer: int, head: int) -> QKForm:
    """B of one head at offset 0 in float64: factored (own columns, scale in the left factor) or dense."""
    if model.cfg.qk == "merged":
        return QKForm(dense=model.blocks[layer].attn.form(head).core().dense.detach().double())
    if model.cfg.mla:  # the absorbed B, its own scale
        core = model.blocks[layer].attn.form(head).core()
        return QKForm(left=core.left.detach().double(), right=core.right.detach().double())
    W_Q, W_K, s = _factors(model, layer, head)
    return QKForm(left=W_Q * s, right=W_K)


def head_modes(model: Transformer, layer: int, head: int) -> Modes:
    """The modes of head (layer, head) (module doc)."""
    if model.cfg.positional == "rotary" and not model.cfg.mla:
        W_Q, W_K, s = _factors(model, layer, head)
        sig = [float((W_Q[:, p] @ W_K[:, p].T).norm() * s) for p in planes(model)]
        half = model.cfg.rotary_dims // 2
        names = [f"plane {c}" if c < half else "offset-free dims" for c in range(len(sig))]
        return Modes(layer, head, "plane", torch.tensor(sig, dtype=torch.float64, device="cpu"), names)
    S = head_form64(model, layer, head).singular_values.cpu()
    return Modes(layer, head, "singular", S, [f"σ{i + 1}" for i in range(len(S))])


def mode_factors(
    modes: Modes, rank: int | None = None, drop: tuple[int, ...] = (), scale: tuple[tuple[int, float], ...] = ()
) -> torch.Tensor:
    """One factor per mode [k] (float64): the ``rank`` strongest modes kept (by sigma; all when
    None), the modes in ``drop`` set to 0, those of ``scale`` multiplied by their factor.
    Indices and ranks are checked here (one ValueError sentence)."""
    k, who = modes.k, f"L{modes.layer}H{modes.head}"
    what = "rotation planes" if modes.kind == "plane" else "singular modes"
    f = torch.ones(k, dtype=torch.float64, device=modes.sigma.device)
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= k:
            raise ValueError(f"--rank {rank!r} is out of range: {who} has {k} {what} (rank 1..{k})")
        order = modes.sigma.argsort(descending=True, stable=True)
        f[order[rank:]] = 0.0
    for i in list(drop) + [i for i, _ in scale]:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < k:
            raise ValueError(f"mode index {i!r} is out of range: {who} has {k} {what} (modes 0..{k - 1})")
    f[list(drop)] = 0.0
    for i, v in scale:
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v or abs(v) == float("inf"):
            raise ValueError(f"the scale of mode {i} must be a finite number, got {v!r}")
        f[i] = f[i] * float(v)
    return f


@torch.no_grad()
def apply_factors(model: Transformer, layer: int, head: int, f: torch.Tensor) -> None:
    """Edit head (layer, head) of ``model`` in place so that its modes are multiplied by ``f``
    (module doc); nothing is written when every factor is 1."""
    f = f.detach().to(torch.float64).cpu()
    if bool((f == 1).all()):
        return
    attn = model.blocks[layer].attn
    old = attn.form(head)  # written back through the attention module: set_form
    if model.cfg.mla:
        U, S, Vh = head_form64(model, layer, head).svd()
        attn.set_form(old.edited((U * ((f.to(S.device) - 1) * S)) @ Vh), head)
        return
    if old.norm == "all":  # into the head's slice of the q_norm weight, after the gain (module doc)
        dh, w = model.cfg.d_head, old.norm_q.detach().clone()
        groups = planes(model) if model.cfg.positional == "rotary" else [list(range(dh))]
        if len(groups) == 1 and len(f) > 1:  # singular modes: every one scaled alike (edit checks it)
            f = f[:1]
        for c, p in enumerate(groups):
            idx = [head * dh + i for i in p]
            w[idx] = (w[idx].double() * f[c]).to(w.dtype)
        attn.set_form(old.replace(norm_q=w), head)
        return
    if model.cfg.positional == "rotary":
        w = old.left.detach().clone()
        for c, p in enumerate(planes(model)):
            w[head, :, p] = (w[head, :, p].double() * f[c]).to(w.dtype)
        attn.set_form(old.replace(left=w), head)
        return
    form = head_form64(model, layer, head)
    U, S, Vh = form.svd()  # [d, k], [k], [k, d]
    delta_core = (f.to(S.device) - 1) * S  # [k]
    if old.merged:
        W = old.dense.detach().clone()
        W[head] = (W[head].double() + (U * delta_core) @ Vh).to(W.dtype)
        attn.set_form(old.replace(dense=W), head)
        return
    W_Q, W_K, s = _factors(model, layer, head)
    back = Vh @ torch.linalg.pinv(W_K.T)  # [k, w]: V^T pinv(W_K^T)
    new = W_Q + (U * delta_core) @ back / s
    left = old.left.detach().clone()
    left[head, :, : new.shape[-1]] = new.to(left.dtype)
    attn.set_form(old.replace(left=left), head)
