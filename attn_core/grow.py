"""Growing the query/key width d_k of one attention head by functional gradient (seed 001).

Notation (shared/DESIGN.md, row vectors). For layer l, head h and a batch of n sequences b:

    X_b   [T, d']   attention input, augmented X' = [X | 1] when the model has q/k biases
                    (seed 001, Remark 1.2.2), so d' = d_model (+ 1)
    B'    [d', d']  the head's form W_Q' W_K'^T / sqrt(d_qk): the scores are S_b = X_b B' X_b^T
    G_b   [T, T]    dL/dS_b, the gradient of the task loss (mean cross-entropy on the batch) w.r.t.
                    the scores the softmax sees (1/sqrt(d_qk) included); zero on masked entries

**Descent target.** L(S + dS) = L(S) + <G, dS> + o(dS), so the scores should move to
T_b(eta) = S_b - eta G_b. (The published prototype used B := grad_S L + S, an ascent step of
size 1 taken on unscaled scores; here the step descends, lives in the same scaled S, and eta is
chosen by a line search on the actual loss.)

**Batch least squares, modulo per-query constants.** Softmax (and entmax) is invariant to adding
a constant to a row of S: only the visible entries of a query row, up to their mean, matter.
With C the operator that zeroes masked entries and centres every row over its visible keys,

    Z*(eta) = argmin_Z  sum_b || C(T_b(eta) - X_b Z X_b^T) ||_F^2.

The causal mask is the weight: masked entries have weight 0 (their target is irrelevant), visible
ones weight 1. Rows of G already sum to zero over the visible keys (shift invariance), so C G = G.
Because S_b = X_b B' X_b^T is fitted exactly by B', the problem is linear in eta:
Z*(eta) = B' - eta D with D the least-squares fit of G. The normal equations
sum_b X_b^T C(X_b D X_b^T) X_b = sum_b X_b^T G_b X_b do not separate over b (the seed's
Z* = X^+ B X^+^T is the single-sequence, unmasked, uncentred case), so they are vectorised: with
u_i the whitened query coordinates and w_j the whitened key coordinates of the rows (below),

    H = sum_b sum_i (u_i^T u_i) (x) K_bi,   K_bi = sum_{j vis} w_j^T w_j - m_bi^T m_bi / n_i,
    m_bi = sum_{j vis} w_j,  n_i = #visible keys of row i,   rhs = vec(sum_b U_b^T G_b W_b),

an (r_q r_k) x (r_q r_k) symmetric positive semi-definite system (``MAX_UNKNOWNS`` bounds it;
exact and dense rather than iterative because conjugate gradients needed thousands of
iterations on the zoo's ill-conditioned inputs). It is solved by Cholesky with a tiny relative
ridge lambda = ``RIDGE`` * tr(H) / dim, refined by ``REFINE_STEPS`` steps of iterated Tikhonov,
y <- y + (H + lambda I)^{-1} (rhs - H y): on a full-rank H that is the least-squares solution
(error ~ (lambda / e_min)^steps), on a singular H (too few distinct pairs of rows, as when a
task's inputs are a few tokens times a few positions) it is within ~1e-6 of the pseudo-inverse
(minimum-norm) solution. Both are tested.

**Damping.** Whitening gives every direction of the data the same weight, so the least-squares D
grows like 1/s^2 along directions the batch barely reaches and fits the batch's noise there: on
a converged zoo model (reverse-1l) the undamped step multiplied ||W_Q|| by 100 for a loss change
of 1e-8, and fine-tuning from it ended at a loss 100 times the baselines'. ``damping`` delta adds Levenberg-Marquardt's ridge on D itself,
lambda ||D||_F^2 with lambda = delta * tr(H_raw) / dim (H_raw: the normal matrix in the
coordinates of Z; ||D||_F^2 = sum Y_ac^2 / (s_qa s_kc)^2 in whitened ones). ``grow`` uses
``DAMPING``; the exact identities below are for delta = 0.

**Whitened basis.** The stacked rows X_s [N = n T, d'] give the query basis (SVD of X_s / sqrt(N),
rank r_q) and, because only key differences matter, the key basis from the centred rows
X_c = X_s - mean (rank r_k, one less under LayerNorm). Coordinates u = x V_q / s_q, w = x V_k / s_k
have identity second moments, and a form Z = (V_q / s_q) Y (V_k / s_k)^T has

    (1 / N^2) || X_s Z X_c^T ||_F^2 = || Y ||_F^2                       (exact)

so the Frobenius norm of the whitened Y is the mean square of the (key-centred) scores over
*every* pair of rows of the batch. Each basis is completed to all of R^d' with the directions no
row of the batch reaches, weighted by ``COMPLEMENT_WEIGHT`` * s_1: they cost almost nothing in the
metric, yet the form keeps what it does there (tokens absent from the batch, LayerNorm's
constant direction), so nothing the batch did not see is thrown away. The fit itself only has
unknowns on the batch's span.

**Rank d_k + p (Eckart-Young).** Y*(eta) = R_q B' R_k^T - eta Y_D, R = diag(s) V^T, is truncated by
its SVD to k = d_k + p singular values: Y_k = P_k diag(sigma_k) Q_k^T, and Remark 2.1 holds in
this metric,

    discarded_energy = sum_{i > k} sigma_i^2 = ||Y* - Y_k||_F^2 >= (1/N^2) ||X_s (Z* - Z_k) X_c^T||_F^2,

with equality when Z* - Z_k stays on the batch's span (the complement's share is weighted by
``COMPLEMENT_WEIGHT``^2). On the visible entries the score residual splits (Pythagoras, Z* being
the least-squares optimum, delta = 0)

    residual = fit_residual + truncation_residual,    n_vis * truncation_residual <= N^2 * discarded_energy

(residuals are means over the n_vis visible entries, centred per row). The seed's own recipe,
Eckart-Young on Z* itself (||Z* - Z_k||_F^2 = sum of discarded sigma^2 in Z-space, which is *not*
the score residual unless X has orthonormal columns) is ``basis="raw"``.

**The grown head.** d_qk becomes k, the model's scale 1/sqrt(k); with Z_k = M_q P_k diag(sigma) (M_k Q_k)^T,
W_Q' = k^(1/4) M_q P_k sigma^(1/2), W_K' = k^(1/4) M_k Q_k sigma^(1/2) (last row: the biases), so
W_Q' W_K'^T / sqrt(k) = Z_k. At eta = 0, Y* = R_q B' R_k^T has rank <= d_k <= k (R_q, R_k are
invertible) and truncation is exact: Z_k = B', so the scores, the attention and the model's
outputs are unchanged on every input. To first order in eta the truncated step keeps the whole
correction inside the old row/column spaces plus the p largest singular directions of the part
of Y_D outside them: the p new directions are the best rank-p descent directions the head lacks.

**Step size.** eta is in units of eta_ref, the step that moves the centred scores by their own
norm; the grid eta_ref * 2^j is searched for the least *actual* loss (the model run with the new
head) on a second batch of the training split, among the steps that pass Armijo's test on the
fitting batch (measured decrease >= ``ARMIJO`` * first-order predicted decrease -<G, dS>). The
second batch guards against fitting the first batch's noise (with one batch the chosen step
lowered the batch loss and raised the held-out loss); Armijo's test keeps eta where the linear
model that chose the directions still describes the loss.

**Baselines.** The same p columns initialised at zero (old columns rescaled by (k / d_k)^(1/4)
so the scores are exactly preserved) or at N(0, ``random_std``^2); every method is then
fine-tuned with the same Trainer, data seed and steps. Zero-initialised columns sit at a saddle
(both factors zero, so both gradients vanish): fine-tuning never moves them.
"""
from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator, Optional

import pandas as pd
import torch

from attn_core.bilinear import QKForm, augment, check_heads, check_layer
from attn_core.model import Transformer
from attn_core.tasks import Batch, Task
from attn_core.train import EVAL_SEED_OFFSET, Diverged, Trainer, TrainConfig, evaluate, select_device
from attn_core.hooks import act_name

BASES = ("whitened", "raw")
METHODS = ("grown", "random", "zero")
RIDGE = 1e-8
ARMIJO = 0.5  # sufficient decrease: at least half the first-order prediction
DAMPING = 1e-4  # Levenberg-Marquardt damping of the fit used by grow()
REFINE_STEPS = 3
RANK_RTOL = 1e-10  # singular values of the rows below this fraction of the largest are zero
COMPLEMENT_WEIGHT = 1e-6  # metric weight of directions no row reaches, relative to the largest
MAX_UNKNOWNS = 72 * 72  # r_q * r_k: H is dense, (r_q r_k)^2 float64 numbers
# the fitting and line-search batches share no stream with training, evaluation or each other
FIT_SEED_OFFSET = 3 * EVAL_SEED_OFFSET
SEARCH_SEED_OFFSET = 4 * EVAL_SEED_OFFSET


# --- the head's scores and their gradient ----------------------------------------------------------

def check_growable(model: Transformer, layer: int, head: int) -> int:
    """Validate layer/head; returns the head's current d_k."""
    check_layer(model, layer)
    check_heads(model, head)
    if model.cfg.qk != "factored":
        raise ValueError("this model has merged heads (one W_QK per head, any rank): there is no d_k to grow")
    return model.cfg.head_d_qk(layer, head)


@contextmanager
def score_offset(model: Transformer, layer: int, head: int, offset: torch.Tensor) -> Iterator[None]:
    """Within the block, head ``head`` of ``layer`` computes S + offset (offset [n, T, T]).
    Used on private copies only: L(S + offset) is the loss as a function of the scores."""
    attn = model.blocks[layer].attn
    plain = attn.scores

    def shifted(x: torch.Tensor) -> torch.Tensor:
        S = plain(x).clone()  # [n, heads, T, T]
        S[:, head] = S[:, head] + offset
        return S

    attn.scores = shifted  # an instance attribute shadows the method
    try:
        yield
    finally:
        del attn.scores


@dataclass
class HeadBatch:
    """What one head sees on a batch, in float64: X (augmented when the model has biases), its
    scores S = X B' X^T, G = dL/dS and the loss. ``model`` is a private float64 copy."""

    model: Transformer
    task: Task
    batch: Batch
    layer: int
    head: int
    X: torch.Tensor  # [n, T, d']
    S: torch.Tensor  # [n, T, T]
    G: torch.Tensor  # [n, T, T]
    mask: torch.Tensor  # [T, T] bool, True where a key is visible
    loss: float
    augmented: bool

    def loss_with(self, delta_scores: torch.Tensor) -> float:
        """The task loss on the batch when the head's scores are S + delta_scores."""
        with torch.no_grad(), score_offset(self.model, self.layer, self.head, delta_scores):
            return self.task.loss(self.model(self.batch.tokens), self.batch).item()


def head_batch(model: Transformer, task: Task, batch: Batch, layer: int, head: int) -> HeadBatch:
    """Forward the batch through a float64 copy and take G = dL/dS of one head by autograd on an
    offset added to its scores (so G is the gradient w.r.t. exactly what the softmax sees)."""
    check_growable(model, layer, head)
    m = copy.deepcopy(model).double().eval()
    device = m.embed.W_E.device
    batch = batch.to(device)
    n, T = batch.tokens.shape
    offset = torch.zeros(n, T, T, dtype=torch.float64, device=device, requires_grad=True)
    cache: dict = {}
    with score_offset(m, layer, head, offset):
        logits = m(batch.tokens, cache=cache)
    loss = task.loss(logits, batch)
    (G,) = torch.autograd.grad(loss, offset)
    for p in m.parameters():
        p.requires_grad_(False)
    X = cache[act_name("attn_in", layer)].detach()
    augmented = model.cfg.attn_bias
    return HeadBatch(m, task, batch, layer, head, augment(X) if augmented else X,
                     cache[act_name("attn_scores", layer)][:, head].detach(), G,
                     m.causal[:T, :T], loss.item(), augmented)


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
    def of_rows(cls, rows: torch.Tensor, centre: bool, rtol: float = RANK_RTOL) -> "Basis":
        A = rows - rows.mean(0) if centre else rows
        _, s, Vh = torch.linalg.svd(A / math.sqrt(rows.shape[0]), full_matrices=True)
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
        return self.lift[:, :self.rank]

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


def fit_scores(X: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, centre: bool = True,
               ridge: float = RIDGE, damping: float = 0.0) -> ScoreFit:
    """Solve the batch normal equations (module doc) for ``X`` [n, T, d'], ``target`` [n, T, T]
    and ``mask`` [T, T]. ``centre=False`` fits the raw visible entries (the seed's problem)."""
    rows = X.reshape(-1, X.shape[-1])
    q = Basis.of_rows(rows, centre=False)
    k = Basis.of_rows(rows, centre=centre) if centre else q
    if q.rank * k.rank > MAX_UNKNOWNS:
        raise ValueError(f"the attention input spans {q.rank} dimensions: the exact fit would solve for "
                         f"{q.rank * k.rank} unknowns, more than {MAX_UNKNOWNS} (d_model up to about "
                         f"{math.isqrt(MAX_UNKNOWNS)}); use a smaller model")
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
        inv = (1 / (q.s[:q.rank, None] * k.s[None, :k.rank]) ** 2).reshape(-1)
        lam = damping * (H.diagonal() / inv).sum() / inv.numel()
        H = H + lam * torch.diag(inv)
    return ScoreFit(solve_psd(H, rhs, ridge).reshape(rq, rk), q, k, centre)


def scores_of(X: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
    """X_b Z X_b^T for every sequence, [n, T, T]."""
    return X @ Z @ X.transpose(-1, -2)


# --- one growth step ---------------------------------------------------------------------------------

@dataclass
class Step:
    """The rank-k fit of the descent target at step size eta and everything measured about it."""

    eta: float
    singular_values: torch.Tensor  # of the target form in the chosen basis, descending
    kept: int  # k = d_k + p
    Z: torch.Tensor  # [d', d'] rank <= k: the grown head's scores are X Z X^T
    W_Q: torch.Tensor  # [d', k], W_Q W_K^T / sqrt(k) = Z
    W_K: torch.Tensor
    delta_scores: torch.Tensor  # [n, T, T], X (Z - B') X^T
    predicted_decrease: float  # -<G, delta_scores>
    discarded_energy: float  # sum of the discarded sigma_i^2
    fit_residual: float  # mean over visible entries of C(T - X Z* X^T)^2
    residual: float  # the same for Z
    truncation_residual: float  # mean of C(X (Z* - Z) X^T)^2

    @property
    def total_energy(self) -> float:
        return float(self.singular_values.pow(2).sum())

    def captured_share(self, d_k: int) -> float:
        """Of the energy beyond the old width (sum_{i > d_k} sigma_i^2), the part the p new
        directions hold: sum_{d_k < i <= k} sigma_i^2 / sum_{i > d_k} sigma_i^2 (1 when none is left)."""
        beyond = float(self.singular_values[d_k:].pow(2).sum())
        # beyond the old width Z* is zero at eta = 0: rounding there is not energy to share
        if beyond <= 1e-20 * self.total_energy:
            return 1.0
        return 1.0 - self.discarded_energy / beyond


class Growth:
    """Growing head ``head`` of ``layer`` by ``add`` = p query/key dimensions on one batch.
    ``step(eta)`` is the rank-(d_k + p) fit of the descent target S - eta G; ``line_search`` picks
    eta on the actual loss; ``grown_model(step)`` builds the wider model."""

    def __init__(self, model: Transformer, task: Task, batch: Batch, layer: int, head: int, add: int,
                 basis: str = "whitened", val_batch: Optional[Batch] = None, damping: float = 0.0):
        d_k = check_growable(model, layer, head)
        if basis not in BASES:
            raise ValueError(f"basis must be one of {BASES}, got {basis!r}")
        d_aug = model.cfg.d_model + model.cfg.attn_bias
        top = d_aug - d_k
        if top < 1:
            raise ValueError(f"head {head} of layer {layer} is already {d_k} wide, as wide as its input ({d_aug}): "
                             "nothing to grow")
        if not isinstance(add, int) or isinstance(add, bool) or not 1 <= add <= top:
            raise ValueError(f"add (p) must be 1..{top} (d_k = {d_k}, input width {d_aug}), got {add!r}")
        self.source, self.layer, self.head, self.add, self.d_k, self.basis = model, layer, head, add, d_k, basis
        self.kept = d_k + add
        self.hb = hb = head_batch(model, task, batch, layer, head)
        # the line search judges steps on a second batch: the fit has up to d'^2 parameters and
        # follows the fitting batch's own noise when eta is large
        self.val = head_batch(model, task, val_batch, layer, head) if val_batch is not None else None
        self.B = QKForm.from_layer(hb.model, layer, hb.augmented)[head].dense  # [d', d'], S = X B X^T
        self.fit = fit_scores(hb.X, hb.G, hb.mask, damping=damping)  # D = fit.Z: the least-squares image of G
        self.B_hat = self.fit.q.metric @ self.B @ self.fit.k.metric.T  # B' in whitened coordinates
        self.n_visible = hb.X.shape[0] * int(hb.mask.sum())
        scale = centre_rows(scores_of(hb.X, self.fit.Z), hb.mask).norm()
        # eta_ref moves the (centred) scores by their own size: a scale-free unit for the line search
        self.eta_ref = float(centre_rows(hb.S, hb.mask).norm() / scale) if scale > 0 else 0.0

    @property
    def loss(self) -> float:
        return self.hb.loss

    @property
    def n_rows(self) -> int:
        return self.hb.X.shape[0] * self.hb.X.shape[1]

    def step(self, eta: float) -> Step:
        """Z*(eta) = B' - eta D truncated to rank k = d_k + p in the chosen basis, factored into
        W_Q, W_K for the new scale 1/sqrt(k), with its residuals and predicted decrease."""
        hb, fit, k = self.hb, self.fit, self.kept
        if self.basis == "whitened":
            Y = self.B_hat - eta * fit.Y_full
            left, sigma, right = low_rank(Y, k)
            left, right = fit.q.lift @ left, fit.k.lift @ right
            Z_star = fit.q.lift @ Y @ fit.k.lift.T
        else:
            Z_star = self.B - eta * fit.Z
            left, sigma, right = low_rank(Z_star, k)
        # the model divides by sqrt(k): k^(1/4) on each factor keeps W_Q W_K^T / sqrt(k) = Z
        W_Q, W_K = left * k ** 0.25, right * k ** 0.25
        Z = W_Q @ W_K.T / math.sqrt(k)
        target = hb.S - eta * hb.G
        delta = scores_of(hb.X, Z - self.B)

        def mean_sq(A: torch.Tensor) -> float:
            return float(centre_rows(A, hb.mask).pow(2).sum() / self.n_visible)

        return Step(
            eta=eta, singular_values=sigma, kept=k, Z=Z, W_Q=W_Q, W_K=W_K, delta_scores=delta,
            predicted_decrease=float(-(hb.G * delta).sum()),
            discarded_energy=float(sigma[k:].pow(2).sum()),
            fit_residual=mean_sq(target - scores_of(hb.X, Z_star)),
            residual=mean_sq(target - scores_of(hb.X, Z)),
            truncation_residual=mean_sq(scores_of(hb.X, Z_star - Z)))

    def loss_at(self, step: Step) -> float:
        """The actual loss on the fitting batch with the head's scores replaced by X Z X^T."""
        return self.hb.loss_with(step.delta_scores)

    def val_loss_at(self, step: Step) -> float:
        """The same on the line-search batch (the fitting batch when there is none)."""
        if self.val is None:
            return self.loss_at(step)
        return self.val.loss_with(scores_of(self.val.X, step.Z - self.B))

    def line_search(self, grid: int = 19, top: int = 0) -> tuple[Step, pd.DataFrame]:
        """Line search on a grid: eta = 0 and eta = eta_ref * 2^j, j = top - grid + 1, ..., top.
        A step is admissible when it passes Armijo's test on the fitting batch, measured decrease
        >= ``ARMIJO`` * first-order predicted decrease (beyond that the linear model that chose the
        directions no longer describes the loss); of the admissible steps the one of least actual
        loss on the line-search batch is taken. Returns it and the table (eta, eta / eta_ref,
        loss, measured and predicted decrease on the fitting batch, armijo, val_loss on the
        line-search batch, discarded energy, residual)."""
        if not isinstance(grid, int) or grid < 1:
            raise ValueError(f"grid must be a positive integer, got {grid!r}")
        etas = [0.0] + ([self.eta_ref * 2.0 ** (top - j) for j in range(grid)][::-1] if self.eta_ref > 0 else [])
        rows, best, best_loss = [], None, math.inf
        for eta in etas:
            step = self.step(eta)
            loss = self.loss_at(step)
            val_loss = self.val_loss_at(step)
            measured = self.loss - loss
            armijo = eta == 0 or (step.predicted_decrease > 0 and measured >= ARMIJO * step.predicted_decrease)
            rows.append(dict(eta=eta, eta_rel=eta / self.eta_ref if self.eta_ref else 0.0, loss=loss,
                             measured_decrease=measured, predicted_decrease=step.predicted_decrease, armijo=armijo,
                             val_loss=val_loss, discarded_energy=step.discarded_energy, residual=step.residual))
            if armijo and val_loss < best_loss:  # ties keep the smaller step
                best, best_loss = step, val_loss
        return best, pd.DataFrame(rows)

    def grown_model(self, step: Step) -> Transformer:
        """The source model with this head d_k + p wide, holding ``step``'s factors (float32)."""
        return with_head(self.source, self.layer, self.head, step.W_Q, step.W_K)


def low_rank(Y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eckart-Young: Y = P diag(sigma) Q^T; returns (P_k sigma_k^(1/2), sigma, Q_k sigma_k^(1/2)), the
    factors padded with zero columns to k when Y has fewer singular values, so that
    ||Y - left right^T||_F^2 = sum_{i > k} sigma_i^2 is the least over rank <= k."""
    P, sigma, Qh = torch.linalg.svd(Y, full_matrices=False)
    root = sigma[:k].sqrt()
    pad = k - root.shape[0]
    left = torch.nn.functional.pad(P[:, :k] * root, (0, pad))
    right = torch.nn.functional.pad(Qh[:k].T * root, (0, pad))
    return left, sigma, right


# --- wider models -------------------------------------------------------------------------------------

def with_head(model: Transformer, layer: int, head: int, W_Q: torch.Tensor, W_K: torch.Tensor) -> Transformer:
    """A copy of ``model`` whose head has d_qk = W_Q.shape[1] and factors W_Q, W_K ([d', k], the
    last row the biases when the model has them); every other weight is copied, the config updated."""
    cfg = model.cfg
    k = W_Q.shape[1]
    widths = [[cfg.head_d_qk(l, h) for h in range(cfg.n_heads)] for l in range(cfg.n_layers)]
    widths[layer][head] = k
    new = Transformer(replace(cfg, d_qk=widths)).to(model.embed.W_E.device)
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    width = new.cfg.qk_width(layer)
    d = cfg.d_model
    for name, W in (("W_Q", W_Q), ("W_K", W_K)):
        key = f"blocks.{layer}.attn.{name}"
        t = torch.nn.functional.pad(state[key], (0, width - state[key].shape[-1]))
        t[head] = 0
        t[head, :, :k] = W[:d].to(t)
        state[key] = t
        if cfg.attn_bias:
            bkey = f"blocks.{layer}.attn.b_{name[-1]}"
            b = torch.nn.functional.pad(state[bkey], (0, width - state[bkey].shape[-1]))
            b[head] = 0
            b[head, :k] = W[d].to(b)
            state[bkey] = b
    new.load_state_dict(state)
    new.zero_qk_padding()
    return new.eval()


def widen(model: Transformer, layer: int, head: int, add: int, init: str = "zero", std: float = 0.02,
          seed: int = 0) -> Transformer:
    """The baselines: the head's old columns rescaled by ((d_k + p) / d_k)^(1/4) (so the old scores are
    exactly kept under the new 1/sqrt(d_k + p)) and p new columns of W_Q, W_K (and biases) at zero or
    N(0, std^2) (seeded)."""
    d_k = check_growable(model, layer, head)
    if init not in ("zero", "random"):
        raise ValueError(f"init must be 'zero' or 'random', got {init!r}")
    if not (isinstance(std, (int, float)) and math.isfinite(std) and std >= 0):
        raise ValueError(f"std must be a finite number >= 0, got {std!r}")
    attn = model.blocks[layer].attn
    k = d_k + add
    rescale = (k / d_k) ** 0.25
    W = {}
    g = torch.Generator().manual_seed(int(seed))
    for name in ("Q", "K"):
        old = getattr(attn, f"W_{name}")[head, :, :d_k].detach().cpu()
        if model.cfg.attn_bias:
            old = torch.cat([old, getattr(attn, f"b_{name}")[head, None, :d_k].detach().cpu()])
        new = torch.zeros(old.shape[0], add)
        if init == "random":
            new.normal_(0.0, std, generator=g)
        W[name] = torch.cat([old * rescale, new], dim=1)
    return with_head(model, layer, head, W["Q"], W["K"])


# --- the whole comparison -------------------------------------------------------------------------------

@dataclass
class GrowConfig:
    """Settings of :func:`grow`. ``batch`` sequences of the task's training split (seed
    ``seed`` + FIT_SEED_OFFSET) are fitted; the line search tries ``grid`` step sizes; every
    method is then fine-tuned ``steps`` steps (AdamW, constant ``lr``, no weight decay, batches of
    ``finetune_batch`` drawn with ``seed``) and evaluated on ``eval_samples`` held-out sequences
    every ``eval_every`` steps. CPU defaults keep a zoo model under a minute."""

    layer: int = 0
    head: int = 0
    add: int = 1
    batch: int = 32
    seed: int = 0
    basis: str = "whitened"
    grid: int = 19
    steps: int = 100
    lr: float = 1e-3
    finetune_batch: int = 32
    eval_samples: int = 256
    eval_every: int = 10
    random_std: float = 0.02
    damping: float = DAMPING
    device: str = "cpu"

    def __post_init__(self) -> None:
        def positive(name: str, top: int) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= top:
                raise ValueError(f"{name} must be an integer in 1..{top}, got {v!r}")

        for name, top in (("batch", 4096), ("grid", 64), ("steps", 100_000), ("finetune_batch", 4096),
                          ("eval_samples", 65536), ("eval_every", 100_000)):
            positive(name, top)
        if not isinstance(self.add, int) or isinstance(self.add, bool):
            raise ValueError(f"add must be an integer (1..d_model - d_k), got {self.add!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.basis not in BASES:
            raise ValueError(f"basis must be one of {BASES}, got {self.basis!r}")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr <= 1):
            raise ValueError(f"lr must be in (0, 1], got {self.lr!r}")
        if not (isinstance(self.random_std, (int, float)) and 0 <= self.random_std <= 10):
            raise ValueError(f"random_std must be in [0, 10], got {self.random_std!r}")
        if not (isinstance(self.damping, (int, float)) and 0 <= self.damping <= 1):
            raise ValueError(f"damping must be in [0, 1], got {self.damping!r}")

    def train_config(self) -> TrainConfig:
        return TrainConfig(steps=self.steps, batch_size=self.finetune_batch, lr=self.lr, weight_decay=0.0,
                           warmup_steps=0, min_lr_ratio=1.0, eval_every=self.eval_every,
                           eval_samples=self.eval_samples, seed=self.seed, device=self.device)


@dataclass
class GrowResult:
    """Everything :func:`grow` measured. Losses named ``loss_*`` are held-out (``eval_samples``
    test sequences, the same for every method); ``batch_loss_*`` are on the fitting batch, where
    the predicted (first-order) and measured decreases are compared."""

    config: GrowConfig
    d_k: int
    kept: int
    augmented: bool
    data_rank: tuple[int, int]  # (r_q, r_k)
    step: Step
    eta_ref: float
    line_search: pd.DataFrame
    batch_loss_before: float
    batch_loss_after_step: float
    loss_before: float
    methods: dict[str, dict]  # method -> loss_after_init, loss_after_finetune, accuracy..., note
    curves: pd.DataFrame  # method, step, eval_loss, train_loss
    models: dict[str, Transformer]  # "grown" (after the step) and "<method>_finetuned"
    original: Transformer

    @property
    def measured_decrease(self) -> float:
        return self.batch_loss_before - self.batch_loss_after_step

    def summary(self) -> dict:
        """The JSON document of ``attn-lab grow``."""
        s, g = self.step, self.methods["grown"]
        return {
            "layer": self.config.layer, "head": self.config.head, "add": self.config.add, "d_k": self.d_k,
            "d_k_new": self.kept, "basis": self.config.basis, "augmented": self.augmented,
            "data_rank": list(self.data_rank), "batch": self.config.batch, "seed": self.config.seed,
            "damping": self.config.damping,
            "singular_values_Z": s.singular_values.tolist(), "kept": self.kept,
            "residual": s.residual, "fit_residual": s.fit_residual, "truncation_residual": s.truncation_residual,
            "discarded_energy": s.discarded_energy,
            "discarded_share": s.discarded_energy / s.total_energy if s.total_energy > 0 else 0.0,
            "captured_share": s.captured_share(self.d_k),
            "eta": s.eta, "eta_ref": self.eta_ref,
            "predicted_decrease": s.predicted_decrease, "measured_decrease": self.measured_decrease,
            "batch_loss_before": self.batch_loss_before, "batch_loss_after_step": self.batch_loss_after_step,
            "loss_before": self.loss_before, "loss_after_step": g["loss_after_init"],
            "loss_after_finetune": g["loss_after_finetune"],
            "accuracy_after_finetune": g["accuracy_after_finetune"],
            "baselines": {m: dict(self.methods[m]) for m in ("random", "zero")},
            "finetune_steps": self.config.steps,
        }


def finetune(model: Transformer, task: Task, cfg: TrainConfig) -> tuple[Transformer, pd.DataFrame, str]:
    """Train a copy with the existing Trainer; the curve has the held-out loss at step 0 and every
    ``eval_every`` steps and the training-batch loss every step. A divergence keeps the last good
    weights and is reported in the note."""
    rows: list[dict] = []
    trainer = Trainer(copy.deepcopy(model), task, cfg, callbacks=[rows.append])
    start = evaluate(trainer.model, task, cfg.eval_samples, cfg.seed)
    rows.insert(0, {"step": 0, "eval_loss": start["loss"], "eval_accuracy": start["accuracy"]})
    note = ""
    try:
        trainer.run()
    except Diverged as e:
        trainer.restore_good()
        note = str(e)
    curve = pd.DataFrame([{"step": r["step"], "train_loss": r.get("task_loss"), "eval_loss": r.get("eval_loss"),
                           "eval_accuracy": r.get("eval_accuracy")} for r in rows])
    return trainer.model.eval(), curve, note


def grow(model: Transformer, task: Task, cfg: GrowConfig) -> GrowResult:
    """Grow head (cfg.layer, cfg.head) by cfg.add dimensions along the functional gradient, pick the
    step by line search, then compare with zero and random growth under the same fine-tuning."""
    if model.cfg.d_vocab != task.d_vocab or model.cfg.n_ctx < task.n_ctx:
        raise ValueError(f"model (d_vocab={model.cfg.d_vocab}, n_ctx={model.cfg.n_ctx}) does not fit task "
                         f"{task.name!r} (d_vocab={task.d_vocab}, n_ctx={task.n_ctx})")
    train_cfg = cfg.train_config()
    model = copy.deepcopy(model).to(select_device(cfg.device)).float().eval()
    batch = task.sample(cfg.batch, cfg.seed + FIT_SEED_OFFSET, split="train")
    search = task.sample(cfg.batch, cfg.seed + SEARCH_SEED_OFFSET, split="train")
    growth = Growth(model, task, batch, cfg.layer, cfg.head, cfg.add, cfg.basis, val_batch=search,
                    damping=cfg.damping)
    step, table = growth.line_search(cfg.grid)
    starts = {"grown": growth.grown_model(step),
              "random": widen(model, cfg.layer, cfg.head, cfg.add, "random", cfg.random_std, cfg.seed),
              "zero": widen(model, cfg.layer, cfg.head, cfg.add, "zero")}
    before = evaluate(model, task, cfg.eval_samples, cfg.seed)
    methods, curves, models = {}, [], {"grown": starts["grown"]}
    for name in METHODS:
        tuned, curve, note = finetune(starts[name], task, train_cfg)
        evals = curve.dropna(subset=["eval_loss"])
        methods[name] = {"loss_after_init": float(evals["eval_loss"].iloc[0]),
                         "loss_after_finetune": float(evals["eval_loss"].iloc[-1]),
                         "accuracy_after_init": float(evals["eval_accuracy"].iloc[0]),
                         "accuracy_after_finetune": float(evals["eval_accuracy"].iloc[-1]), "note": note}
        curves.append(curve.assign(method=name))
        models[f"{name}_finetuned"] = tuned
    return GrowResult(
        config=cfg, d_k=growth.d_k, kept=growth.kept, augmented=growth.hb.augmented,
        data_rank=(growth.fit.q.rank, growth.fit.k.rank), step=step, eta_ref=growth.eta_ref, line_search=table,
        batch_loss_before=growth.loss, batch_loss_after_step=growth.loss_at(step), loss_before=before["loss"],
        methods=methods, curves=pd.concat(curves, ignore_index=True), models=models, original=model)
