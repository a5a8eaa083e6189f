"""Growing the query/key width d_k of one attention head by functional gradient.

Notation (docs/maths.md, row vectors). For layer l, head h and a batch of n sequences b:

    X_b   [T, d']   attention input, augmented X' = [X | 1] when the model has q/k biases
                    (Remark 1.2.2), so d' = d_model (+ 1)
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

The modules: ``fit`` (batch least squares in the whitened basis, Eckart-Young), ``growth`` (a
head's scores and their gradient, the growth step, its line search, wider models and the
baselines), ``config`` (GrowConfig, the settings; no torch), ``run`` (fine-tuning through
``attn_core.training.record`` and :func:`grow`, the whole comparison).
"""

from attn_core import lazy
from attn_core.grow.config import BASES, DAMPING, GrowConfig

__getattr__, __dir__ = lazy.exports(
    __name__,
    {
        "fit": (
            "COMPLEMENT_WEIGHT",
            "MAX_UNKNOWNS",
            "RANK_RTOL",
            "REFINE_STEPS",
            "RIDGE",
            "Basis",
            "ScoreFit",
            "centre_rows",
            "fit_scores",
            "low_rank",
            "scores_of",
            "solve_psd",
        ),
        "growth": (
            "ARMIJO",
            "FIT_SEED_OFFSET",
            "SEARCH_SEED_OFFSET",
            "Growth",
            "HeadBatch",
            "Step",
            "check_growable",
            "head_batch",
            "score_offset",
            "widen",
            "with_head",
        ),
        "run": ("METHODS", "GrowResult", "finetune", "grow"),
    },
)

__all__ = [
    "ARMIJO",
    "BASES",
    "COMPLEMENT_WEIGHT",
    "DAMPING",
    "FIT_SEED_OFFSET",
    "MAX_UNKNOWNS",
    "METHODS",
    "RANK_RTOL",
    "REFINE_STEPS",
    "RIDGE",
    "SEARCH_SEED_OFFSET",
    "Basis",
    "GrowConfig",
    "GrowResult",
    "Growth",
    "HeadBatch",
    "ScoreFit",
    "Step",
    "centre_rows",
    "check_growable",
    "finetune",
    "fit_scores",
    "grow",
    "head_batch",
    "low_rank",
    "score_offset",
    "scores_of",
    "solve_psd",
    "widen",
    "with_head",
]
