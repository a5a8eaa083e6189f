"""Figures of the bilinear form: every builder gives a Plot whose exports are valid files."""

import io
import shutil
import xml.etree.ElementTree as ET

import pandas as pd
import plotly.graph_objects as go
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import bilinear as bl
from attn_core.figures import Plot, export_bytes, write_plot
from attn_core.figures import bilinear as fb
from attn_core.sources import LoadedModel
from tests.conftest import make_tiny_model

HAS_BROWSER = shutil.which("chromium") is not None


@pytest.fixture(scope="module")
def model():
    return make_tiny_model(std=0.4, n_layers=2, n_heads=2, d_model=16, d_head=4, d_vocab=10, n_ctx=8, attn_bias=True)


@pytest.fixture(scope="module")
def loaded(model):
    return LoadedModel("test", model, model.cfg)


@pytest.fixture(scope="module")
def plots(model, loaded):
    seq = bl.sequence_view(loaded, [1, 2, 3, 1, 2, 3], layer=1)
    return {
        "scores": fb.view_plot(seq, 1, query=4),
        "pattern": fb.view_plot(seq, 0, value="pattern"),
        "query": fb.query_plot(seq, 1, 4),
        "vocab": fb.view_plot(bl.vocabulary_view(loaded, 0), 1, query=2),
        "positional": fb.view_plot(bl.positional_view(loaded, 0), 0),
        "spectrum": fb.spectrum_plot(bl.spectrum_frame(model)),
        "spectrum_grid": fb.spectrum_plot(bl.spectrum_frame(model), normalized=True, small_multiples=True),
        "eigenvalues": fb.eigen_plot(bl.eigen_frame(model)),
        "concentration": fb.concentration_plot(seq.concentration_table()),
        "heads": fb.heads_plot(bl.head_detectors(model, n_samples=2)),
    }


def test_builders_return_tidy_plots(plots):
    for key, plot in plots.items():
        assert isinstance(plot, Plot) and isinstance(plot.data, pd.DataFrame) and len(plot.data) > 0, key
        assert len(plot.fig.data) > 0, key
    scores = plots["scores"]
    assert scores.name == "sequence_scores_L1H1"
    assert {"query_label", "key_label", "score", "prob", "visible", "highlighted"} <= set(scores.data.columns)
    assert scores.data.loc[scores.data["highlighted"], "query"].unique().tolist() == [4]
    assert len(scores.fig.layout.shapes) == 1  # the highlighted query row
    assert list(scores.fig.layout.yaxis.ticktext) == ["0:1", "1:2", "2:3", "3:1", "4:2", "5:3"]
    q = plots["query"].data
    assert q["score"].is_monotonic_decreasing and len(q) == 5  # query 4 sees 5 keys
    assert plots["spectrum"].fig.layout.yaxis.type == "log"
    assert set(plots["heads"].data["detector"]) == set(bl.DETECTORS)


def test_bad_arguments(loaded):
    view = bl.sequence_view(loaded, [1, 2], 0)
    with pytest.raises(ValueError, match="value must be"):
        fb.view_plot(view, 0, value="probabilities")
    with pytest.raises(ValueError, match="query 9 is outside"):
        fb.view_plot(view, 0, query=9)
    with pytest.raises(ValueError, match="head 1 is not in this view"):
        fb.query_plot(bl.sequence_view(loaded, [1, 2], 0, heads=[0]), 1, 0)


def test_csv_and_html_exports_parse(plots, tmp_path):
    for plot in plots.values():
        csv = export_bytes(plot, "csv")
        back = pd.read_csv(io.BytesIO(csv))
        assert list(back.columns) == list(plot.data.columns) and len(back) == len(plot.data)
        html = export_bytes(plot, "html")
        assert b"<html" in html[:200].lower() and b"</html>" in html[-200:] and b"Plotly.newPlot" in html
    path = write_plot(plots["spectrum"], tmp_path / "spectrum.csv")
    assert path.is_file()
    with pytest.raises(ValueError, match="already exists"):
        write_plot(plots["spectrum"], tmp_path / "spectrum.csv")


@pytest.mark.skipif(not HAS_BROWSER, reason="PNG/SVG export needs Debian's chromium")
def test_png_and_svg_exports_are_valid(plots, tmp_path):
    for key in ("scores", "query", "spectrum", "heads"):
        png = export_bytes(plots[key], "png")
        assert png[:8] == b"\x89PNG\r\n\x1a\n", key
        svg = export_bytes(plots[key], "svg")
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg"), key
    out = write_plot(plots["eigenvalues"], tmp_path / "eigen.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_eigen_sym_plot_shows_the_symmetric_parts_eigenvalues():
    import pandas as pd

    from attn_core import bilinear
    from attn_core.figures.bilinear import eigen_sym_plot
    from attn_core.sources import resolve

    model = resolve("induction-2l").model
    rows = pd.DataFrame(bilinear.spectrum_rows(model))
    plot = eigen_sym_plot(rows)
    assert len(plot.fig.data) == len(rows)
    B = bilinear.head_B(model, 1, 2).detach().double()
    dense = torch.linalg.eigvalsh((B + B.T) / 2).flip(0)
    shown = plot.data[(plot.data["layer"] == 1) & (plot.data["head"] == 2)]["eigenvalue"].to_numpy()
    # the factored path returns the nonzero part of the spectrum; compare the extremes with the dense one
    assert abs(shown[0] - dense[0].item()) < 1e-5 and abs(shown[-1] - dense[-1].item()) < 1e-5


# --- fixed margins and lazy data ------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    x=st.one_of(st.none(), st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=80)),
    y=st.one_of(st.none(), st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=80)),
    colorbar=st.booleans(),
)
def test_fixed_margins_fit_the_labels_and_turn_crowded_ones_upright(x, y, colorbar):
    from attn_core.figures import layout as base

    fig = base.fixed_margins(go.Figure(), x, y, colorbar=colorbar)
    m = fig.layout.margin
    assert m.autoexpand is False  # plotly draws once: nothing is measured and redrawn
    widest = {k: max(len(s) for s in v) if v else base.NUMBER_CHARS for k, v in (("x", x), ("y", y))}
    assert m.l == min(base.CHAR_PX * widest["y"], base.MAX_LABEL_PX) + base.TITLE_PX
    assert m.r == (base.COLORBAR_PX if colorbar else 30) and fig.layout.yaxis.tickangle == 0
    plot_w = max(base.HALF_PX - m.l - m.r, 50)
    upright = fig.layout.xaxis.tickangle == -90
    room = min(base.CHAR_PX * widest["x"], base.MAX_LABEL_PX)
    assert upright == (x is not None and len(x) * (room + 8) > plot_w)
    if upright:  # written labels are at least a line of their font apart, or the font is the smallest
        shown = len(fig.layout.xaxis.tickvals) if fig.layout.xaxis.tickvals is not None else len(x)
        step = -(-len(x) // shown)
        font = fig.layout.xaxis.tickfont.size
        assert plot_w / len(x) * step >= 1.25 * font - 1e-9 and base.MIN_TICK_FONT <= font <= 12


def test_view_figures_carry_margins_from_their_own_labels(plots):
    scores = plots["scores"].fig
    assert scores.layout.margin.autoexpand is False
    labels = list(scores.layout.yaxis.ticktext)
    assert scores.layout.margin.l >= 8 * max(map(len, labels))


def test_plot_data_given_as_a_function_is_built_once_when_first_read():
    calls = []

    def table():
        calls.append(1)
        return pd.DataFrame({"x": [1, 2]})

    plot = Plot("lazy", go.Figure(go.Bar(x=[1, 2], y=[3, 4])), table)
    assert calls == []  # drawing needs only the figure
    assert export_bytes(plot, "csv") == b"x\n1\n2\n" and calls == [1]
    assert plot.data.equals(pd.DataFrame({"x": [1, 2]})) and calls == [1]
    renamed = plot.renamed("other")
    assert renamed.name == "other" and renamed.fig is plot.fig and renamed.data is plot.data
    with pytest.raises(ValueError, match="plain file-name stem"):
        plot.renamed("../x")


def test_position_labels_are_the_views_labels(loaded):
    tokens = [1, 2, 3, 1, 2, 3]
    assert bl.position_labels(loaded, tokens) == bl.sequence_view(loaded, tokens, 0).queries
    with pytest.raises(ValueError):
        bl.position_labels(loaded, [99])
