"""Surgery on B without retraining, and heads compared across models (docs/maths.md, "Surgery"):

- ``modes``: a head's modes (singular pairs of B, or rotation planes) and B edited mode by mode,
  written into the head's own W_Q (GQA-safe);
- ``edit``: :class:`HeadEdit` (rank, dropped and scaled modes, ablation, transplant) and
  :func:`edit_model`, which edits a copy of a loaded model;
- ``measure``: loss, perplexity, accuracy, ICL score, sink rate and per-head numbers before/after;
- ``save``: the edited model as a folder (an imported one stays its family) or a run;
- ``diff``: head x head distances of B between two models and the optimal matching per layer.
"""

from attn_core.surgery.diff import DISTANCE, HeadDiff, check_comparable, diff, layer_distances, match
from attn_core.surgery.edit import (
    ABLATIONS,
    Edited,
    HeadEdit,
    check_edit,
    edit_model,
    has_output_bias,
    head_label,
    parse_head,
)
from attn_core.surgery.measure import Preview, edit_inputs, edit_metrics, edit_preview, head_pattern, quick_loss
from attn_core.surgery.modes import Modes, apply_factors, head_form64, head_modes, mode_factors, planes

__all__ = [
    "ABLATIONS",
    "DISTANCE",
    "Edited",
    "HeadDiff",
    "HeadEdit",
    "Modes",
    "Preview",
    "apply_factors",
    "check_comparable",
    "check_edit",
    "diff",
    "edit_inputs",
    "edit_model",
    "edit_preview",
    "has_output_bias",
    "head_form64",
    "head_label",
    "head_modes",
    "head_pattern",
    "layer_distances",
    "match",
    "edit_metrics",
    "mode_factors",
    "parse_head",
    "planes",
    "quick_loss",
]
