"""The JSON documents of ``attn-lab circuits NAME --json`` and ``attn-lab attribute NAME --json``.

Plain data (dicts, lists, floats, None for "no value"), so ``json.dumps`` writes them as they are.

``circuits_report``::

    {heads: [{layer, head, copying_score, qk_positivity, ov_singular_values}],
     order: ["L0H0", ...],
     composition: {q: [[...]], k: [[...]], v: [[...]]},
     composition_baseline: {q, k, v}}

``composition[kind][i][j]`` is the score from head ``order[i]`` (the writer) into head
``order[j]`` (the reader), null unless i's layer comes before j's; ``composition_baseline`` holds
the random-matrix baseline of the same entries (subtract it for the baseline-corrected score).
See :mod:`attn_core.circuits.ov` and :mod:`attn_core.circuits.composition` for the maths.

``attribute_report``::

    {query, split, keys: [{key, token, score, terms: [{direction, term, sigma, contribution}], bias}]}

one entry per key the query sees (or the ``top`` best), by decreasing score; ``sum(contribution) + bias == score``
(see :mod:`attn_core.circuits.attribution`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from attn_core.bilinear import check_loaded, check_model
from attn_core.circuits.attribution import attribute
from attn_core.circuits.composition import KINDS, N_SAMPLES, composition
from attn_core.circuits.ov import head_circuits
from attn_core.model import Transformer
from attn_core.sources import LoadedModel
from attn_core.validate import check_int


def _number(v: float) -> float | None:
    v = float(v)
    return None if math.isnan(v) else v


def _matrix(t: torch.Tensor) -> list[list]:
    return [[_number(v) for v in row] for row in t.tolist()]


def circuits_report(model: Transformer, n_samples: int = N_SAMPLES, seed: int = 0) -> dict:
    """Per-head OV spectra, copying scores and QK positivity, and the composition scores with
    their baselines (``n_samples`` random pairs per shape, drawn from ``seed``)."""
    model = check_model(model, "circuits_report")
    table = head_circuits(model)
    comp = composition(model, n_samples=n_samples, seed=seed)
    heads = [
        dict(
            layer=int(r.layer),
            head=int(r.head),
            copying_score=float(r.copying_score),
            qk_positivity=float(r.qk_positivity),
            ov_singular_values=[float(s) for s in r.ov_singular_values],
        )
        for r in table.itertuples()
    ]
    return dict(
        heads=heads,
        order=list(comp.order),
        composition={k: _matrix(comp.scores[k]) for k in KINDS},
        composition_baseline={k: _matrix(comp.baseline[k]) for k in KINDS},
    )


def attribute_report(
    loaded: LoadedModel, layer: int, head: int, query: int, tokens: Sequence[int], top: int | None = None
) -> dict:
    """The scores of query position ``query`` against every key it sees (the ``top`` best when
    given), each split into the rank-1 terms of B (direction i, sigma_i, contribution) and the bias;
    a soft-capped head's terms add up to its score before the cap, the capped score beside it."""
    attr = attribute(check_loaded(loaded, "attribute_report"), tokens, layer, head, query)
    order = attr.ranking()
    if top is not None:
        order = order[: check_int("top", top, 1)]
    keys = []
    for i in order:
        terms = [
            dict(direction=d, term=attr.term(d), sigma=float(attr.sigma[d]), contribution=float(attr.terms[i, d]))
            for d in range(attr.terms.shape[1])
        ]
        keys.append(
            dict(
                key=attr.keys[i],
                token=attr.token_labels[i],
                score=float(attr.scores[i]),
                **({} if attr.cap is None else dict(capped_score=float(attr.capped[i]))),
                terms=terms,
                bias=float(attr.bias[i]),
            )
        )
    split = attr.meta.get("split", "rank-1 terms of B")
    doc = dict(query=attr.query, split=split, keys=keys)
    if attr.cap is not None:  # the terms add up to the score before the cap
        doc.update(softcap=attr.cap, score="before the soft cap (capped_score: c tanh(score / c), the model's)")
    return doc
