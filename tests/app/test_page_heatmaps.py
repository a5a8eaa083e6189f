"""AppTest of app_pages/1_Heatmaps.py: the heatmaps show the model's own scores and pattern for the
chosen layer, head, input and query; the per-query metrics are those of that row; bad input and
bad URL values fall back with a message; choices survive a page switch; the zip has every figure."""

import io
import json
import zipfile
from pathlib import Path

import pytest
import torch
from dashboard_helpers import chart, has_chart, values, z_matrix
from streamlit.testing.v1 import AppTest

import ui
from attn_core import bilinear, checkpoint
from attn_core.figures import bundle_zip
from attn_core.hooks import act_name
from attn_core.sources import resolve
from tests.conftest import make_tiny_model
from ui import heatmap_later as later

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "app_pages" / "1_Heatmaps.py")
MODEL = "induction-2l"
SINGLE = ["scores", "pattern", "query_row", "vocab", "positional"]


def metric(at: AppTest, label: str) -> float:
    return float(next(m for m in at.metric if m.label.startswith(label)).value.rstrip("%"))


def model_forward(tokens: list[int]) -> dict:
    """The model's own cached scores/pattern: an independent path (einsums on Q and K)."""
    model = resolve(MODEL).model
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([tokens]))
    return cache


@pytest.fixture
def page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params["model"] = MODEL  # the page under test, on the induction model
    at.run()
    assert not at.exception
    return at


def test_default_page_draws_every_view_with_downloads(page):
    assert not page.error and not page.warning
    assert len(page.get("plotly_chart")) == len(SINGLE)
    for key in SINGLE:
        chart(page, key)
    assert len(page.download_button) == 4 * len(SINGLE) + 1  # PNG/SVG/HTML/CSV each + the zip
    assert page.selectbox(key="layer").value == 0 and page.selectbox(key="head").value == 0
    assert page.query_params["model"] == MODEL and page.query_params["head"] == "0"


def test_a_first_visit_in_a_browser_sends_the_heatmaps_first_and_the_rest_on_the_next_run(monkeypatch):
    """In a browser, the session's first run sends the scores and pattern heatmaps alone (plotly.js
    draws them with no later figure ahead of them) and a signal that reruns the page once they are
    drawn; that run, like any later one, draws the whole page."""
    monkeypatch.setattr(later, "in_browser", lambda: True)
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params["model"] = MODEL
    at.run()
    assert not at.exception and not at.error
    assert [c.proto.id.rsplit("-chart_", 1)[1] for c in at.get("plotly_chart")] == ["scores", "pattern"]
    assert any("follow" in c.value for c in at.caption)
    assert not any(b.label.startswith("Download all figures") for b in at.download_button)
    at.run()  # the browser's signal that the heatmaps are drawn (or any other rerun)
    assert not at.exception
    assert [c.proto.id.rsplit("-chart_", 1)[1] for c in at.get("plotly_chart")] == SINGLE
    assert any(b.label.startswith("Download all figures") for b in at.download_button)
    at.selectbox(key="head").select(1).run()  # later runs never wait again
    assert len(at.get("plotly_chart")) == len(SINGLE)


def test_heatmaps_follow_layer_head_and_query(page):
    page.selectbox(key="layer").select(1)
    page.selectbox(key="head").select(2)
    page.run()
    page.select_slider(key="query").set_value(9).run()
    assert not page.exception and not page.error
    tokens = bilinear.sample_tokens(resolve(MODEL), 0)
    cache = model_forward(tokens)
    S = cache[act_name("attn_scores", 1)][0, 2]
    A = cache[act_name("pattern", 1)][0, 2]
    causal = torch.tril(torch.ones_like(S, dtype=torch.bool))

    scores = chart(page, "scores")
    assert "layer 1 head 2" in scores["layout"]["title"]["text"]
    z = z_matrix(scores)
    assert torch.isnan(z[~causal]).all()  # hidden keys are blank
    torch.testing.assert_close(z[causal], S[causal], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(z_matrix(chart(page, "pattern"))[causal], A[causal], atol=1e-6, rtol=1e-4)
    box = scores["layout"]["shapes"][0]
    assert (box["y0"], box["y1"]) == (8.5, 9.5)  # the outlined row is the query's
    names = resolve(MODEL).task.token_names
    assert scores["layout"]["yaxis"]["ticktext"][9] == f"9:{names[tokens[9]]}"

    bars = chart(page, "query_row")["data"][0]
    torch.testing.assert_close(values(bars["y"]), S[9, :10].sort(descending=True).values, atol=1e-5, rtol=1e-4)

    row = A[9, :10]
    assert metric(page, "visible keys") == 10
    assert metric(page, "entropy") == pytest.approx(float(-(row * row.log()).sum()), abs=1e-3)
    assert metric(page, "participation ratio") == pytest.approx(float(1 / (row**2).sum()), abs=1e-3)
    assert metric(page, "topk mass (k=1)") == pytest.approx(float(row.max()), abs=1e-3)
    table = page.dataframe[0].value
    assert set(table["head"]) == {2}
    # the head's mean is over the rows that see >= 2 keys: positions 1..T-1
    entropies = [float(-(A[i, : i + 1] * A[i, : i + 1].clamp_min(1e-30).log()).sum()) for i in range(1, len(A))]
    mean = table.set_index("metric").loc["entropy", "mean"]
    assert mean == pytest.approx(sum(entropies) / len(entropies), abs=1e-4)


def test_vocabulary_and_positional_views_highlight_the_query(page):
    page.select_slider(key="query").set_value(3).run()
    tokens = bilinear.sample_tokens(resolve(MODEL), 0)
    vocab = chart(page, "vocab")
    assert (vocab["layout"]["shapes"][0]["y0"] + 0.5) == tokens[3]  # the row of token x
    assert len(z_matrix(vocab)) == resolve(MODEL).config.d_vocab
    pos = chart(page, "positional")
    assert pos["layout"]["shapes"][0]["y0"] + 0.5 == 3
    with torch.no_grad():
        expected = bilinear.positional_scores(resolve(MODEL).model, 0, [0])[0]
    z = z_matrix(pos)
    causal = torch.tril(torch.ones_like(expected, dtype=torch.bool))
    torch.testing.assert_close(z[causal], expected[causal], atol=1e-5, rtol=1e-4)


def test_grid_of_every_head(page):
    page.selectbox(key="head").select("all").run()
    assert not page.exception
    n_heads = resolve(MODEL).config.n_heads
    titles = [chart(page, f"grid_{h}")["layout"]["title"]["text"] for h in range(n_heads)]
    assert [f"head {h}" in t for h, t in enumerate(titles)] == [True] * n_heads
    page.radio(key="grid_value").set_value("pattern").run()
    assert "pattern A" in chart(page, "grid_1")["layout"]["title"]["text"]
    assert set(page.dataframe[0].value["head"]) == set(range(n_heads))


def test_typed_and_random_inputs(page):
    page.radio(key="input").set_value("typed").run()
    page.text_input(key="typed").input("a b c a b").run()
    assert not page.exception and not page.error
    assert len(z_matrix(chart(page, "scores"))) == 5
    assert page.select_slider(key="query").value == 4  # the query moved to the new last token

    page.text_input(key="typed").input("a b ZZ").run()
    assert not page.exception
    assert "unknown tokens" in page.error[0].value and not page.get("plotly_chart")

    page.radio(key="input").set_value("random").run()
    page.number_input(key="random_length").set_value(7).run()
    assert not page.error
    tokens = bilinear.random_tokens(resolve(MODEL), 0, 7)
    S = model_forward(tokens)[act_name("attn_scores", 0)][0, 0]
    causal = torch.tril(torch.ones_like(S, dtype=torch.bool))
    torch.testing.assert_close(z_matrix(chart(page, "scores"))[causal], S[causal], atol=1e-5, rtol=1e-4)


def test_url_parameters_and_bad_values_fall_back():
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params.update({"model": MODEL, "layer": "1", "head": "3", "query": "99", "input": "nonsense"})
    at.run()
    assert not at.exception
    assert at.selectbox(key="layer").value == 1 and at.selectbox(key="head").value == 3
    warnings = " ".join(w.value for w in at.warning)
    assert "query='99'" in warnings and "input='nonsense'" in warnings
    assert at.select_slider(key="query").value == 23 and at.radio(key="input").value == "sample"
    assert "layer 1 head 3" in chart(at, "scores")["layout"]["title"]["text"]


def test_choices_survive_a_page_switch():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90)
    at.query_params["model"] = MODEL
    at.run()
    at.switch_page("app_pages/1_Heatmaps.py").run()
    at.selectbox(key="layer").select(1)
    at.selectbox(key="head").select(3)
    at.run()
    at.switch_page("app_pages/2_Spectrum.py").run()
    assert not at.exception
    assert at.selectbox(key="layer").value == 1 and at.selectbox(key="head").value == 3
    at.switch_page("app_pages/0_Home.py").run()
    at.switch_page("app_pages/1_Heatmaps.py").run()
    assert at.selectbox(key="layer").value == 1 and at.selectbox(key="head").value == 3
    assert "layer 1 head 3" in chart(at, "scores")["layout"]["title"]["text"]


def test_export_all_gets_every_figure_and_the_settings(monkeypatch):
    calls = []
    monkeypatch.setattr(ui, "export_all", lambda plots, manifest, key: calls.append((plots, manifest, key)))
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params["model"] = MODEL
    at.run()
    assert not at.exception
    ((plots, manifest, key),) = calls
    assert key == "heatmaps"
    assert [p.name for p in plots] == [
        "sequence_scores_L0H0",
        "sequence_pattern_L0H0",
        "query_sequence_L0H0_q23",
        "concentration",
        "vocabulary_scores_L0H0",
        "positional_scores_L0H0",
    ]
    blob = bundle_zip(plots, manifest, formats=("csv",))
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        saved = json.loads(zf.read("manifest.json"))
        scores_csv = zf.read("sequence_scores_L0H0.csv").decode()
    assert saved["model"] == MODEL and saved["layer"] == 0 and saved["head"] == 0 and saved["query"] == 23
    assert saved["tokens"] == bilinear.sample_tokens(resolve(MODEL), 0)
    assert scores_csv.splitlines()[0].startswith("layer,head,query,key")


def test_why_this_key_explains_the_sequence_views_top_key(page):
    assert not any(c.proto.id.endswith("-chart_why_attribution") for c in page.get("plotly_chart"))  # off by default
    page.toggle(key="why_key").set_value(True).run()
    page.select_slider(key="query").set_value(17).run()
    assert not page.exception and not page.error
    assert any(h.value.startswith("Why this key") for h in page.header)
    pattern = z_matrix(chart(page, "pattern"))[17, :18]  # the sequence view's row of the chosen query
    top = int(pattern.argmax())
    bars = chart(page, "why_attribution")
    assert bars["data"][0]["x"][0].endswith(f"({top})")  # keys best first: the first is the argmax
    assert f"Winner (key {top})" in chart(page, "why_runner_up")["layout"]["title"]["text"]
    split = chart(page, "why_token_position")  # layer 0, learned positions: the token/position parts
    assert {t["name"] for t in split["data"]} >= {"token-token", "position-position", "bias"}
    chart(page, "why_value_weighted")
    # layer 1: the same for another head, and no token/position split there
    page.selectbox(key="layer").select(1)
    page.selectbox(key="head").select(2)
    page.run()
    assert not page.exception
    pattern = z_matrix(chart(page, "pattern"))[17, :18]
    assert chart(page, "why_attribution")["data"][0]["x"][0].endswith(f"({int(pattern.argmax())})")
    assert not any(c.proto.id.endswith("-chart_why_token_position") for c in page.get("plotly_chart"))


# --- long inputs (more than LONG_INPUT tokens): the one long view, from the blocked engine --------------

LONG_N = 600  # more than bilinear.LONG_INPUT, less than the 1024 the page once kept a second view for


@pytest.fixture
def long_model(tmp_path, monkeypatch) -> str:
    """A random model with a 1024-token context (2 layers, 4 heads, d_model 32, biases, an MLP),
    saved in ATTN_LAB_MODELS under the name ``long-2l``; it has no task."""
    model = make_tiny_model(
        std=0.3, n_layers=2, n_heads=4, d_model=32, d_head=8, d_vocab=100, n_ctx=1024, attn_bias=True, d_mlp=64
    )
    checkpoint.save(model, tmp_path / "models" / "long-2l")
    monkeypatch.setenv("ATTN_LAB_MODELS", str(tmp_path / "models"))
    return "long-2l"


def long_page(model: str, length: int = LONG_N) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.query_params.update({"model": model, "layer": "1", "head": "2", "query": "500"})
    at.run()
    assert not at.exception and at.number_input(key="random_length").value == 1024  # the context by default
    at.number_input(key="random_length").set_value(length).run()  # a new length moves the query to its end
    at.select_slider(key="query").set_value(500).run()
    assert not at.exception and not at.error
    return at


def cells(fig: dict) -> int:
    return sum(z_matrix(fig, i).numel() for i, t in enumerate(fig["data"]) if t.get("type") == "heatmap")


def test_a_long_input_under_1024_tokens_shows_the_one_long_view_and_loses_nothing(long_model):
    """600 tokens: the map, the query's top keys (the one default, blocked.TOP_K) and its row
    metrics, the exact window of full rows, the rows' entropy and sink mass, the offsets and the
    vocabulary and positional views; the values are the model's own."""
    at = long_page(long_model)
    lm = resolve(long_model)
    tokens = bilinear.random_tokens(lm, 0, LONG_N)
    assert any(f"{LONG_N} tokens (more than {bilinear.LONG_INPUT})" in i.value for i in at.info)
    for key in ("scores", "pattern", "query_row", "overview"):  # the dense figures and the old overview are gone
        assert not has_chart(at, key)
    for key in ("long_map", "window_scores", "window_pattern", "long_top", "long_split", "long_rows", "long_offsets"):
        assert has_chart(at, key), key
    for key in ("vocab", "positional"):
        assert has_chart(at, key), key
    with torch.no_grad():
        _, cache = lm.model.run_with_cache(torch.tensor([tokens]))
    S, A = cache[act_name("attn_scores", 1)][0, 2], cache[act_name("pattern", 1)][0, 2]

    # the window: the exact scores of positions 437..500 (w = 64 ending at the query), causal
    window = chart(at, "window_scores")
    assert "layer 1 head 2" in window["layout"]["title"]["text"] and "437..500" in window["layout"]["title"]["text"]
    z, ref = z_matrix(window), S[437:501, 437:501]
    causal = torch.ones(64, 64, dtype=torch.bool).tril()
    assert torch.isnan(z[~causal]).all()
    torch.testing.assert_close(z[causal], ref[causal], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(
        z_matrix(chart(at, "window_pattern"))[causal], A[437:501, 437:501][causal], atol=1e-6, rtol=1e-4
    )

    # the top keys: torch.topk of the query's whole row, the one default k
    bars = chart(at, "long_top")["data"][0]
    best = torch.topk(A[500, :501], bilinear.blocked.TOP_K)
    assert list(bars["x"]) == [f"{j}:{tokens[j]}" for j in best.indices.tolist()]
    torch.testing.assert_close(values(bars["y"]), best.values, atol=1e-6, rtol=1e-4)
    assert metric(at, "visible keys") == 501
    assert metric(at, "entropy") == pytest.approx(float(-(A[500, :501] * A[500, :501].log()).sum()), abs=1e-3)

    # the map of 600 tokens fits the medium resolution: every cell, the model's A (key 0 apart)
    lmap = chart(at, "long_map")
    main = z_matrix(lmap, max(i for i, t in enumerate(lmap["data"]) if t.get("type") == "heatmap"))
    assert main.shape[0] == LONG_N
    torch.testing.assert_close(main.nan_to_num(0), A[:, LONG_N - main.shape[1] :], atol=1e-6, rtol=1e-4)


def test_long_input_follows_head_query_and_settings(long_model):
    at = long_page(long_model)
    at.selectbox(key="head").select(0).run()
    at.select_slider(key="query").set_value(10).run()
    at.number_input(key="window").set_value(16).run()
    at.radio(key="long_pool").set_value("mean").run()
    assert not at.exception and not at.error
    window = chart(at, "window_scores")
    assert "Window 0..15" in window["layout"]["title"]["text"] and "layer 1 head 0" in window["layout"]["title"]["text"]
    assert "head 0" in chart(at, "long_map")["layout"]["title"]["text"]
    at.toggle(key="long_heads_table").set_value(True).run()  # every head's concentration, from blocked rows
    assert not at.exception and set(at.dataframe[0].value["head"]) == set(range(4))
    assert set(at.dataframe[0].value["metric"]) == {"entropy", "normalized_entropy", "topk_mass", "sink_mass"}
    at.toggle(key="long_window_on").set_value(False).run()  # the exact window is on request
    assert not at.exception and not has_chart(at, "window_scores")
    # every head: a coarse map each
    at.selectbox(key="head").select("all").run()
    assert not at.exception
    for h in range(4):
        assert f"head {h}" in chart(at, f"long_grid_{h}")["layout"]["title"]["text"]


def test_long_input_exports(long_model, monkeypatch):
    calls = []
    monkeypatch.setattr("ui.heatmap_long.export_all", lambda plots, manifest, key: calls.append((plots, manifest)))
    at = long_page(long_model)
    assert not at.exception and not at.error
    plots, manifest = calls[-1]
    names = [p.name for p in plots]
    assert {"window_scores_L1H2_q500", "window_pattern_L1H2_q500", "long_top_L1H2_q500"} <= set(names)
    assert manifest["long_input"] is True and manifest["n_tokens"] == LONG_N and manifest["query"] == 500
    window = next(p for p in plots if p.name == "window_scores_L1H2_q500")
    blob = bundle_zip([window], manifest, formats=("csv",))
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        window_csv = zf.read("window_scores_L1H2_q500.csv").decode().splitlines()
    assert len(window_csv) == 1 + 64 * 64 and window_csv[0].startswith("layer,head,query,key")


def test_long_input_with_a_query_past_the_positional_views_cut(long_model):
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.query_params["model"] = long_model
    at.run()  # random tokens filling the context, the query on the last one (past the positional view's 512)
    assert not at.exception and not at.error
    assert at.select_slider(key="query").value == 1023
    assert "Window 960..1023 of 1024 tokens" in chart(at, "window_scores")["layout"]["title"]["text"]
    assert chart(at, "positional")["layout"].get("shapes") is None  # no row to outline there


def test_short_inputs_of_a_long_model_stay_dense(long_model):
    at = long_page(long_model, length=bilinear.LONG_INPUT)
    assert not any("more than" in i.value for i in at.info)
    assert z_matrix(chart(at, "scores")).shape == (bilinear.LONG_INPUT, bilinear.LONG_INPUT)
