"""Circuits of the QK bilinear form: why a query attends where it does (attribution of
f_x(y) over the singular directions of B), what a head moves (its OV circuit and the full
circuits over the vocabulary) and which earlier heads feed it (Q-, K-, V-composition).

Modules: ``ov`` (W_OV, full OV/QK circuits, copying score, QK positivity, value-weighted
attention), ``composition`` (composition scores and their random-matrix baseline),
``attribution`` (rank-1 terms of one score, runner-up, token/position split at layer 0),
``report`` (the CLI's JSON documents), ``settings`` (the composition kinds and the baseline's
sample count, without torch). The maths is in each module's docstring and in
docs/maths.md.

The model object, as in ``attn_core.bilinear``: what names tokens takes a ``LoadedModel``
(``attribute``, ``token_position_split``, ``attribute_report``); the rest is model maths and
takes the ``Transformer`` (a LoadedModel's ``.model``). The wrong one is refused with a
TypeError of one sentence.
"""

from attn_core import lazy
from attn_core.circuits.settings import KINDS, N_SAMPLES

__getattr__, __dir__ = lazy.exports(
    __name__,
    {
        "attribution": ("BIAS_PARTS", "SPLIT_PARTS", "Attribution", "attribute", "head_form", "token_position_split"),
        "composition": (
            "Composition",
            "baseline_score",
            "composed_qk_positivities",
            "composition",
            "composition_score",
            "k_composed_positivity",
        ),
        "ov": (
            "copying_scores",
            "full_ov_circuit",
            "full_ov_form",
            "full_qk_form",
            "head_circuits",
            "ov_form",
            "ov_singular_values",
            "ov_spectrum_frame",
            "positivity",
            "qk_positivities",
            "unembed_matrix",
            "value_weighted",
        ),
        "report": ("attribute_report", "circuits_report"),
    },
)

__all__ = [
    "BIAS_PARTS",
    "KINDS",
    "N_SAMPLES",
    "SPLIT_PARTS",
    "Attribution",
    "Composition",
    "attribute",
    "attribute_report",
    "baseline_score",
    "circuits_report",
    "composed_qk_positivities",
    "composition",
    "composition_score",
    "copying_scores",
    "full_ov_circuit",
    "full_ov_form",
    "full_qk_form",
    "head_circuits",
    "head_form",
    "k_composed_positivity",
    "ov_form",
    "ov_singular_values",
    "ov_spectrum_frame",
    "positivity",
    "qk_positivities",
    "token_position_split",
    "unembed_matrix",
    "value_weighted",
]

# attn_core.circuits(...) is the front door's function (attn_core.api.circuits); the package stays the package
lazy.callable_package(__name__, "attn_core.api:circuits")
