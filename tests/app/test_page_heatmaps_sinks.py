"""AppTest of the Heatmaps page's attention sinks: the sink-aware mode (sinks apart, or left out
with the rows renormalized) draws the library's figures of the head on this input and measures the
concentration without the sink keys; the section shows every head's key importance on probes."""

from pathlib import Path

import pytest
import torch
from dashboard_helpers import chart, open_page, values, z_matrix

from attn_core import bilinear, metrics
from attn_core.sources import resolve
from attn_core.text.probes import measure_sinks

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "1_Heatmaps.py")
MODEL = "sort-2l-mlp"  # three heads of layer 0 sink on token 0 (measured)


@pytest.fixture(scope="module")
def page():
    at = open_page(PAGE, MODEL)
    at.selectbox(key="head").select(1).run()
    return at


def test_sinks_apart_and_renormalized(page):
    loaded = resolve(MODEL)
    tokens = bilinear.sample_tokens(loaded, 0)
    view = bilinear.sequence_view(loaded, tokens, 0)
    sinks = view.sink_keys()[1]
    assert sinks.any()
    page.radio(key="sink_mode").set_value("apart").run()
    assert not page.exception and page.query_params["sinks"] == "apart"
    fig = chart(page, "pattern")
    assert [len(t["x"]) for t in fig["data"]] == [int(sinks.sum()), int((~sinks).sum())]
    assert any("Sink keys of this head on this input" in c.value for c in page.caption)

    page.radio(key="sink_mode").set_value("renormalized").run()
    z = z_matrix(chart(page, "pattern"))
    p, m = metrics.drop_keys(view.pattern[1], view.mask, sinks)
    expect = p.masked_fill(~m, float("nan"))[:, ~sinks]
    assert torch.allclose(z.nan_to_num(-1), expect.float().nan_to_num(-1), atol=1e-6)
    # the query's metrics and the table are measured without the sink keys
    q = len(tokens) - 1
    without = view.concentration(1, without_sinks=True)["normalized_entropy"][1, q]
    shown = float(next(m for m in page.metric if m.label == "normalized entropy").value)
    assert shown == pytest.approx(float(without), abs=1e-3)
    table = page.dataframe[0].value
    assert "sink_keys" in table and table[table["metric"] == "normalized_entropy"]["sink_keys"].iloc[0] == "0 5"

    page.radio(key="sink_mode").set_value("off").run()
    assert len(chart(page, "pattern")["data"]) == 1 and "sink_keys" not in page.dataframe[0].value


def test_the_section_on_task_samples_and_on_this_input(page):
    page.toggle(key="sinks_section").set_value(True).run()
    assert not page.exception
    found = measure_sinks(resolve(MODEL))
    fig = chart(page, "sinks")
    assert torch.allclose(values(fig["data"][0]["z"]).double(), found.importance.reshape(-1, 12), atol=1e-6)
    rate = next(m for m in page.metric if m.label == "sink rate")
    assert rate.value == f"{found.rate:.0%}"
    page.radio(key="heatmap_probes").set_value("input").run()
    one = bilinear.sinks(resolve(MODEL).model, [bilinear.sample_tokens(resolve(MODEL), 0)])
    z = values(chart(page, "sinks")["data"][0]["z"]).double()
    assert torch.allclose(z, one.importance.reshape(-1, 12), atol=1e-6)


def test_a_bad_sinks_url_value_falls_back():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params["model"] = MODEL
    at.query_params["sinks"] = "everywhere"
    at.run()
    assert not at.exception and at.radio(key="sink_mode").value == "off"
    assert any("sinks" in w.value for w in at.warning)
