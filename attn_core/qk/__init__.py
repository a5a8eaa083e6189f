"""Merged vs factored QK: does a head need two d_model x d_qk factors W_Q, W_K, or can
one d_model x d_model matrix W_QK do? See docs/maths.md.

- ``convert``: the two parametrisations exactly (parameters per head, merged <-> factored,
  truncation of B to a rank, balanced factors and the nuclear norm);
- ``config``: :class:`Variant` and :class:`CompareConfig`;
- ``run``: training one variant (recorded through ``attn_core.training.record``) and
  :func:`compare`;
- ``result``: :class:`Comparison`, its tables, findings and report.
"""

from attn_core import lazy
from attn_core.qk.config import (
    MAX_SEEDS,
    MAX_STEPS,
    PARENT_PREFIX,
    TRUNCATION_RANKS,
    VARIANT_KINDS,
    CompareConfig,
    Variant,
)

__getattr__, __dir__ = lazy.exports(
    __name__,
    {
        "convert": (
            "balanced_factors",
            "factored_from_merged",
            "merged_from_factored",
            "qk_params_per_head",
            "truncated",
        ),
        "result": ("Comparison",),
        "run": (
            "Progress",
            "compare",
            "ln1_gain",
            "results_path",
            "set_qk_weight_decay",
            "train_variant",
            "truncation_table",
        ),
    },
)

__all__ = [
    "MAX_SEEDS",
    "MAX_STEPS",
    "PARENT_PREFIX",
    "TRUNCATION_RANKS",
    "VARIANT_KINDS",
    "CompareConfig",
    "Comparison",
    "Progress",
    "Variant",
    "balanced_factors",
    "compare",
    "factored_from_merged",
    "ln1_gain",
    "merged_from_factored",
    "qk_params_per_head",
    "results_path",
    "set_qk_weight_decay",
    "train_variant",
    "truncated",
    "truncation_table",
]
