"""The algebra of one softmax-attention head: what it can and cannot do.

One query q in R^d attends over keys k_1..k_n (rows of K) and values v_1..v_n (rows of V):

    alpha_i = exp(k_i^T q) / sum_j exp(k_j^T q)          c = sum_i alpha_i v_i

(no 1/sqrt(d) scale: the seed's formulation; beta plays its role). The seed's cases, with
orthonormal means mu_i and values v_i = mu_i unless given:

- copy:     q = beta mu_j            -> alpha_j = e^beta / (e^beta + n - 1) -> 1, c -> v_j
- average:  q = beta (mu_a + mu_b)   -> alpha_a = alpha_b = e^beta / (2 e^beta + n - 2) -> 1/2
- random keys k_i ~ N(mu_i, alpha I): for small alpha the average still holds;
- one key with variance along its own mean, k_a ~ N(mu_a, alpha I + s mu_a mu_a^T), i.e.
  k_a ~= gamma mu_a with gamma ~ N(1, s): alpha_a ~= sigma((gamma - 1) beta), so c swings
  between v_a and v_b as gamma falls either side of 1;
- two heads q_1 = beta mu_a, q_2 = beta mu_b, c = (c_1 + c_2) / 2: head 1 only needs
  gamma beta >> log(n - 1) (not gamma ~= 1), so the average is stable except in the tail
  gamma <~ log(n - 1) / beta, which has probability about Phi(-1 / sqrt(s)) for large beta.

Everything is numpy and seeded: the same arguments always draw the same keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from attn_core.validate import check_int, is_int

CASES = ("copy", "average")
HEAD_COUNTS = (1, 2)
# Keys are held as one (n_samples, n, d) float64 array; this bounds it at ~160 MB.
MAX_KEY_ELEMENTS = 20_000_000
MAX_SAMPLES = 100_000


def _finite_array(x, name: str, ndim: int) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-d array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite entries")
    return arr


def _check_real(x, name: str, minimum: float | None = None) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {x!r}") from None
    if not np.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def _check_int(x, name: str, lo: int, hi: int | None = None) -> int:
    """An integer setting; a whole float (a slider's 3.0) counts as that integer."""
    if isinstance(x, (float, np.floating)) and math.isfinite(x) and float(x).is_integer():
        x = int(x)
    return check_int(name, x, lo, hi)


def _check_index(i, n: int, name: str) -> int:
    return _check_int(i, f"{name} (a key index)", 0, n - 1)


def _check_means(means) -> np.ndarray:
    mu = _finite_array(means, "means", 2)
    n = mu.shape[0]
    if n < 2:
        raise ValueError(f"need at least n = 2 keys, got {n}")
    if np.any(np.linalg.norm(mu, axis=1) == 0):
        raise ValueError("every mean mu_i must be non-zero")
    return mu


def orthonormal_means(n: int, d: int, seed: int | None = None) -> np.ndarray:
    """n orthonormal means in R^d as rows (n x d): the standard basis e_1..e_n when ``seed`` is
    None, else a random orthonormal set (QR of a seeded Gaussian matrix)."""
    n = _check_int(n, "n (number of keys)", 2)
    d = _check_int(d, "d (dimension)", 1)
    if d < n:
        raise ValueError(f"orthonormal means need d >= n; got n = {n}, d = {d}")
    if seed is None:
        return np.eye(n, d)
    g = np.random.default_rng(seed)
    Q, R = np.linalg.qr(g.standard_normal((d, n)))  # Q: d x n, orthonormal columns
    return (Q * np.sign(np.diag(R))).T  # sign fix makes the draw unique for a seed


def orthonormality_error(means) -> float:
    """max |mu_i^T mu_j - delta_ij|: 0 for the seed's setting, where its limits are exact."""
    mu = np.asarray(means, dtype=np.float64)
    return float(np.abs(mu @ mu.T - np.eye(len(mu))).max())


def attention(q, K, V) -> tuple[np.ndarray, np.ndarray]:
    """Weights alpha = softmax(K q) and output c = alpha V.

    Broadcasts over leading axes: q [..., d], K [..., n, d], V [..., n, d_v] ->
    (alpha [..., n], c [..., d_v]). The softmax subtracts the max score, so large beta is safe.
    """
    q, K, V = (np.asarray(x, dtype=np.float64) for x in (q, K, V))
    scores = np.einsum("...nd,...d->...n", K, q)  # k_i^T q
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    alpha = e / e.sum(axis=-1, keepdims=True)  # [..., n]
    c = np.einsum("...n,...nv->...v", alpha, V)  # [..., d_v]
    return alpha, c


def copy_query(means, j: int, beta: float) -> np.ndarray:
    """q = beta mu_j: key j's score dominates, so c -> v_j as beta grows."""
    mu = _check_means(means)
    return _check_real(beta, "beta") * mu[_check_index(j, len(mu), "j")]


def average_query(means, a: int, b: int, beta: float) -> np.ndarray:
    """q = beta (mu_a + mu_b): keys a and b tie, so c -> (v_a + v_b) / 2 as beta grows."""
    mu = _check_means(means)
    a, b = _check_index(a, len(mu), "a"), _check_index(b, len(mu), "b")
    if a == b:
        raise ValueError("a and b must be different keys")
    return _check_real(beta, "beta") * (mu[a] + mu[b])


def head_queries(means, case: str, a: int, b: int, beta: float, n_heads: int) -> np.ndarray:
    """The queries, one row per head: copy (q = beta mu_a), average with one head
    (q = beta (mu_a + mu_b)) or average with two heads (q_1 = beta mu_a, q_2 = beta mu_b)."""
    if case not in CASES:
        raise ValueError(f"case must be one of {CASES}, got {case!r}")
    if not is_int(n_heads) or n_heads not in HEAD_COUNTS:
        raise ValueError(f"head count must be 1 or 2, got {n_heads!r}")
    if case == "copy":
        if n_heads != 1:
            raise ValueError(
                "two heads split the average query (q_1 = beta mu_a, q_2 = beta mu_b); the copy case has one head"
            )
        return copy_query(means, a, beta)[None]
    if n_heads == 1:
        return average_query(means, a, b, beta)[None]
    if a == b:
        raise ValueError("a and b must be different keys")
    return np.stack([copy_query(means, a, beta), copy_query(means, b, beta)])


def sample_keys(
    means, alpha: float = 0.0, big_var_index: int | None = None, big_var: float = 0.0, n_samples: int = 1, seed: int = 0
) -> np.ndarray:
    """``n_samples`` draws of the key set, shape (n_samples, n, d): k_i ~ N(mu_i, alpha I), and
    for i = big_var_index, k_i ~ N(mu_i, alpha I + big_var mu_i mu_i^T).

    The extra covariance is sampled as a scale on the mean, k_i = gamma mu_i + sqrt(alpha) z with
    gamma ~ N(1, big_var), which has exactly that covariance; ``key_scales`` recovers gamma.
    """
    mu = _check_means(means)
    n, d = mu.shape
    alpha = _check_real(alpha, "alpha (key variance)", 0.0)
    big_var = _check_real(big_var, "big_var (variance of the chosen key)", 0.0)
    n_samples = _check_int(n_samples, "number of samples", 1, MAX_SAMPLES)
    if n_samples * n * d > MAX_KEY_ELEMENTS:
        raise ValueError(
            f"{n_samples} samples of {n} x {d} keys is too large "
            f"(limit {MAX_KEY_ELEMENTS:,} numbers); lower the samples, n or d"
        )
    seed = _check_int(seed, "seed", 0)
    g = np.random.default_rng(seed)
    noise = g.standard_normal((n_samples, n, d))
    # gamma is drawn even when unused so the alpha I noise is the same for every big_var choice.
    g_scale = g.standard_normal(n_samples)
    keys = mu[None] + np.sqrt(alpha) * noise  # [S, n, d]
    if big_var_index is not None:
        j = _check_index(big_var_index, n, "big_var_index")
        keys[:, j] += np.sqrt(big_var) * g_scale[:, None] * mu[j]
    return keys


def key_scales(keys, means, j: int) -> np.ndarray:
    """gamma_s = k_j^T mu_j / |mu_j|^2 per sample: the scale of key j along its own mean."""
    mu = _check_means(means)
    j = _check_index(j, len(mu), "j")
    return np.asarray(keys)[..., j, :] @ mu[j] / (mu[j] @ mu[j])


def copy_limit(n: int, beta: float) -> float:
    """alpha_j for q = beta mu_j and orthonormal fixed keys: e^beta / (e^beta + n - 1)."""
    return float(1.0 / (1.0 + (n - 1) * np.exp(-beta)))


def average_limit(n: int, beta: float) -> float:
    """alpha_a = alpha_b for q = beta (mu_a + mu_b), orthonormal fixed keys:
    e^beta / (2 e^beta + n - 2)."""
    return float(1.0 / (2.0 + (n - 2) * np.exp(-beta)))


def two_head_limit(n: int, beta: float) -> float:
    """alpha_a = (alpha_a^(1) + alpha_a^(2)) / 2 for q_1 = beta mu_a, q_2 = beta mu_b and
    orthonormal fixed keys: (e^beta + 1) / (2 (e^beta + n - 1)) -> 1/2."""
    return float((1.0 + np.exp(-beta)) / (2.0 * (1.0 + (n - 1) * np.exp(-beta))))


@dataclass
class Experiment:
    """One run of the toy: per-sample keys, weights and outputs (S = samples, h = heads)."""

    settings: dict  # every argument, for manifests
    means: np.ndarray  # [n, d] mu_i
    queries: np.ndarray  # [h, d]
    keys: np.ndarray  # [S, n, d]
    head_weights: np.ndarray  # [S, h, n] alpha per head
    head_outputs: np.ndarray  # [S, h, d_v] c_h per head
    values: np.ndarray  # [n, d_v]
    gamma: np.ndarray  # [S] scale of the chosen key along its mean (key_scales)
    near_tol: float = 0.1
    weights: np.ndarray = field(init=False)  # [S, n] mean over heads: c = weights @ V
    outputs: np.ndarray = field(init=False)  # [S, d_v] c = (c_1 + ... + c_h) / h

    def __post_init__(self) -> None:
        self.weights = self.head_weights.mean(axis=1)
        self.outputs = self.head_outputs.mean(axis=1)

    @property
    def a(self) -> int:
        return self.settings["a"]

    @property
    def b(self) -> int:
        return self.settings["b"]

    @property
    def n_heads(self) -> int:
        return self.queries.shape[0]

    @property
    def alpha_a(self) -> np.ndarray:
        """[S] the weight on v_a in c (averaged over heads)."""
        return self.weights[:, self.a]

    @property
    def alpha_b(self) -> np.ndarray:
        return self.weights[:, self.b]

    @property
    def v_average(self) -> np.ndarray:
        return (self.values[self.a] + self.values[self.b]) / 2

    def _dist(self, target: np.ndarray) -> np.ndarray:
        return np.linalg.norm(self.outputs - target, axis=-1)

    @property
    def dist_a(self) -> np.ndarray:
        """[S] |c - v_a|."""
        return self._dist(self.values[self.a])

    @property
    def dist_b(self) -> np.ndarray:
        return self._dist(self.values[self.b])

    @property
    def dist_average(self) -> np.ndarray:
        """[S] |c - (v_a + v_b) / 2|."""
        return self._dist(self.v_average)

    def plane_coordinates(self) -> np.ndarray:
        """[S, 2] least-squares coordinates (x, y) of c in the basis (v_a, v_b): v_a is (1, 0),
        v_b is (0, 1) and their average (1/2, 1/2)."""
        basis = np.stack([self.values[self.a], self.values[self.b]], axis=1)  # [d_v, 2]
        return np.linalg.lstsq(basis, self.outputs.T, rcond=None)[0].T

    def summary(self) -> dict:
        """The spread of alpha_a and how close c gets to each target."""
        aa = self.alpha_a
        q25, q75 = np.quantile(aa, [0.25, 0.75])
        return {
            "heads": self.n_heads,
            "alpha_a mean": float(aa.mean()),
            "alpha_a std": float(aa.std()),
            "alpha_a IQR": float(q75 - q25),
            f"P(|alpha_a - 1/2| <= {self.near_tol:g})": float(np.mean(np.abs(aa - 0.5) <= self.near_tol)),
            "median |c - v_a|": float(np.median(self.dist_a)),
            "median |c - v_b|": float(np.median(self.dist_b)),
            "median |c - (v_a+v_b)/2|": float(np.median(self.dist_average)),
        }


def experiment(
    means,
    values=None,
    *,
    case: str = "average",
    a: int = 0,
    b: int = 1,
    alpha: float = 0.0,
    beta: float = 10.0,
    big_var_index: int | None = None,
    big_var: float = 0.0,
    n_heads: int = 1,
    n_samples: int = 1000,
    seed: int = 0,
    near_tol: float = 0.1,
) -> Experiment:
    """Draw ``n_samples`` key sets (``sample_keys``) and attend to each with the case's queries.

    ``values`` defaults to the means (v_i = mu_i). ``big_var_index`` defaults to a, the seed's
    choice. The same ``seed`` draws the same keys whatever the case or head count, so one- and
    two-head runs compare sample by sample.
    """
    mu = _check_means(means)
    n = len(mu)
    V = mu if values is None else _finite_array(values, "values", 2)
    if V.shape[0] != n:
        raise ValueError(f"values must have one row per key: {n} keys but {V.shape[0]} values")
    a, b = _check_index(a, n, "a"), _check_index(b, n, "b")
    if a == b:
        raise ValueError("a and b must be different keys")
    j = a if big_var_index is None else _check_index(big_var_index, n, "big_var_index")
    near_tol = _check_real(near_tol, "near_tol", 0.0)
    queries = head_queries(mu, case, a, b, beta, n_heads)  # [h, d]
    keys = sample_keys(mu, alpha, j, big_var, n_samples, seed)  # [S, n, d]
    # [S, 1, n, d] against [h, d]: every head reads the same keys.
    head_weights, head_outputs = attention(queries, keys[:, None], V)
    settings = dict(
        n=n,
        d=mu.shape[1],
        case=case,
        a=a,
        b=b,
        alpha=float(alpha),
        beta=float(beta),
        big_var_index=j,
        big_var=float(big_var),
        n_heads=int(n_heads),
        n_samples=int(n_samples),
        seed=int(seed),
    )
    return Experiment(
        settings, mu, queries, keys, head_weights, head_outputs, V, key_scales(keys, mu, j), near_tol=near_tol
    )


def predicted_alpha_a(exp: Experiment, gamma) -> np.ndarray:
    """alpha_a as a function of the chosen key's scale gamma with every other key at its mean
    (the alpha -> 0 limit; exact then): e.g. e^{gamma beta} / (e^{gamma beta} + e^beta + n - 2) for
    one head with j = a, and (e^{gamma beta} / (e^{gamma beta} + n - 1) + 1 / (e^beta + n - 1)) / 2
    for two heads, when the means are orthonormal."""
    mu = exp.means
    gamma = np.asarray(gamma, dtype=np.float64)
    keys = np.broadcast_to(mu, gamma.shape + mu.shape).copy()  # [G, n, d]
    j = exp.settings["big_var_index"]
    keys[..., j, :] = gamma[..., None] * mu[j]
    w, _ = attention(exp.queries, keys[..., None, :, :], exp.values)  # [G, h, n]
    return w.mean(axis=-2)[..., exp.a]
