"""Figures of sinks and of the two ranks (attn_core.figures.sinks, attn_core.figures.ranks): what
each draws matches the library's numbers, the sink-aware heatmap's two modes, the CSV tables."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from attn_core import metrics
from attn_core.bilinear import sequence_view
from attn_core.figures import export_bytes
from attn_core.figures import ranks as fr
from attn_core.figures import sinks as fs
from attn_core.sources import resolve
from attn_core.text.probes import measure_ranks, measure_sinks, probes


@pytest.fixture(scope="module")
def model():
    return resolve("sort-2l-mlp")  # three heads of layer 0 sink on token 0 (measured)


@pytest.fixture(scope="module")
def view(model):
    return sequence_view(model, probes(model, n=1).tokens[0].tolist(), 0)


def test_importance_plot_marks_the_sink_heads(model):
    s = measure_sinks(model, n=8)
    plot = fs.importance_plot(s)
    heat, marks = plot.fig.data[0], plot.fig.data[1]
    assert torch.allclose(torch.as_tensor(heat.z, dtype=torch.float64), s.importance.reshape(-1, s.length))
    sinks = s.sinks.reshape(-1, s.length)
    assert sorted(zip(marks.y.tolist(), marks.x.tolist())) == sorted(map(tuple, torch.nonzero(sinks).tolist()))
    ticks = list(plot.fig.layout.yaxis.ticktext)
    assert [t.endswith("◆") for t in ticks] == s.is_sink.reshape(-1).tolist()
    assert f"sink rate {s.rate:.0%}" in plot.fig.layout.title.text
    data = plot.data
    assert len(data) == s.importance.numel() and data["sink"].sum() == int(s.sinks.sum())
    assert plot.meta["rate"] == s.rate


def test_sink_view_apart_and_renormalized(view):
    sinks = view.sink_keys()[1]
    where = torch.nonzero(sinks).flatten().tolist()
    assert where  # this head has a sink on this input
    apart = fs.sink_view_plot(view, 1, "apart")
    left, right = apart.fig.data
    assert list(left.x) == [view.keys[k] for k in where] and len(right.x) == len(view.keys) - len(where)
    assert left.zmax == 1 and left.texttemplate  # the sinks' own numbers, written
    finite = view.pattern[1][:, ~sinks][view.mask[:, ~sinks]]
    assert right.zmax == pytest.approx(float(finite.max()))  # the rest on its own range
    ren = fs.sink_view_plot(view, 1, "renormalized")
    (heat,) = ren.fig.data
    p, m = metrics.drop_keys(view.pattern[1], view.mask, sinks)
    z = torch.as_tensor(heat.z, dtype=torch.float64)
    expect = p.masked_fill(~m, math.nan)[:, ~sinks].double()
    assert torch.allclose(z.nan_to_num(-1), expect.nan_to_num(-1), atol=1e-6)
    rows = z.nan_to_num(0).sum(-1)
    assert torch.allclose(rows[m.any(-1)], torch.ones(int(m.any(-1).sum()), dtype=torch.float64), atol=1e-5)
    data = ren.data
    assert data["sink_key"].sum() == len(where) * len(view.queries) and "prob_without_sinks" in data
    assert export_bytes(ren, "csv").startswith(b"layer,head,query,key")
    with pytest.raises(ValueError, match="mode"):
        fs.sink_view_plot(view, 1, "hidden")
    with pytest.raises(ValueError, match="only the pattern"):
        fs.sink_view_plot(view, 1, "renormalized", value="scores")


def test_a_head_without_a_sink_is_drawn_whole(view):
    plain = [h for h in view.heads if not view.sink_keys(0.9)[h].any()]
    plot = fs.sink_view_plot(view, plain[0], "apart", eps=0.9)
    assert len(plot.fig.data) == 1 and "no sink key" in plot.fig.layout.title.text


def test_ranks_plots(model):
    r = measure_ranks(model, n=8)
    plot = fr.ranks_plot(r)
    bars = {(t.name, t.yaxis): list(t.y) for t in plot.fig.data if t.type == "bar"}
    assert bars[("B", "y")] == r.weight_rank.flatten().tolist()
    assert bars[("scores S_c", "y")] == pytest.approx(r.data_rank.flatten().tolist())
    assert bars[("scores S_c", "y2")] == pytest.approx(r.data_stable_rank.flatten().tolist())
    curves = fr.variance_plot(r, 1, 2)
    ys = {t.name: list(t.y) for t in curves.fig.data}
    assert ys["B"][-1] == pytest.approx(1.0) and len(ys["scores S_c"]) == 12
    with pytest.raises(ValueError, match="no head"):
        fr.variance_plot(r, 5, 0)
    frame = pd.DataFrame([dict(model="sort", **h) for h in r.heads()])
    gap = fr.gap_plot(frame)
    assert list(gap.fig.data[1].x) == pytest.approx(frame["data_rank"].tolist())


def test_sink_rate_plot_has_a_panel_per_model():
    frame = pd.DataFrame(
        dict(model=["a"] * 4 + ["b"] * 4, setting=["x", "x", "y", "y"] * 2, step=[0, 9] * 4, sink_rate=[0, 0.5] * 4)
    )
    plot = fs.sink_rate_plot(frame)
    assert len(plot.fig.data) == 4 and [t.showlegend for t in plot.fig.data] == [True, True, False, False]
    colours = [t.line.color for t in plot.fig.data]
    assert (
        colours[0] == colours[2] and colours[1] == colours[3] and colours[0] != colours[1]
    )  # a setting's colour in every panel
    assert list(plot.fig.layout.yaxis.range) == [0, 1]
