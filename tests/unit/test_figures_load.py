"""The load benchmark's figure (attn_core.figures.load): one colour per measured curve, its
median and p95 against the number of users and the memory per session beside them, and bad
input refused with a sentence."""

import pytest

from attn_core.figures.load import load_curve_plot, load_frame


def _level(users, median, p95, mib=3.0, errors=0):
    return dict(users=users, median_s=median, p95_s=p95, moves=10 * users, errors=errors, rss_per_session_mib=mib)


CURVES = {
    "before": [_level(1, 0.4, 0.5), _level(5, 1.2, 2.4), _level(10, 4.5, 10.5, errors=1)],
    "after": [_level(5, 1.0, 2.0), _level(1, 0.3, 0.4), _level(10, 3.0, 7.0)],
}


def test_each_curve_has_its_median_p95_and_memory_by_users():
    plot = load_curve_plot(CURVES)
    names = [t.name for t in plot.fig.data]
    assert names == [
        "before: median",
        "before: p95",
        "before: MiB per session",
        "after: median",
        "after: p95",
        "after: MiB per session",
    ]
    after_median = plot.fig.data[3]
    assert list(after_median.x) == [1, 5, 10] and list(after_median.y) == [0.3, 1.0, 3.0]  # by users
    assert plot.fig.data[0].line.color != after_median.line.color  # one colour per curve
    assert plot.fig.data[1].line.dash == "dash" and plot.fig.data[0].line.dash is None
    assert list(plot.data.columns) == ["curve", "users", "median_s", "p95_s", "moves", "errors", "rss_per_session_mib"]
    assert plot.data["errors"].sum() == 1


def test_bad_input_is_one_sentence():
    with pytest.raises(ValueError, match="curves must map"):
        load_curve_plot([])
    with pytest.raises(KeyError, match="lacks p95_s"):
        load_frame({"x": [{"users": 1, "median_s": 1.0, "moves": 1, "errors": 0, "rss_per_session_mib": 1.0}]})
