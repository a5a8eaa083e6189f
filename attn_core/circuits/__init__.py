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

from typing import TYPE_CHECKING

from attn_core import lazy
from attn_core.circuits.settings import KINDS, N_SAMPLES

if TYPE_CHECKING:
    from attn_core.circuits.attribution import (
        BIAS_PARTS,
        SPLIT_PARTS,
        Attribution,
        attribute,
        head_form,
        token_position_split,
    )
    from attn_core.circuits.composition import (
        Composition,
        baseline_score,
        composed_qk_positivities,
        composition,
        composition_score,
        k_composed_positivity,
    )
    from attn_core.circuits.ov import (
        copying_scores,
        full_ov_circuit,
        full_ov_form,
        full_qk_form,
        head_circuits,
        ov_form,
        ov_singular_values,
        ov_spectrum_frame,
        positivity,
        qk_positivities,
        unembed_matrix,
        value_weighted,
    )
    from attn_core.circuits.report import attribute_report, circuits_report

__getattr__, __dir__ = lazy.exports(
    __name__,
    {
        "BIAS_PARTS": "attribution",
        "SPLIT_PARTS": "attribution",
        "Attribution": "attribution",
        "attribute": "attribution",
        "head_form": "attribution",
        "token_position_split": "attribution",
        "Composition": "composition",
        "baseline_score": "composition",
        "composed_qk_positivities": "composition",
        "composition": "composition",
        "composition_score": "composition",
        "k_composed_positivity": "composition",
        "copying_scores": "ov",
        "full_ov_circuit": "ov",
        "full_ov_form": "ov",
        "full_qk_form": "ov",
        "head_circuits": "ov",
        "ov_form": "ov",
        "ov_singular_values": "ov",
        "ov_spectrum_frame": "ov",
        "positivity": "ov",
        "qk_positivities": "ov",
        "unembed_matrix": "ov",
        "value_weighted": "ov",
        "attribute_report": "report",
        "circuits_report": "report",
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
