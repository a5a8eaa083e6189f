"""The Heatmaps page on inputs over ``LONG_INPUT`` tokens (the one long view): the blocked scores
of one head (``bilinear.blocked``), never T x T. The forward runs once per (model, tokens, layer)
and its Q and K are kept (``layer_qk``); a head change recomputes only that head's blocks
(``head_stats``) and its map. The map (``bilinear.long_map``) is the whole T x T pooled to the
figure's size, or a zoomed region (the sliders, or a box drawn on the map) at full resolution
once it fits, with the sink column apart; the page's query slider picks the query whose row is
marked and whose top keys, row metrics, mode split and exact window (``bilinear.long``, on the
same Q and K and row normalisers) are shown. Figures are ``figures.long_view``'s and
``figures.bilinear``'s."""

from __future__ import annotations

import streamlit as st

from attn_core import bilinear
from attn_core.bilinear import blocked
from attn_core.bilinear.long import WINDOW, LayerScores, rows_table
from attn_core.bilinear.long_map import long_map
from attn_core.circuits.long_split import mode_split
from attn_core.figures import Plot
from attn_core.figures import attribution as fa
from attn_core.figures import bilinear as fb
from attn_core.figures import long_view as fl
from attn_core.sources import LoadedModel
from ui.cache import cached
from ui.heatmap_input import Input
from ui.heatmap_sections import concentration, query_metrics
from ui.plots import export_all, show_plot
from ui.state import ALL_HEADS, remember
from ui.widgets import number

PIXELS = {"coarse (400)": 400, "medium (800)": 800, "fine (1600)": 1600}


@cached(resource=True, max_entries=4)
def layer_qk(loaded: LoadedModel, tokens: list[int], layer: int) -> blocked.LayerQK:
    return blocked.layer_qk(loaded.model, tokens, layer)


@cached(resource=True, max_entries=4)
def _stats_store(loaded: LoadedModel, tokens: list[int], layer: int) -> dict:
    """Each head's row statistics on this input and layer, filled as heads are looked at (kept
    as long as the layer's Q and K are)."""
    return {}


def head_stats(loaded: LoadedModel, tokens: list[int], layer: int, head: int, k: int) -> blocked.RowStats:
    """The head's row statistics, computed once per (input, layer, head, k) with a progress bar."""
    store = _stats_store(loaded, tokens, layer)
    if (head, k) not in store:
        qk = layer_qk(loaded, tokens, layer)
        bar = st.progress(0.0, text=f"head {head}: its blocks of queries x keys")

        def report(done: int, total: int) -> None:
            bar.progress(done / max(total, 1), text=f"head {head}: {done}/{total} queries")

        store[(head, k)] = blocked.row_stats(qk, head, k=k, progress=report)
        bar.empty()
    return store[(head, k)]


@cached(resource=True, max_entries=16)
def _map(loaded, tokens, layer, head, k, rows, cols, pixels, pool, value):
    stats = _stats_store(loaded, tokens, layer)[(head, k)]
    return long_map(layer_qk(loaded, tokens, layer), stats, rows, cols, pixels, pool, value)


def head_map(loaded, tokens, layer, head, k, rows, cols, pixels, pool, value):
    """The map of a head whose statistics are computed (``head_stats``), cached by its settings."""
    head_stats(loaded, tokens, layer, head, k)
    return _map(loaded, tokens, layer, head, k, rows, cols, pixels, pool, value)


def _zoom_from_box(n: int) -> None:
    """A box drawn on the map (the last rerun's selection) becomes the zoom sliders' range."""
    event = st.session_state.get("chart_long_map")
    boxes = (event or {}).get("selection", {}).get("box") or []
    if not boxes:
        return
    box = boxes[-1]
    xs, ys = sorted(box.get("x", [0, n])), sorted(box.get("y", [0, n]))
    clip = lambda v: max(0, min(n - 1, int(round(v))))  # noqa: E731
    region = ((clip(ys[0]), clip(ys[1])), (clip(xs[0]), clip(xs[1])))
    if region != st.session_state.get("long_last_box"):
        st.session_state["long_last_box"] = region
        st.session_state["long_rows"], st.session_state["long_cols"] = region


def controls(n: int) -> tuple[str, str, int, tuple[int, int], tuple[int, int]]:
    """Value, pooling, resolution and the zoomed region (queries, keys as end-exclusive ranges)."""
    _zoom_from_box(n)
    c_value, c_pool, c_px, c_reset = st.columns([2, 2, 2, 1])
    value = c_value.radio("Show", ["pattern", "scores"], horizontal=True, key=remember("long_value", "pattern"))
    pool = c_pool.radio(
        "Tiles show their",
        list(blocked.POOLS),
        horizontal=True,
        key=remember("long_pool", "max"),
        help="max keeps a sharp head visible (one key per query shows 1.0); mean is the tile's average",
    )
    px = c_px.selectbox("Resolution", list(PIXELS), key=remember("long_px", "medium (800)", list(PIXELS)))
    whole = (0, n - 1)
    if c_reset.button("Whole input", help="Zoom out to all queries and keys"):
        st.session_state["long_rows"] = st.session_state["long_cols"] = whole
    for key in ("long_rows", "long_cols"):
        if key not in st.session_state or not all(0 <= v < n for v in st.session_state[key]):
            st.session_state[key] = whole
    c_rows, c_cols = st.columns(2)
    rows = c_rows.slider(
        "Queries", 0, n - 1, key="long_rows", help="Zoom: the region is recomputed, at full resolution once it fits"
    )
    cols = c_cols.slider("Keys", 0, n - 1, key="long_cols", help="Or draw a box on the map (box select)")
    return value, pool, PIXELS[px], (rows[0], rows[1] + 1), (cols[0], cols[1] + 1)


def section(loaded: LoadedModel, inp: Input, layer: int, head, top_k: int = blocked.TOP_K) -> list[Plot]:
    """Everything the page shows of one head (or, for all heads, a coarse map each) on a long input."""
    tokens, n = inp.tokens, len(inp.tokens)
    with st.spinner(f"The forward up to layer {layer}…", show_time=True):
        qk = layer_qk(loaded, tokens, layer)
    mib = (qk.q.numel() + qk.k.numel()) * qk.q.element_size() / 2**20
    st.info(
        f"{n} tokens (more than {blocked.LONG_INPUT}): blocked scores, never all {n}² cells. This layer's Q and K "
        f"({mib:.1f} MiB) are kept from one forward; a head change recomputes only that head's blocks."
    )
    value, pool, px, rows, cols = controls(n)
    plots: list[Plot] = []
    if head == ALL_HEADS:
        grid = st.columns(2)
        for h in range(loaded.config.n_heads):
            lm = head_map(loaded, tokens, layer, h, top_k, rows, cols, min(px, 400), pool, value)
            plots.append(fl.map_plot(lm, inp.query, width=460))
            with grid[h % 2]:
                show_plot(plots[-1], key=f"long_grid_{h}")
        return plots
    stats = head_stats(loaded, tokens, layer, head, top_k)
    lm = head_map(loaded, tokens, layer, head, top_k, rows, cols, px, pool, value)
    query = inp.query  # the page's query slider picks it (Streamlit reports no selected heatmap cell)
    plots.append(fl.map_plot(lm, query, selectable=True))
    show_plot(plots[-1], key="long_map", on_select="rerun", selection_mode="box")
    names = bilinear.token_names(loaded)
    labels = inp.labels
    st.header(f"Query {labels[query]}: its top {top_k} keys")
    scores = LayerScores(qk, labels, {head: stats.lse})  # the same Q, K and row normalisers
    bar_col, metric_col = st.columns([3, 1])
    with bar_col:
        plots.append(fl.query_top_plot(stats, layer, query, labels))
        show_plot(plots[-1], key="long_top")
    with metric_col:
        lv = scores.view(head, query, window=1, k=1, blocks=None)
        query_metrics(int(lv.row_mask.sum()), lv.concentration(inp.k), inp.k, "Keys this query can attend to")
    plots += exact_window(scores, head, query)
    keys = [k for k in stats.top_keys[query].tolist() if k >= 0]
    attr = mode_split(loaded.model, qk, head, query, keys, names)
    plots.append(fa.attribution_plot(attr, top=len(keys)))
    show_plot(plots[-1], key="long_split", help="Each top key's score split into σᵢ (x·uᵢ)(y·vᵢ) (or rotation planes)")
    st.header("Every query: entropy, sink mass, offsets")
    plots.append(fl.rows_plot(stats, layer, labels))
    show_plot(plots[-1], key="long_rows", help="CSV: every query's top keys (key, token, score, weight, entropy, sink)")
    plots.append(fl.offsets_plot(stats, layer))
    show_plot(plots[-1], key="long_offsets")
    if st.toggle(
        "Concentration of every head",
        key=remember("long_heads_table", False),
        help="Every head's blocked rows (computed once per head): entropy, normalized entropy, top-k mass, sink mass",
    ):
        every = [head_stats(loaded, tokens, layer, h, top_k) for h in range(loaded.config.n_heads)]
        plots.append(concentration(rows_table(every, layer, min(inp.k, top_k)), head, True))
    return plots


def exact_window(scores: LayerScores, head: int, query: int) -> list[Plot]:
    """The exact S and A of the positions that end at the query (a window of its full rows: A is
    normalised over every key a row sees and the sink), on a toggle, on by default."""
    if not st.toggle(
        "Exact window around the query",
        key=remember("long_window_on", True),
        help="Every cell of the w positions that end at the query: its scores and weights as the model computes them",
    ):
        return []
    w = number(st, "Window w", 8, 256, "window", WINDOW, step=8, help="Positions of the window (queries and keys)")
    lv = scores.view(head, query, window=int(w), blocks=None)
    plots = []
    for col, value in zip(st.columns(2), ("scores", "pattern")):
        with col:
            plots.append(fb.window_plot(lv, value))
            show_plot(plots[-1], key=f"window_{value}")
    return plots


def export(plots: list[Plot], loaded: LoadedModel, inp: Input, layer: int, head) -> None:
    st.divider()
    manifest = dict(page="Heatmaps", model=loaded.name, model_key=loaded.key, layer=layer, head=head)
    manifest.update(query=inp.query, input=inp.source, n_tokens=len(inp.tokens), long_input=True, blocked=True)
    export_all(plots, manifest, key="heatmaps")
