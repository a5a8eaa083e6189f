"""Training dynamics: how a model got where it is, from its weights across training.

- ``series``: a :class:`Series` (one architecture at several steps, ordered by step) from a run's
  checkpoints, a folder with ``checkpoints/`` or several model folders (:func:`series`);
- ``metrics``: what one checkpoint measures on fixed held-out inputs (:func:`measure`): loss, the
  in-context-learning score, prefix matching, previous token, K-composition, entropy and its
  floor, sigma_1(B), stable rank, copying;
- ``bound``: the entropy floor of softmax attention given the logits' spectral norm (Zhai et al. 2023);
- ``phase``: the phase change, the window of steepest fall of the ICL score (Olsson et al. 2022);
- ``run``: :func:`dynamics` over a series, with a per-checkpoint cache (:class:`MetricCache`).

The maths is in docs/maths.md ("Training dynamics"); the checkpoints themselves are written by
``attn_core.training.checkpoints``.
"""

from attn_core.dynamics.bound import entropy_floor, normalized_row_floors, row_floors, spectral_norm
from attn_core.dynamics.metrics import (
    PER_HEAD,
    Inputs,
    Measured,
    default_positions,
    measure,
    position_losses,
    task_inputs,
    text_inputs,
)
from attn_core.dynamics.phase import phase_change
from attn_core.dynamics.run import Dynamics, MetricCache, default_inputs, dynamics, step_views, text_ids
from attn_core.dynamics.series import Member, Series, available, series, step_of_name

__all__ = [
    "PER_HEAD",
    "available",
    "Dynamics",
    "Inputs",
    "Measured",
    "Member",
    "MetricCache",
    "Series",
    "default_inputs",
    "default_positions",
    "dynamics",
    "entropy_floor",
    "measure",
    "normalized_row_floors",
    "phase_change",
    "position_losses",
    "row_floors",
    "series",
    "spectral_norm",
    "step_of_name",
    "step_views",
    "task_inputs",
    "text_ids",
    "text_inputs",
]
