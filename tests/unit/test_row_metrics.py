"""The registry of row metrics and spectrum terms (attn_core/regularizers/kinds/): one class per
file, agreeing with the regularizer table; every place that computes rows or a spectrum penalty
looks its kind up there, so an unknown kind is refused by name everywhere (none falls through to
top-k or to the nuclear norm)."""

from __future__ import annotations

import pytest
import torch

from attn_core import regularizers as R
from attn_core.regularizers import kinds, rows, softmax_rows, specs
from attn_core.regularizers.kinds.base import RowMetric, SpectrumTerm
from tests.conftest import make_tiny_model


def test_the_registry_and_the_regularizer_table_agree():
    views = {name: view for name, (view, _) in specs.REGULARIZERS.items()}
    assert list(kinds.ROW_METRICS) == [n for n, v in views.items() if v == "data"] == list(rows.ROW_KINDS)
    assert {n.removeprefix("vocab_") for n, v in views.items() if v == "vocab"} <= set(kinds.ROW_METRICS)
    assert list(kinds.SPECTRUM_TERMS) == [n for n, v in views.items() if v == "spectrum"]
    assert all(isinstance(m, RowMetric) and m.name == n for n, m in kinds.ROW_METRICS.items())
    assert all(isinstance(t, SpectrumTerm) and t.name == n for n, t in kinds.SPECTRUM_TERMS.items())


def test_each_kind_is_one_class_in_its_own_file():
    for name, obj in {**kinds.ROW_METRICS, **kinds.SPECTRUM_TERMS}.items():
        assert type(obj).__module__ == f"attn_core.regularizers.kinds.{name}"


def _block(generator=None):
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 2, 3, 5, generator=g, dtype=torch.float64), torch.full((1, 1, 3), 5.0, dtype=torch.float64)


@pytest.mark.parametrize(
    "call",
    [
        lambda s, n: softmax_rows.softmax_rows("entrpy", s, n, 1),
        lambda s, n: softmax_rows.softmax_grad("entrpy", s, n, torch.ones(1, 2, 3), *([torch.zeros(1, 2, 3)] * 3), 1),
        lambda s, n: rows._entmax_grad("entrpy", s, None, n, torch.ones(1, 2, 3), 1, 1.5),
        lambda s, n: rows.row_penalty("entrpy", torch.softmax(s, -1), None),
        lambda s, n: rows.row_values(s, s, "entrpy"),
    ],
    ids=["softmax_rows", "softmax_grad", "entmax_grad", "row_penalty", "row_values"],
)
def test_an_unknown_row_kind_is_refused_by_name_everywhere(call):
    s, n = _block()
    with pytest.raises(ValueError, match=r"unknown row penalty 'entrpy'; choose from entropy, hoyer, topk, sink") as e:
        call(s, n)
    assert "\n" not in str(e.value)


def test_an_unknown_spectrum_kind_is_refused_by_name(monkeypatch):
    """A spectrum regularizer the table names but no class computes is refused (it was the
    nuclear norm without a word)."""
    monkeypatch.setitem(specs.REGULARIZERS, "frobenius", ("spectrum", "the Frobenius norm of B"))
    model = make_tiny_model(n_layers=1)
    pen = R.build_penalty(["frobenius=0.1"], model)
    with pytest.raises(ValueError, match=r"unknown spectrum penalty 'frobenius'; choose from spectral, nuclear"):
        pen(model)


def test_the_spectrum_terms_are_the_norms_of_b():
    model = make_tiny_model(n_layers=1)
    sigma = R.layer_singular_values(model, 0)
    values = {
        s: float(R.regularizer_value(specs.RegSpec(s, 1.0), model, ((0, 0), (0, 1)))) for s in ("spectral", "nuclear")
    }
    assert values["spectral"] == pytest.approx(float(sigma[:2, 0].mean()))
    assert values["nuclear"] == pytest.approx(float(sigma[:2].sum(-1).mean()))


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0])
@pytest.mark.parametrize("window", [None, 0, 3])
@pytest.mark.parametrize("with_sink", [False, True])
def test_one_pass_of_several_metrics_equals_each_alone(alpha, window, with_sink):
    """rows.row_metrics: every registered metric of every row from one pass over query blocks,
    each equal to row_values of that kind alone."""
    if with_sink and alpha != 1.0:
        pytest.skip("a sink logit joins softmax rows only")
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 3, 11, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 11, 4, generator=g, dtype=torch.float64)
    sink = torch.randn(3, generator=g, dtype=torch.float64) if with_sink else None
    kinds = {"entropy": 1, "hoyer": 1, "topk": 2, "sink": 1}
    together = rows.row_metrics(q, k, kinds, window=window, alpha=alpha, scale=0.7, block=4, sink=sink)
    for kind, topk in kinds.items():
        alone = rows.row_values(q, k, kind, window=window, alpha=alpha, scale=0.7, topk=topk, path="blocked", sink=sink)
        torch.testing.assert_close(together[kind], alone, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="unknown row penalty 'entrpy'"):
        rows.row_metrics(q, k, {"entrpy": 1})
