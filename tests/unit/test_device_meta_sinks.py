"""Device discipline (issue 21) for attention sinks and the two ranks of a head: their tensor
parts (``sinks.importance_sums``, ``ranks.score_spectra``, ``ranks.weight_spectra``) run to the
end on ``meta`` under test_device_meta's :class:`SameDevice` guard, with CPU probes as the CLI
and the pages make them; the reads are where the test says."""

from __future__ import annotations

import pytest
import torch

from attn_core import metrics
from attn_core.bilinear.ranks import ranks, score_spectra, weight_spectra
from attn_core.bilinear.sinks import eligible_keys, importance_sums, key_importance, sinks
from tests.unit.test_device_meta import META, TASK, all_meta, meta_model, on_meta, read_point

KINDS = ["factored", "merged", "biased-mlp-2l", "grown", "rotary-gqa", "sparsemax"]


def probes(n: int = 3) -> torch.Tensor:
    return TASK.sample(n, 0).tokens  # on the CPU, as text.probes makes them


@pytest.mark.parametrize("kind", KINDS)
def test_sink_and_rank_tensors_run_on_meta(kind):
    model = meta_model(kind)
    L, H, T = model.cfg.n_layers, model.cfg.n_heads, TASK.n_ctx
    sums, counts, _ = on_meta(lambda: importance_sums(model, probes()))
    spectra = on_meta(lambda: score_spectra(model, probes(2)))
    weight = on_meta(lambda: weight_spectra(model))
    assert all_meta((sums, counts, spectra, weight))
    assert sums.shape == (L, H, T) and counts.shape == (L, T) and spectra.shape == (2, L, H, T)
    assert sums.dtype == spectra.dtype == torch.float64
    assert read_point(lambda: sinks(model, probes())) == "sinks.py:sinks"
    assert read_point(lambda: ranks(model, probes(2))) == "ranks.py:ranks"


def test_sink_free_concentration_runs_on_meta():
    T = 6
    mask = torch.ones(T, T, dtype=torch.bool, device=META).tril()
    p = torch.rand(2, T, T, device=META)
    keys = eligible_keys(mask) & (key_importance(p, mask) > 0.3)
    out = on_meta(lambda: metrics.concentration(p, mask, k=2, exclude=keys[:, None, :]))
    assert all_meta(out) and out["entropy"].shape == (2, T)
