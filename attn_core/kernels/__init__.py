"""Kernelized approximations of one attention head.

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

Modules: ``features`` (exact attention and every method's feature maps and factors),
``attention`` (one interface for every method, linear attention, relative positional encoding),
``errors`` (error analysis on a model's heads). Timing and memory live in ``benchmarks/kernel_methods.py``.
"""

from attn_core.kernels.attention import (
    approx_attention,
    approx_pattern,
    exact_rpe_attention,
    factor_pattern,
    factors,
    kernel_estimate,
    linear_attention,
    rpe_attention,
    rpe_linear_attention,
    rpe_toeplitz,
    toeplitz_dense,
    toeplitz_matmul,
)
from attn_core.kernels.errors import (
    ERROR_COLUMNS,
    attention_errors,
    balance_qk,
    error_curve,
    error_summary,
    head_error,
    head_patterns,
    head_qkv,
    head_spectrum,
)
from attn_core.kernels.features import (
    CAUSAL_METHODS,
    FEATURES,
    METHODS,
    OPTIONS,
    MaclaurinDraw,
    exact_attention,
    exact_pattern,
    favor_features,
    gaussian_kernel,
    maclaurin_draw,
    maclaurin_features,
    newton_pinv,
    nystrom_factors,
    nystromformer_factors,
    orthogonal_gaussian,
    schoenbat_postscale,
    schoenbat_prenorm,
    segment_means,
)

__all__ = [
    "CAUSAL_METHODS",
    "ERROR_COLUMNS",
    "FEATURES",
    "METHODS",
    "OPTIONS",
    "MaclaurinDraw",
    "approx_attention",
    "approx_pattern",
    "attention_errors",
    "balance_qk",
    "error_curve",
    "exact_attention",
    "exact_pattern",
    "exact_rpe_attention",
    "factor_pattern",
    "factors",
    "favor_features",
    "gaussian_kernel",
    "head_error",
    "head_patterns",
    "head_qkv",
    "head_spectrum",
    "kernel_estimate",
    "linear_attention",
    "maclaurin_draw",
    "maclaurin_features",
    "newton_pinv",
    "nystrom_factors",
    "nystromformer_factors",
    "orthogonal_gaussian",
    "rpe_attention",
    "rpe_linear_attention",
    "rpe_toeplitz",
    "schoenbat_postscale",
    "schoenbat_prenorm",
    "segment_means",
    "error_summary",
    "toeplitz_dense",
    "toeplitz_matmul",
]
