"""The rules every figure keeps (attn_core.figures.base.finish, applied to every Plot) and the
export that looks like the page: no zero line across a heatmap, no Streamlit placeholder
colours in a PNG/SVG, bars from zero (never on a log axis), log axes by decades in powers of ten,
titles wrapped at the chart's width, scatter labels that do not collide, a head named when the
spectrum shows one, and one colour per merged-vs-factored variant whatever the comparison."""

import math
import re
import shutil
import struct

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from plotly.subplots import make_subplots

from attn_core import bilinear, sources
from attn_core.figures import Plot, export_bytes
from attn_core.figures import bilinear as fb
from attn_core.figures import qk as fq
from attn_core.figures import training as ft
from attn_core.figures.base import LIGHT, PNG_SCALE, export_figure
from attn_core.figures.layout import DEFAULT_HEIGHT, place_labels, wrap_title
from attn_core.figures.scales import colors, nice_ticks, tick_text
from attn_core.figures.tables import cell_text, readable


@pytest.fixture(scope="module")
def model():
    return sources.resolve("induction-2l")


def test_a_heatmap_has_no_zero_line_or_grid(model):
    view = bilinear.sequence_view(model, bilinear.sample_tokens(model, 0), 1, [0])
    fig = fb.view_plot(view, 0, 3).fig
    for axis in (fig.layout.xaxis, fig.layout.yaxis):
        assert axis.zeroline is False and axis.showgrid is False


@pytest.mark.skipif(shutil.which("chromium") is None, reason="PNG/SVG export needs chromium")
def test_an_export_from_the_dashboard_process_looks_like_the_page(model, monkeypatch):
    """In the dashboard's process Streamlit makes its own template the default, whose colours
    are placeholders (#000001...) only its page replaces: an export must not carry them."""
    from streamlit.elements.lib.streamlit_plotly_theme import configure_streamlit_plotly_theme

    monkeypatch.setattr(pio.templates, "default", pio.templates.default)
    configure_streamlit_plotly_theme()  # what the server does
    view = bilinear.sequence_view(model, bilinear.sample_tokens(model, 0), 1, [0])
    plot = fb.view_plot(view, 0, 3)
    assert plot.fig.layout.template.layout.colorway[0] == "#000001"  # the page's placeholder template
    svg = export_bytes(plot, "svg").decode()
    assert not re.search(
        r"#0000[0-3][0-9]|rgb\(0, 0, (?:[1-9]|[1-5][0-9]|6[0-4])\)", svg
    )  # no placeholder colour reached the file
    assert not re.findall(r'class="[xy]zl zl', svg)  # no zero line across row 0 (plotly's path class "yzl zl")
    assert export_figure(plot.fig).layout.template == LIGHT
    # drawn at the size the page draws it (its ticks and wrapped title were fitted to that width);
    # a PNG with twice the pixels each way
    height = plot.fig.layout.height or DEFAULT_HEIGHT
    assert re.search(rf'<svg[^>]* width="{plot.width}" height="{height}"', svg), svg[:300]
    png = export_bytes(plot, "png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (PNG_SCALE * plot.width, PNG_SCALE * height)
    wide = export_bytes(fb.view_plot(view, 0, 3), "svg", width=800, height=300).decode()
    assert re.search(r'<svg[^>]* width="800" height="300"', wide)  # a size asked for is kept


def test_bars_start_at_zero_and_never_stand_on_a_log_axis():
    fig = go.Figure(go.Bar(x=["a", "b"], y=[3, 4]))
    assert Plot("bars", fig, pd.DataFrame()).fig.layout.yaxis.rangemode == "tozero"
    log = go.Figure(go.Bar(x=["a", "b"], y=[3, 4])).update_yaxes(type="log")
    with pytest.raises(ValueError, match="log axis"):
        Plot("bars", log, pd.DataFrame())


def test_the_qk_loss_is_dots_on_a_log_axis_and_accuracy_bars_from_zero():
    from attn_core import qk as Q

    fig = fq.final_plot(Q.Comparison.load(Q.results_path())).fig
    kinds = {(t.type, t.yaxis or "y") for t in fig.data}
    assert ("bar", "y") not in kinds and ("bar", "y2") in kinds
    assert fig.layout.yaxis.type == "log" and list(fig.layout.yaxis2.range) == [-0.02, 1.02]


def test_log_axes_tick_by_decades_in_powers_of_ten(model):
    frame = bilinear.spectrum_frame(model.model)
    fig = fb.spectrum_plot(frame).fig
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.exponentformat == "power"
    assert isinstance(fig.layout.yaxis.dtick, int) and fig.layout.yaxis.dtick >= 1
    tiny = go.Figure(go.Scatter(x=list(range(20)), y=[10.0**-k for k in range(20)])).update_yaxes(type="log")
    axis = Plot("tiny", tiny, pd.DataFrame()).fig.layout.yaxis
    assert axis.exponentformat == "power" and axis.dtick >= 2  # 20 decades: not a label per decade in 300 px


def test_the_one_head_spectrum_names_its_head(model):
    frame = bilinear.spectrum_frame(model.model)
    one = frame[(frame["layer"] == 1) & (frame["head"] == 2)]
    assert fb.spectrum_plot(one).fig.layout.title.text == "Singular values of B, L1H2"
    assert "per head" in fb.spectrum_plot(frame).fig.layout.title.text


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(alphabet="abcdefghij ,:", min_size=1, max_size=12), min_size=1, max_size=20), st.integers(20, 120)
)
def test_titles_wrap_to_the_width_and_keep_every_word(words, chars):
    text = " ".join(w.strip() or "x" for w in words)
    wrapped = wrap_title(text, chars)
    lines = wrapped.split("<br>")
    assert " ".join(lines).split() == text.split()
    assert all(len(line) <= chars or " " not in line for line in lines)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-1, 1), st.floats(-1, 1)), min_size=1, max_size=12))
def test_scatter_labels_name_every_point_once(points):
    named = [(x, y, f"L{i}H0") for i, (x, y) in enumerate(points)]
    placed = place_labels(named, (-1.1, 1.1), (-1.1, 1.2))
    names = [n for _, _, text, _ in placed for n in text.split(", ")]
    assert sorted(names) == sorted(p[2] for p in named)
    for x, y, _, side in placed:
        assert math.isfinite(x) and math.isfinite(y) and side in {
            "top center", "bottom center", "middle right", "middle left",
            "top right", "top left", "bottom right", "bottom left",
        }  # fmt: skip


def test_a_variant_has_one_colour_in_every_comparison():
    full = fq.variant_colors(
        [
            "factored d_qk=1",
            "factored d_qk=2",
            "factored d_qk=4",
            "factored d_qk=16",
            "merged",
            "merged + wd",
            "merged + nuclear",
        ]
    )
    fresh = fq.variant_colors(["factored d_qk=2", "factored d_qk=16", "merged + wd"])
    assert all(fresh[name] == full[name] for name in fresh)
    assert len(set(full.values())) == len(full)


def _dynamics_with_a_phase_change():
    """A two-layer series whose ICL score falls suddenly between steps 40 and 80."""
    from attn_core import dynamics as D

    steps = [0, 10, 20, 40, 60, 80, 120, 200]
    icl = [0.0, -0.01, -0.02, -0.05, -1.2, -2.3, -2.4, -2.45]
    order = ["L0H0", "L0H1", "L1H0", "L1H1"]
    metrics = {"loss": [3.0, 2.99, 2.98, 2.97, 2.0, 1.1, 1.09, 1.08], "icl_score": icl}  # the loss falls with it
    for h in order:
        metrics[f"prefix_matching:{h}"] = [0.1] * len(steps)
        metrics[f"previous_token:{h}"] = [0.2] * len(steps)
        metrics[f"sigma_max:{h}"] = [1.0 + i for i in range(len(steps))]
        metrics[f"entropy_data:{h}"] = [0.9 - 0.05 * i for i in range(len(steps))]
        metrics[f"entropy_bound:{h}"] = [0.5 - 0.05 * i for i in range(len(steps))]
    k = [[[0.1] * 4 for _ in range(4)] for _ in steps]
    return D.Dynamics(
        steps=steps,
        metrics=metrics,
        phase_change=D.phase_change(steps, icl, metrics["loss"]),
        k_composition=k,
        order=order,
        layers=[0, 0, 1, 1],
    )


def test_the_dynamics_curves_shade_the_phase_change_and_mark_the_step():
    from attn_core.figures import dynamics as fdyn

    dyn = _dynamics_with_a_phase_change()
    pc = dyn.phase_change
    assert pc is not None and 40 <= pc["step"] <= 80, pc
    a, b = pc["window"]
    for plot in fdyn.panels(dyn, 1, 0, step=60):
        shapes = plot.fig.layout.shapes
        shaded = [s for s in shapes if s.type == "rect"]
        lines = [s for s in shapes if s.type == "line"]
        assert len(shaded) == 1 and (shaded[0].x0, shaded[0].x1) == (a, b), plot.name
        assert len(lines) == 1 and lines[0].x0 == lines[0].x1 == 60, plot.name
        assert any(f"phase change ~{pc['step']}" in (n.text or "") for n in plot.fig.layout.annotations), plot.name
    names = [t.name for t in fdyn.spectrum_entropy_plot(dyn, 1, 0).fig.data]
    assert names == ["σ₁(B)", "entropy on data H/log n", "entropy floor (Zhai et al.)"]
    flat = dyn.metrics["icl_score"][:1] * len(dyn.steps)  # no fall: nothing shaded
    still = type(dyn)(**{**dyn.__dict__, "metrics": {**dyn.metrics, "icl_score": flat}, "phase_change": None})
    assert not [s for s in fdyn.loss_plot(still).fig.layout.shapes if s.type == "rect"]


# --- issue 31: what the gallery's browser test now also catches, checked on the figures -----------


def test_a_title_breaks_evenly_and_a_long_path_never_runs_out():
    title = wrap_title("before (run:20261127-004725-b1a881): pattern A, layer 1 head 0", 54)
    assert title == "before (run:20261127-004725-b1a881):<br>pattern A, layer 1 head 0"
    path = "Perplexity of /tmp/attn-lab-gallery-x/imported-models/a-folder-with-a-long-name/tiny-llama-24-heads"
    lines = wrap_title(path, 54).split("<br>")
    assert all(len(line) <= 54 for line in lines) and "".join(lines).replace("Perplexity of", "Perplexity of ") == path


@settings(max_examples=200, deadline=None)
@given(st.floats(-1e7, 1e7), st.floats(1e-9, 1e8))
def test_round_ticks_have_a_round_step_and_a_mantissa_from_1_to_10(lo, span):
    ticks = nice_ticks(lo, lo + span)  # a span below float precision is widened around the value
    assert 2 <= len(ticks) <= 9
    step = ticks[1] - ticks[0]
    # ticks are floats: a difference of two is exact to a few units in the last place of the
    # largest (32768.82814 - 32768.82813 is 1e-5 to within 7e-12, a mantissa off by 7e-7)
    slack = 4 * math.ulp(max(abs(ticks[0]), abs(ticks[-1])))
    power = 10 ** math.floor(math.log10(step))
    assert any(abs(step / power - m) < 1e-6 + slack / power for m in (1, 2, 2.5, 5, 10))
    assert all(abs((b - a) - step) <= 1e-6 * step + slack for a, b in zip(ticks, ticks[1:]))
    labels = [tick_text(t, step) for t in ticks]
    assert len(set(labels)) == len(labels), labels  # ticks a step apart read apart
    for text in labels + [tick_text(t) for t in ticks]:
        m = re.match(r"^−?([\d.]+)×10", text)
        assert m is None or 1 <= float(m.group(1)) < 10, text


def test_tick_labels_have_the_digits_their_step_needs():
    """An axis a hair wide at a large value (a span of 6e-5 at 32768) wrote every tick 32768.8."""
    ticks = nice_ticks(32768.828125, 32768.828125 + 6.103515625e-05)
    assert [tick_text(t, ticks[1] - ticks[0]) for t in ticks][:2] == ["32768.82813", "32768.82814"]
    assert tick_text(2.5e-6) == tick_text(2.5e-6, 5e-7) == "2.5×10⁻⁶" and tick_text(25000, 2500) == "25000"
    assert tick_text(200000.25, 0.25) == "2.0000025×10⁵"


def test_an_axis_plotly_would_write_as_0_2x10_4_gets_round_ticks_of_its_own():
    fig = go.Figure(go.Bar(x=["a", "b"], y=[2000, 10000]))
    Plot("bars", fig, pd.DataFrame())
    assert fig.layout.yaxis.ticktext == ("0", "2500", "5000", "7500", "10000")
    small = go.Figure(go.Scatter(x=[0, 1, 2], y=[4.2e-7, 1e-6, 2.6e-6]))
    Plot("small", small, pd.DataFrame())
    assert small.layout.yaxis.ticktext[:2] == ("5×10⁻⁷", "1×10⁻⁶")
    twin = make_subplots(specs=[[{"secondary_y": True}]])
    twin.add_trace(go.Scatter(x=[0, 1], y=[0.1, 0.4]))
    twin.add_trace(go.Scatter(x=[0, 1], y=[5.1759, 5.2109]), secondary_y=True)
    Plot("twin", twin, pd.DataFrame())
    assert twin.layout.yaxis2.tickmode == "auto"  # its own round ticks, not the left axis's grid


def test_many_lines_get_distinct_colours_and_a_legend_that_never_scrolls():
    for n in (3, 10, 11, 24, 60):
        assert len(set(colors(n))) == n
    log = pd.DataFrame(
        [{"step": s, "name": f"entropy_data:L0H{h}", "value": 0.5} for s in (0, 1) for h in range(24)]
        + [{"step": s, "name": "entropy_data", "value": 0.5} for s in (0, 1)]
    )
    fig = ft.head_entropy_plot(log).fig
    line_colours = [t.line.color for t in fig.data if t.name.startswith("L0H")]
    assert len(set(line_colours)) == 24
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.maxheight > 100  # pixels: room for its rows
    assert fig.layout.height > 420  # grown by the rows the legend takes


def test_a_label_is_not_put_on_an_arrow_or_a_box_edge():
    # a point on a horizontal line (an arrow) with a box edge just above it: the label goes below
    placed = place_labels([(0.0, 0.0, "L1H0 via L0H3")], (-1, 1), (-1, 1), lines=[(-1, 0, 1, 0), (-1, 0.08, 1, 0.08)])
    assert placed[0][3].startswith("bottom")
    joined = place_labels([(0.5, 0.5, "L1H2 via L0H3"), (0.5, 0.5, "L1H3 via L0H3")], (-1, 1), (-1, 1))
    assert joined[0][2] == "L1H2, L1H3 via L0H3"


def test_composition_at_half_width_names_the_writers_once_and_drops_values_that_do_not_fit(model):
    from attn_core import circuits
    from attn_core.figures import circuits as fc
    from attn_core.figures.layout import HALF_PX

    comp = circuits.composition(model.model, n_samples=8, seed=0)
    half = fc.composition_plot(comp, width=HALF_PX)
    assert all(t.texttemplate is None for t in half.fig.data)
    assert half.fig.layout.yaxis2.matches == "y" or half.fig.layout.yaxis2.showticklabels is False
    assert all(t.texttemplate for t in fc.composition_plot(comp).fig.data)  # a whole row: values written


def test_a_vocabulary_view_has_square_cells(model):
    vocab = bilinear.vocabulary_view(model, 0, [0])
    for width in (460, 700):
        fig = fb.view_plot(vocab, 0, None, width=width).fig
        m, n = fig.layout.margin, len(vocab.queries)
        cell_w, cell_h = (width - m.l - m.r) / n, (fig.layout.height - m.t - m.b) / n
        assert abs(cell_w / cell_h - 1) < 0.05 and fig.layout.yaxis.scaleanchor == "x"


def test_eigenvalues_and_singular_values_are_numbered_from_1(model):
    rows = bilinear.spectrum_rows(model.model)
    table = pd.DataFrame(
        [{"layer": r["layer"], "head": r["head"], "eigenvalues_sym": r["eigenvalues_sym"]} for r in rows]
    )
    eig = fb.eigen_sym_plot(table)
    sigma = fb.spectrum_plot(bilinear.spectrum_frame(model.model))
    assert min(eig.fig.data[0].x) == 1 and eig.data["index"].min() == 1
    assert min(sigma.fig.data[0].x) == 1 and sigma.data["index"].min() == 1


def test_an_animation_waits_for_its_play_button():
    fig = go.Figure(go.Scatter(x=[1], y=[1]), frames=[go.Frame(data=[go.Scatter(x=[2], y=[2])], name="1")])
    html = export_bytes(Plot("anim", fig, pd.DataFrame()), "html")
    assert b"Plotly.addFrames(" in html and b"Plotly.animate(" not in html


def test_tables_write_a_dash_for_missing_values_and_four_digits():
    frame = pd.DataFrame({"a": [1.0, None, 6e-14], "b": ["x", None, "y"], "c": [0.1234567, 2.0, 3.5], "n": [1, 2, 3]})
    shown, numeric = readable(frame)
    assert list(shown["a"]) == ["1", "—", "6e-14"] and list(shown["b"]) == ["x", "—", "y"]
    assert numeric == ["c"] and shown["c"].dtype == float and list(shown["n"]) == [1, 2, 3]
    assert [cell_text(v) for v in (123456.789, math.nan, None, 3, True)] == ["1.235e+5", "—", "—", "3", "True"]


def test_before_and_after_titles_take_as_many_lines(model):
    from attn_core.figures import text as ftext

    view = bilinear.sequence_view(model, bilinear.sample_tokens(model, 0), 1)
    pair = ftext.before_after_plots(
        view, view, 0, 3, "pattern", titles=("before (tiny-llama)", "after (run:20261127-004725-b1a881)")
    )
    lines = [p.fig.layout.title.text.count("<br>") for p in pair]
    assert lines[0] == lines[1] == 1 and pair[0].fig.layout.margin.t == pair[1].fig.layout.margin.t
    assert pair[0].fig.layout.title.text.startswith("before (tiny-llama): pattern A, layer 1 head 0")
