"""The Heatmaps page's attention sinks (``attn_core.bilinear.sinks``, Gu et al. 2024): the
sink-aware mode (a head's sink keys on this input drawn apart, or left out with the rows
renormalized, and its concentration measured without them) and the section that shows every
head's importance of each key position on probes, the sink heads and the sink rate."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from attn_core.bilinear.sinks import EPS
from attn_core.figures import Plot
from attn_core.figures import sinks as fs
from attn_core.sources import LoadedModel
from ui.heatmap_input import Input
from ui.markup import plain
from ui.plots import show_plot
from ui.probes import pick_probes, sinks_on
from ui.state import remember, to_url

MODES = {"off": "off", "apart": "sinks apart", "renormalized": "without sinks"}
SECTION_HELP = (
    "Every head's importance of each key position (the mean attention it receives over the queries that see "
    "it) on probes: the model's task samples, a text, or this input; the sink heads and the sink rate"
)


@dataclass(frozen=True)
class SinkMode:
    """The sink-aware mode (a key of MODES) and eps, the importance above which a key is a sink."""

    mode: str
    eps: float

    @property
    def on(self) -> bool:
        return self.mode != "off"


def sink_mode() -> SinkMode:
    """The mode's widgets (inputs of at most ``LONG_INPUT`` tokens: a long input draws its sink
    column apart in the long view)."""
    m_col, e_col, _ = st.columns([3, 1, 2])
    mode = m_col.radio(
        "Sink-aware",
        list(MODES),
        format_func=MODES.get,
        horizontal=True,
        key=remember("sink_mode", "off", list(MODES), param="sinks"),
        help="A key most queries attend to whatever they are (a sink, often the first token) swamps a head's "
        "heatmap and makes it look concentrated: draw its column apart, on its own, or leave it out and "
        "renormalize each row; the concentration is then measured without it. The head's sinks on this input: "
        "keys seen by at least a quarter of the queries whose mean attention over them exceeds eps",
    )
    eps = e_col.number_input(
        "eps",
        min_value=0.05,
        max_value=0.95,
        step=0.05,
        key=remember("sink_eps", EPS),
        help="A key is a sink when the mean attention it receives over the queries that see it exceeds this "
        "(Gu et al. take 0.3)",
    )
    to_url(sinks=None if mode == "off" else mode)
    return SinkMode(mode, float(eps))


def grid_plot(view, head: int, query: int, value: str, sm: SinkMode) -> Plot:
    """One head of the every-head grid: its scores with the sinks apart, or its pattern in the mode."""
    return fs.sink_view_plot(view, head, sm.mode if value == "pattern" else "apart", sm.eps, value)


def head_pair(view, head: int, query: int, sm: SinkMode) -> list[Plot]:
    """The head's scores (sinks apart) and pattern (sinks apart, or left out and renormalized)."""
    plots = [fs.sink_view_plot(view, head, "apart", sm.eps, "scores"), fs.sink_view_plot(view, head, sm.mode, sm.eps)]
    for col, plot, key in zip(st.columns(2), plots, ("scores", "pattern")):
        with col:
            show_plot(plot, key=key)
    keys = view.sink_keys(sm.eps)[view.head_index(head)].nonzero().flatten().tolist()
    st.caption(
        f"Sink keys of this head on this input: {', '.join(view.keys[k] for k in keys)}."
        if keys
        else f"This head has no sink key on this input (no key's importance exceeds {sm.eps:g})."
    )
    return plots


def section(loaded: LoadedModel, inp: Input, sm: SinkMode) -> list[Plot]:
    """Every head's importance of each key position on probes, the sink heads and the rate."""
    st.header("Attention sinks of every head")
    st.markdown(
        "The importance of key $k$ is the mean attention it receives over the queries that can see it; a head "
        "sinks when some key that at least a quarter of the probe's queries see has importance above eps "
        "(Gu et al. 2024, arXiv 2410.10781, who look at the first token only: shown beside it)."
    )
    choice = pick_probes(loaded, "heatmap", with_input=True)
    if choice is None:
        return []
    try:
        with st.spinner("Every head's pattern on every probe…"):
            found = sinks_on(loaded, choice, sm.eps, inp.tokens)
    except ValueError as e:
        st.error(f"These probes do not work: {plain(e)}")
        return []
    rate, first, heads = st.columns(3)
    rate.metric("sink rate", f"{found.rate:.0%}", help="The share of heads with a sink key")
    first.metric("first token only", f"{found.rate_first:.0%}", help="Gu et al.'s rate: the first token's importance")
    heads.metric("sink heads", f"{int(found.is_sink.sum())} of {found.is_sink.numel()}")
    if found.learned is not None:
        st.metric(
            "mass on the learned sinks",
            f"{found.learned_mean:.0%}",
            help="Each row's mass on its head's learned sink logit (no key receives it), averaged over every head: "
            "the 'sink' column of the figure, left of token 0",
        )
    plot = fs.importance_plot(found)
    show_plot(plot, key="sinks")
    st.caption(f"Probes: {found.what}.")
    return [plot]
