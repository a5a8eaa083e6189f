"""AppTest of app_pages/6_Kernelized_attention.py: error curves of the chosen methods on a zoo head,
the head's spectrum, the pattern comparison and the stored speed charts; entmax models are refused."""

import json
from pathlib import Path

import pytest
from dashboard_helpers import run_page, widget
from streamlit.testing.v1 import AppTest

from attn_core import kernels
from attn_core.sources import resolve

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "app_pages" / "6_Kernelized_attention.py")
BENCH = ROOT / "benchmarks" / "results" / "kernels.json"


def page(model: str) -> AppTest:
    return run_page(PAGE, model)


def small(at: AppTest, methods=("favor", "nystromformer")) -> AppTest:
    """Few features, seeds and samples so each rerun stays a second or two."""
    widget(at.multiselect, "Methods").set_value(list(methods))
    widget(at.multiselect, "Features m").set_value([8, 32])
    widget(at.slider, "Seeds").set_value(2)
    widget(at.number_input, "Input samples").set_value(2)
    return at.run()


def curve_methods(at: AppTest, index: int) -> set:
    spec = json.loads(at.get("plotly_chart")[index].proto.spec)
    return {trace["name"] for trace in spec["data"]} - {"∝ 1/√m"}


def test_error_curves_of_the_chosen_methods():
    at = small(page("induction-2l"), methods=("favor", "maclaurin"))
    assert not at.exception and not at.error, [e.value for e in at.error]
    charts = at.get("plotly_chart")
    assert len(charts) == 3 + (1 + ("causal" in json.loads(BENCH.read_text()))) * BENCH.is_file()
    assert curve_methods(at, 0) == curve_methods(at, 1) == {"favor", "maclaurin"}
    table = at.dataframe[0].value
    assert set(table["method"]) == {"favor", "maclaurin"} and set(table["features"]) == {8, 32}
    assert (table["n_seeds"] == 2).all()
    spec = kernels.head_spectrum(resolve("induction-2l").model, 0, 0)
    assert widget(at.metric, "stable rank of B").value == f"{spec['stable_rank']:.2f}"
    if BENCH.is_file():
        assert any("faster than torch's exact sdpa" in c.value and "1 torch thread" in c.value for c in at.caption)


def test_layer_head_and_method_changes():
    at = small(page("induction-2l"))
    first = at.dataframe[0].value
    widget(at.selectbox, "Layer").set_value(1)
    widget(at.selectbox, "Head").set_value(3)
    widget(at.checkbox, "Causal").set_value(False)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert curve_methods(at, 0) == {"favor", "nystromformer"}
    assert not first["rel_error_mean"].equals(at.dataframe[0].value["rel_error_mean"])
    spec = kernels.head_spectrum(resolve("induction-2l").model, 1, 3)
    assert widget(at.metric, "spectral norm ‖B‖₂").value == f"{spec['spectral_norm']:.3g}"
    # the side-by-side pattern follows the chosen method
    widget(at.selectbox, "Method").set_value("nystromformer")
    at.run()
    assert not at.exception and "nystromformer, m=32" in at.get("plotly_chart")[2].proto.spec


def test_no_method_is_an_error_not_a_traceback():
    at = page("induction-2l")
    widget(at.multiselect, "Methods").set_value([])
    at.run()
    assert not at.exception and "at least one method" in at.error[0].value
    assert not at.get("plotly_chart")


def test_merged_model_runs():
    at = small(page("recall-2l-merged"))
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert curve_methods(at, 0) == {"favor", "nystromformer"}


@pytest.mark.parametrize("card, alpha, message", [({"task": "reverse"}, 1.5, "α-entmax"), ({}, 1.0, "no known task")])
def test_models_without_a_softmax_pattern_or_inputs_are_refused(save_model, card, alpha, message):
    save_model("odd", card=card, n_layers=1, n_heads=1, d_model=8, d_head=4, entmax_alpha=alpha)
    at = page("odd")
    assert not at.exception
    assert any(message in w.value for w in at.warning)
    assert not at.get("plotly_chart")
