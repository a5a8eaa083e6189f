"""The registry of row metrics and spectrum terms: each is one class in one file of this package
(a :class:`~attn_core.regularizers.kinds.base.RowMetric` or
:class:`~attn_core.regularizers.kinds.base.SpectrumTerm`), found here by walking the package, and
one line of ``attn_core.regularizers.specs.REGULARIZERS`` (its name, view and help; no torch).
Every engine that computes rows (query blocks, the fused blocks, the fused attention pass, the
dense rows, the telemetry summaries) and the spectrum penalties look a kind up with
:func:`row_metric` or :func:`spectrum_term`, which refuse an unknown kind by name.

Adding a regularizer: a file here with its class (its ``name``, ``dense`` and ``weights_grad``;
``softmax``/``softmax_grad`` for a closed form, ``from_pass`` for the fused pass) and its line in
``REGULARIZERS``; a test checks that the two agree."""

from __future__ import annotations

import importlib
import pkgutil

from attn_core.regularizers.kinds.base import RowMetric, SpectrumTerm
from attn_core.regularizers.specs import REGULARIZERS


def _discover() -> tuple[dict[str, RowMetric], dict[str, SpectrumTerm]]:
    """Every kind this package defines, in the order of ``REGULARIZERS`` (the others after)."""
    rows: dict[str, RowMetric] = {}
    spectra: dict[str, SpectrumTerm] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and obj.__module__ == module.__name__ and getattr(obj, "name", ""):
                if issubclass(obj, RowMetric):
                    rows[obj.name] = obj()
                elif issubclass(obj, SpectrumTerm):
                    spectra[obj.name] = obj()
    order = {name: i for i, name in enumerate(REGULARIZERS)}
    return tuple(dict(sorted(d.items(), key=lambda kv: order.get(kv[0], len(order)))) for d in (rows, spectra))


ROW_METRICS, SPECTRUM_TERMS = _discover()


def row_metric(kind: str) -> RowMetric:
    """The row metric named ``kind``; an unknown kind is refused in one sentence that names it."""
    metric = ROW_METRICS.get(kind) if isinstance(kind, str) else None
    if metric is None:
        raise ValueError(f"unknown row penalty {kind!r}; choose from {', '.join(ROW_METRICS)}")
    return metric


def spectrum_term(kind: str) -> SpectrumTerm:
    """The spectrum term named ``kind``; an unknown kind is refused in one sentence that names it."""
    term = SPECTRUM_TERMS.get(kind) if isinstance(kind, str) else None
    if term is None:
        raise ValueError(f"unknown spectrum penalty {kind!r}; choose from {', '.join(SPECTRUM_TERMS)}")
    return term


__all__ = ["ROW_METRICS", "SPECTRUM_TERMS", "RowMetric", "SpectrumTerm", "row_metric", "spectrum_term"]
