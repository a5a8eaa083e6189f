"""Differentiable concentration and spectral penalties on the QK bilinear form.

A regularizer R with strength lambda >= 0 adds ``lambda * R`` to the task loss. Each R is a mean
over its selected heads (so lambda does not depend on how many heads are chosen) and, for the
row penalties, over the rows that see at least two keys (``metrics.MIN_KEYS``):

    entropy        H(A_i) / log n_i                 A_i an attention row of the training batch,
                                                    n_i its visible keys (causal rows compare)
    hoyer          1 - Hoyer(A_i)                   negative Hoyer sparsity, shifted by 1 so the
                                                    term is >= 0; Hoyer = (sqrt n - |p|_1/|p|_2)/(sqrt n - 1)
    topk           1 - sum of the k largest A_ij    top-k mass deficit (k = 1 unless ``topk:K``)
    sink           A_i0                             the mass on the first key (an attention sink's)
    vocab_entropy  the same three on the vocabulary view: row x is the attention of token x
    vocab_hoyer    over every token y, A_x = attn(f_x(.)) with f_x(y) = x B y^T and x, y every
    vocab_topk     token as the layer sees it (bilinear.vocab_scores) -- "for every x"
    spectral       ||B||_2 = sigma_1(B)             sigma-Reparam's view: a small ||B||_2 bounds
                                                    how far attention entropy can collapse, so this
                                                    one works *against* concentration
    nuclear        ||B||_* = sum_i sigma_i(B)       convex surrogate of rank; from the factors
                                                    (QR of W_Q, W_K and the small core's SVD)

The row metrics are ``attn_core.metrics`` (one definition for measuring and penalising); B and
its spectrum are ``attn_core.bilinear``. Alpha-entmax attention, the architectural alternative
to a penalty, is a model setting (``ModelConfig.entmax_alpha``), chosen at retrain time.

A spec names a regularizer, its strength and optionally its heads and k::

    NAME[:K][@HEADS]=LAMBDA      entropy=0.1   topk:2=0.5   vocab_entropy@L1H2,L0=0.05

HEADS is a comma-separated list of ``L<l>`` (every head of layer l) and ``L<l>H<h>`` items.

Split by concern (docs/architecture.md):

- ``heads``: head selections (``parse_heads``, ``format_heads``, ``all_heads``) and a head's
  label (``head_label``);
- ``specs``: the regularizer table (:data:`REGULARIZERS`), :class:`RegSpec` and the spec parsers
  (``parse_spec``, ``parse_specs``);
- ``kinds``: the registry of row metrics and spectrum terms, one class per file
  (``kinds.row_metric``, ``kinds.spectrum_term``: an unknown kind refused by name);
- ``rows``: the row penalties (``row_penalty``, dense) and the same from Q and K in query
  blocks (``row_values``, ``head_means``: exact, or the unbiased sampled-rows estimate), so that
  no [batch, heads, T, T] pattern is kept for backward (docs/maths.md);
- ``flash_rows``: softmax entropy and sink mass of every row from one fused attention pass with
  V := K (lse - E_p[s], exp(s_i0 - lse_i)), no score matrix formed; ``rows`` takes it where a
  kernel applies (``path``, docs/maths.md);
- ``penalty``: the differentiable values (``regularizer_value`` and its row and spectrum parts),
  :class:`ConcentrationPenalty` (with the forward cache it reads, ``cache()``),
  ``build_penalty`` and ``with_entmax``;
- ``summaries``: the per-head summaries a run measures (``data_concentration``,
  ``vocab_concentration``: mean entropy and top-1 mass from Q and K in blocks of rows,
  ``row_summaries``; ``head_spectra``).
"""

from attn_core import lazy
from attn_core.regularizers.heads import Heads, all_heads, format_heads, head_label, parse_heads
from attn_core.regularizers.specs import (
    REGULARIZERS,
    RegSpec,
    SpecsLike,
    parse_spec,
    parse_specs,
    regularized_heads,
)

# heads and specs (names, parsing) come with the package; the penalties (torch) when first read
__getattr__, __dir__ = lazy.exports(
    __name__,
    {
        "penalty": (
            "ConcentrationPenalty",
            "build_penalty",
            "data_rows",
            "data_values",
            "layer_singular_values",
            "mean_rows",
            "regularizer_value",
            "vocab_rows",
            "with_entmax",
        ),
        "rows": ("ROW_KINDS", "head_means", "row_penalty", "row_values"),
        "summaries": (
            "data_concentration",
            "head_spectra",
            "head_summaries",
            "qk_cache",
            "row_summaries",
            "vocab_concentration",
        ),
    },
)

__all__ = [
    "REGULARIZERS",
    "ROW_KINDS",
    "ConcentrationPenalty",
    "Heads",
    "RegSpec",
    "SpecsLike",
    "all_heads",
    "build_penalty",
    "data_concentration",
    "data_rows",
    "data_values",
    "format_heads",
    "head_means",
    "head_label",
    "head_spectra",
    "head_summaries",
    "layer_singular_values",
    "mean_rows",
    "parse_heads",
    "parse_spec",
    "parse_specs",
    "qk_cache",
    "regularizer_value",
    "row_penalty",
    "row_summaries",
    "row_values",
    "vocab_concentration",
    "vocab_rows",
    "with_entmax",
    "regularized_heads",
]
