"""The Heatmaps page on an input over LONG_INPUT tokens: the multi-resolution map of one head
from its blocked scores (equal to the dense pattern pooled the same way), the sink column apart,
a zoom recomputed at full resolution, the query's top keys, exact window and mode split, a head
change, the grid of every head and the page's zip; never a T x T figure."""

from __future__ import annotations

import io
import json
import math
import zipfile

import pytest
import torch
from dashboard_helpers import chart, values, z_matrix
from streamlit.testing.v1 import AppTest

from attn_core import bilinear, checkpoint
from attn_core.bilinear import blocked
from attn_core.figures import bundle_zip
from attn_core.hooks import act_name
from attn_core.sources import resolve
from tests.app.test_page_heatmaps import PAGE
from tests.conftest import make_tiny_model

N = 2048  # more than blocked.LONG_INPUT, and more than a block of 512 queries


@pytest.fixture
def model_2k(tmp_path, monkeypatch) -> str:
    model = make_tiny_model(std=0.3, n_layers=2, n_heads=4, d_model=32, d_head=8, d_vocab=100, n_ctx=N, d_mlp=64)
    checkpoint.save(model, tmp_path / "models" / "ctx-2k")
    monkeypatch.setenv("ATTN_LAB_MODELS", str(tmp_path / "models"))
    return "ctx-2k"


def open_long(model: str) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.query_params.update({"model": model, "layer": "1", "head": "2"})
    at.run()
    assert not at.exception
    at.number_input(key="random_length").set_value(N).run()
    assert not at.exception and not at.error
    return at


def dense_pattern(model: str, head: int) -> tuple[list[int], torch.Tensor]:
    loaded = resolve(model)
    tokens = bilinear.random_tokens(loaded, 0, N)
    with torch.no_grad():
        _, cache = loaded.model.run_with_cache(torch.tensor([tokens]))
    return tokens, cache[act_name("pattern", 1)][0, head]


def tiled_max(A: torch.Tensor, visible: torch.Tensor, tile: int) -> torch.Tensor:
    """Max of the visible cells of ``A`` in tile x tile cells (-1 where none), independently of the library."""
    nq, nk = A.shape
    a, b = math.ceil(nq / tile), math.ceil(nk / tile)
    out = torch.full((a, b), -1.0)
    for i in range(a):
        for j in range(b):
            block = A[i * tile : (i + 1) * tile, j * tile : (j + 1) * tile]
            seen = visible[i * tile : (i + 1) * tile, j * tile : (j + 1) * tile]
            if seen.any():
                out[i, j] = block[seen].max()
    return out


def test_long_input_map_top_keys_zoom_and_head_change(model_2k, monkeypatch):
    calls = []
    monkeypatch.setattr("ui.heatmap_long.export_all", lambda plots, manifest, key: calls.append((plots, manifest)))
    at = open_long(model_2k)
    assert any(f"{N} tokens (more than {blocked.LONG_INPUT})" in i.value for i in at.info)
    tokens, A = dense_pattern(model_2k, 2)
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    for c in at.get("plotly_chart"):  # no figure carries T x T cells
        fig = json.loads(c.proto.spec)
        assert (
            sum(z_matrix(fig, i).numel() for i, t in enumerate(fig["data"]) if t.get("type") == "heatmap") < N * N / 4
        )

    # the map: A max-pooled in 3 x 3 tiles (2047 keys past the sink in 800 px), the sink column apart
    fig = chart(at, "long_map")
    assert "layer 1 head 2" in fig["layout"]["title"]["text"] and "sink (key 0) apart" in fig["layout"]["title"]["text"]
    sink, cells = z_matrix(fig, 0), z_matrix(fig, 1)
    tile = math.ceil((N - 1) / 800)
    assert cells.shape == (math.ceil(N / tile), math.ceil((N - 1) / tile)) and sink.shape == (cells.shape[0], 1)
    torch.testing.assert_close(cells.nan_to_num(-1), tiled_max(A[:, 1:], causal[:, 1:], tile), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(sink.nan_to_num(-1), tiled_max(A[:, :1], causal[:, :1], tile), atol=1e-5, rtol=1e-4)

    # the query's top keys (the query slider: the last position by default) and its mode split
    q = N - 1
    bars = chart(at, "long_top")["data"][0]
    best = torch.topk(A[q], blocked.TOP_K)
    assert list(bars["x"]) == [f"{j}:{tokens[j]}" for j in best.indices.tolist()]
    torch.testing.assert_close(values(bars["y"]), best.values, atol=1e-5, rtol=1e-4)
    split = chart(at, "long_split")
    assert {n for t in split["data"] for n in ([t.get("name")] if t.get("name") else [])}

    # zoom: queries 1000..1199 x keys 900..1199 at full resolution, equal to A there
    at.slider(key="long_rows").set_value((1000, 1199))
    at.slider(key="long_cols").set_value((900, 1199)).run()
    assert not at.exception
    zoom = chart(at, "long_map")
    z = z_matrix(zoom)
    region = A[1000:1200, 900:1200].masked_fill(~causal[1000:1200, 900:1200], math.nan)
    assert z.shape == (200, 300) and "one cell per query × key" in zoom["layout"]["title"]["text"]
    torch.testing.assert_close(z.nan_to_num(-1), region.nan_to_num(-1), atol=1e-5, rtol=1e-4)

    # a head change recomputes that head's blocks only (the layer's Q and K are kept)
    at.selectbox(key="head").select(0).run()
    assert not at.exception and "layer 1 head 0" in chart(at, "long_map")["layout"]["title"]["text"]

    # the page's zip: every figure (PNG/SVG/HTML/CSV) and the settings
    plots, manifest = calls[-1]
    names = [p.name for p in plots]
    assert names[:7] == [
        "long_pattern_L1H0_q1000-1200_k900-1200",  # the zoomed map
        f"long_top_L1H0_q{N - 1}",
        f"window_scores_L1H0_q{N - 1}",  # the exact window of full rows
        f"window_pattern_L1H0_q{N - 1}",
        f"attribution_L1H0_q{N - 1}",
        "long_rows_L1H0",
        "long_offsets_L1H0",
    ]
    assert len(names) > 7  # then the vocabulary and positional views
    assert manifest["blocked"] is True and manifest["n_tokens"] == N and manifest["head"] == 0
    blob = bundle_zip(plots, manifest, formats=("csv", "html"))
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        assert json.loads(zf.read("manifest.json"))["layer"] == 1
        rows_csv = zf.read("long_rows_L1H0.csv").decode().splitlines()
        assert b"Plotly.newPlot" in zf.read(f"{names[0]}.html")
    assert rows_csv[0].startswith("head,query,query_label,rank,key,key_label") and len(rows_csv) > N


def test_every_head_as_a_coarse_map(model_2k):
    at = open_long(model_2k)
    at.selectbox(key="head").select(
        "all (grid)" if "all (grid)" in at.selectbox(key="head").options else at.selectbox(key="head").options[-1]
    ).run()
    assert not at.exception
    for h in range(4):
        fig = chart(at, f"long_grid_{h}")
        assert f"head {h}" in fig["layout"]["title"]["text"] and z_matrix(fig, 1).shape[0] <= 400


def test_the_rows_csv_is_every_querys_top_keys(model_2k):
    from attn_core.bilinear.blocked import layer_qk, row_stats
    from attn_core.bilinear.long_map import top_frame
    from attn_core.figures import export_bytes
    from attn_core.figures.long_view import rows_plot

    loaded = resolve(model_2k)
    tokens, A = dense_pattern(model_2k, 1)
    stats = row_stats(layer_qk(loaded.model, tokens, 1), 1, k=3)
    frame = top_frame(stats, bilinear.position_labels(loaded, tokens))
    assert len(frame) == 3 * N - 3  # query 0 sees one key, query 1 two
    csv = export_bytes(rows_plot(stats, 1, bilinear.position_labels(loaded, tokens)), "csv").decode()
    lines = csv.splitlines()
    assert lines[0].startswith("head,query,query_label,rank,key,key_label,offset,score,weight,entropy,sink")
    assert len(lines) == 3 * N - 3 + 1
    w = torch.tensor(frame["weight"].to_numpy()).view(-1)[-3:]
    torch.testing.assert_close(w.float(), torch.topk(A[N - 1], 3).values, atol=1e-5, rtol=1e-4)
