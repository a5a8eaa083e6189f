"""Training dynamics: how a model got where it is, from its weights across training.

- ``series``: a :class:`Series` (one architecture at several steps, ordered by step) from a run's
  checkpoints, a folder with ``checkpoints/``, a folder of model folders one per checkpoint
  (``folders``: Hugging Face folders named by step or listed in a manifest) or several model
  folders (:func:`series`); a member that cannot be one is :class:`Skipped` with its reason;
- ``metrics``: what one checkpoint measures on fixed held-out inputs (:func:`checkpoint_metrics`): loss, the
  in-context-learning score, prefix matching, previous token, K-composition, entropy and its
  floor, sigma_1(B), stable rank, copying;
- ``bound``: the entropy floor of softmax attention given the logits' spectral norm (Zhai et al. 2023);
- ``phase``: the phase change, a sudden fall of the ICL score that the loss shares beyond the
  series' noise (Olsson et al. 2022);
- ``run``: :func:`dynamics` over a series; ``cache``: the per-checkpoint cache
  (:class:`MetricCache`, every entry checked as untrusted input);
- ``listing``: what the Dynamics page lists (:func:`available`) and may read (:func:`check_browsable`).

The maths is in docs/maths.md ("Training dynamics"); the checkpoints themselves are written by
``attn_core.training.checkpoints``.
"""

from attn_core import lazy
from attn_core.dynamics.bound import entropy_floor, normalized_row_floors, row_floors, spectral_norm
from attn_core.dynamics.cache import MetricCache
from attn_core.dynamics.listing import available, browsable_roots, check_browsable, stamp
from attn_core.dynamics.metrics import (
    PER_HEAD,
    Inputs,
    Measured,
    checkpoint_metrics,
    default_positions,
    position_losses,
    task_inputs,
    text_inputs,
)
from attn_core.dynamics.phase import describe as describe_phase
from attn_core.dynamics.phase import phase_change
from attn_core.dynamics.run import (
    MAX_TEXT_BYTES,
    Dynamics,
    default_inputs,
    dynamics,
    read_text,
    series_text_inputs,
    step_views,
    text_ids,
)
from attn_core.dynamics.series import MAX_MEMBERS, Member, Series, Skipped, series, step_of_name

__all__ = [
    "MAX_MEMBERS",
    "MAX_TEXT_BYTES",
    "PER_HEAD",
    "available",
    "browsable_roots",
    "check_browsable",
    "Dynamics",
    "Inputs",
    "Measured",
    "Member",
    "MetricCache",
    "Series",
    "Skipped",
    "default_inputs",
    "describe_phase",
    "default_positions",
    "dynamics",
    "entropy_floor",
    "checkpoint_metrics",
    "normalized_row_floors",
    "phase_change",
    "position_losses",
    "read_text",
    "row_floors",
    "series",
    "series_text_inputs",
    "spectral_norm",
    "stamp",
    "step_of_name",
    "step_views",
    "task_inputs",
    "text_ids",
    "text_inputs",
]

# attn_core.dynamics(...) is the front door's function (attn_core.api.dynamics); the package stays the package
lazy.callable_package(__name__, "attn_core.api:dynamics")
