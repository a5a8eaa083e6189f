"""The QK bilinear form of every head: B, its spectrum, the views of f_x(y), head detectors.

Split by concern (docs/architecture.md, the maths in docs/maths.md):

- :class:`QKForm` (defined with the model, :mod:`attn_core.model.qk_form`), B as factors or
  dense; pure linear algebra with a cached spectrum;
- ``heads``: the form of a model's heads (``layer_form``, ``model_form``, ``layer_B``,
  ``head_B``) and the augmented bias form (``augment``, ``has_bias``);
- ``spectrum``: spectrum records and tidy frames;
- ``tokens``: token names, typed text, sample and random inputs (take a ``LoadedModel``);
- ``views``: :class:`View`, the sequence / vocabulary / positional views (take a
  ``LoadedModel``), their differentiable inputs and scores (take a ``Transformer``),
  concentration tables;
- ``blocked``: the one engine of long inputs (more than ``LONG_INPUT`` tokens, the one
  threshold, and ``TOP_K``, the one default of top keys): rows and pooled maps of one head a
  block of queries x keys at a time, from ``queries_keys.layer_qk``, the learned sink included;
- ``long``: a head's :class:`LongView` of a long input from that engine (:func:`layer_scores`:
  Q and K of one layer, the forward stopped there; an exact window, the top-k keys, a pooled
  overview), so that no n^2 cells go to a browser;
- ``sinks``: attention sinks (Gu et al. 2024): each key's importance per head on probes,
  sink heads and the sink rate (:func:`sinks`);
- ``ranks``: the two ranks of a head, of B and of the centred scores on probes (:func:`ranks`);
- ``detectors``: detection patterns and head detector scores (take a ``Transformer``);
- ``checks``: the input checks (layer, heads, tokens, the model object) and ``layer_mask``, the
  model's own mask (causal, sliding window) that every view and attribution uses.
"""

from attn_core.bilinear.checks import (
    check_heads,
    check_layer,
    check_loaded,
    check_model,
    check_tokens,
    layer_mask,
    longest_dense_view,
    visible_keys,
)
from attn_core.bilinear.detectors import (
    DETECTORS,
    best_heads,
    detection_patterns,
    detector_inputs,
    detector_tensors,
    head_detector_scores,
    head_detectors,
)
from attn_core.bilinear.heads import augment, has_bias, head_B, layer_B, layer_form, model_form, qk_form, qk_gains
from attn_core.bilinear.long import LONG_INPUT, LayerScores, LongView, layer_scores, pool_blocks
from attn_core.bilinear.ranks import Ranks, ranks, variance_rank
from attn_core.bilinear.score_parts import ScoreParts, score_parts
from attn_core.bilinear.sinks import Sinks, key_importance, sinks
from attn_core.bilinear.spectrum import eigen_frame, latent_spectrum_frame, spectrum_frame, spectrum_rows
from attn_core.bilinear.tokens import input_ids, position_labels, random_tokens, sample_tokens, token_names, tokenizer
from attn_core.bilinear.views import (
    MAX_VIEW_TOKENS,
    View,
    concentration_table,
    positional_inputs,
    positional_scores,
    positional_view,
    sequence_view,
    vocab_inputs,
    vocab_scores,
    vocabulary_view,
)
from attn_core.model.qk_form import QKForm

__all__ = [
    "DETECTORS",
    "LONG_INPUT",
    "MAX_VIEW_TOKENS",
    "LayerScores",
    "LongView",
    "QKForm",
    "Ranks",
    "Sinks",
    "View",
    "augment",
    "best_heads",
    "check_heads",
    "check_layer",
    "check_loaded",
    "check_model",
    "check_tokens",
    "concentration_table",
    "detection_patterns",
    "detector_inputs",
    "detector_tensors",
    "eigen_frame",
    "input_ids",
    "has_bias",
    "head_B",
    "head_detector_scores",
    "head_detectors",
    "key_importance",
    "layer_B",
    "layer_form",
    "layer_mask",
    "layer_scores",
    "longest_dense_view",
    "model_form",
    "pool_blocks",
    "positional_inputs",
    "positional_scores",
    "positional_view",
    "qk_form",
    "qk_gains",
    "random_tokens",
    "ranks",
    "sample_tokens",
    "ScoreParts",
    "score_parts",
    "visible_keys",
    "sequence_view",
    "sinks",
    "spectrum_rows",
    "spectrum_frame",
    "latent_spectrum_frame",
    "position_labels",
    "token_names",
    "tokenizer",
    "variance_rank",
    "vocab_inputs",
    "vocab_scores",
    "vocabulary_view",
]
