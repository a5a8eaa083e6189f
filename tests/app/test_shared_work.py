"""Work that every session would repeat is done once for all of them: two sessions (two AppTests
in one process, as two users of one server) on the same inputs share the Edit and compare page's
preview of an edit and its figures and the Heatmaps page's figures, and a query moved back draws the figures
already built (benchmarks/dashboard_load.py measures what this saves under load)."""

from pathlib import Path

import pytest
import streamlit as st
from dashboard_helpers import chart, open_page

from attn_core import surgery
from attn_core.figures import bilinear as fb
from attn_core.figures import surgery as fs

PAGES = Path(__file__).resolve().parents[2] / "app_pages"
EDIT = str(PAGES / "12_Edit_and_compare.py")
HEATMAPS = str(PAGES / "1_Heatmaps.py")


@pytest.fixture
def counted(monkeypatch):
    """``count(module, name)`` wraps ``module.name`` so that its calls are counted; the caches
    start empty, so that a result another test left there does not hide a call."""
    st.cache_data.clear()
    st.cache_resource.clear()
    calls: dict[str, int] = {}

    def count(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    count.calls = calls
    return count


def test_two_sessions_share_one_preview_of_an_edit(counted):
    counted(surgery, "edit_preview")
    counted(surgery, "head_modes")
    for name in ("pattern_pair_plot", "modes_plot", "diff_plot"):
        counted(fs, name)
    losses = []
    for _ in range(2):  # two users, the same edit
        at = open_page(EDIT, "induction-2l")
        at.slider(key="edit_rank_0_0").set_value(5)
        at.run()
        assert not at.exception and not at.error
        losses.append([m.value for m in at.metric if m.label == "Loss (nats)"])
    assert losses[0] == losses[1]
    # the first user: the page as it is, then the edit (the compare tab's matrix built once); the
    # second user: nothing built again
    assert counted.calls == {
        "edit_preview": 1,
        "head_modes": 1,
        "pattern_pair_plot": 2,
        "modes_plot": 2,
        "diff_plot": 1,
    }


def test_two_sessions_share_the_heatmaps_figures(counted):
    first = open_page(HEATMAPS, "induction-2l")
    counted(fb, "view_plot")
    counted(fb, "query_plot")
    second = open_page(HEATMAPS, "induction-2l")  # another user, the same model, input and query
    assert counted.calls == {}
    assert chart(second, "scores") == chart(first, "scores")


def test_a_query_moved_back_draws_the_figures_already_built(counted):
    at = open_page(HEATMAPS, "induction-2l")
    query = at.select_slider(key="query")
    last = query.value
    query.set_value(last - 1)
    at.run()
    counted(fb, "view_plot")
    counted(fb, "query_plot")
    at.select_slider(key="query").set_value(last)  # back where it was: every figure was built then
    at.run()
    assert not at.exception and not at.error
    assert counted.calls == {}
