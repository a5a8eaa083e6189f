"""Heatmaps of the bilinear form f_x(y) = x B yᵀ of one head (or all heads of a layer): on a real
input, over the vocabulary and over positions, with one query's row and its concentration. The
input and the query are ``ui.heatmap_input``; the sections below the scores are
``ui.heatmap_sections``."""

import streamlit as st

import ui
from ui import heatmap_form, heatmap_long
from ui import heatmap_later as later
from ui import heatmap_sections as sections
from ui import heatmap_sinks as sinks
from ui.heatmap_input import pick_input

ALL = ui.ALL_HEADS

loaded = ui.setup("Heatmaps of f_x(y)")
cfg = loaded.config
st.markdown(
    "For a query token $x$ (a row) and a key token $y$ (a column), head $h$ of layer $l$ scores "
    "$f_x(y) = x B y^\\top = S_{xy}$ and attends with $A = \\mathrm{softmax}_{row}(S + \\text{causal mask})$. "
    "Pick a head, an input and a query position; the red outline marks the query's row."
)

# --- the input and the query (the head-dependent views below rerun alone on a head change) ---------
inp = pick_input(loaded)
tokens, labels, query, k = inp.tokens, inp.labels, inp.query, inp.k


@st.fragment
def head_views() -> None:
    """Everything that depends on the layer and head: a head change reruns only this, so the page
    above (model, input, query) is neither recomputed nor redrawn."""
    c_layer, c_head, _ = st.columns([1, 1, 6])
    layer, head = ui.layer_head_picker(cfg, (c_layer, c_head), all_heads=True)
    ui.to_url(layer=layer, head=head)
    if inp.long:  # over LONG_INPUT tokens: the one long view (blocked rows, the learned sink kept)
        plots = heatmap_long.section(loaded, inp, layer, head)
        plots += sections.vocabulary_and_positions(loaded, inp, layer, head if head != ALL else 0, head == ALL)
        heatmap_long.export(plots, loaded, inp, layer, head)
        return
    sm = sinks.sink_mode()
    plots = []
    view = sections.sequence_view(loaded, tokens, layer)

    # --- the sequence view: every cell ----------------------------------------------------------------------
    st.header("Scores S and pattern A")
    if head == ALL:
        value = ui.value_choice("Show", "grid_value", "scores")
        cols = st.columns(2)
        for h in range(cfg.n_heads):
            if sm.on:
                plot = sinks.grid_plot(view, h, query, value, sm)
            else:
                plot = sections.head_plot(loaded, tokens, layer, h, query, value)
            with cols[h % 2]:
                ui.show_plot(plot, key=f"grid_{h}")
            plots.append(plot)
    elif sm.on:  # the sink columns apart, or left out and the rows renormalized
        plots += sinks.head_pair(view, head, query, sm)
    else:
        for col, value in zip(st.columns(2), ("scores", "pattern")):
            with col:
                plots.append(sections.head_plot(loaded, tokens, layer, head, query, value))
                ui.show_plot(plots[-1], key=value)
    if head != ALL:  # QK-norm's per-token gains, the scores before / after a soft cap
        plots += heatmap_form.section(loaded, tokens, layer, head)
    if later.waiting():  # a session's first visit: the rest once the browser has drawn the heatmaps above
        return

    # --- the query's row (one head) ----------------------------------------------------------------------
    if head != ALL:
        st.header(f"Query {view.queries[query]}: f_x(y) over its keys")
        bar_col, metric_col = st.columns([3, 1])
        with bar_col:
            plots.append(sections.query_row_plot(loaded, tokens, layer, head, query))
            ui.show_plot(plots[-1], key="query_row")
        with metric_col:
            i = view.head_index(head)
            sections.query_metrics(
                int(view.mask[query].sum()),
                {name: v[i, query] for name, v in view.concentration(k, sm.on, sm.eps).items()},
                k,
                "Keys this query can attend to (causal: positions 0..i)"
                + ("; the metrics below leave out the head's sink keys, renormalized" if sm.on else ""),
            )

    # --- before and after retraining: the parent's same head on the same input ---------------------------
    parent = loaded.card.parent
    if (
        parent
        and head != ALL
        and st.toggle(
            "Before and after retraining",
            key=ui.remember("before_after", False),
            help=f"The same head of the model this one was retrained from ({ui.plain(parent, 80)}), on the same "
            "tokens, beside this one, on one colour scale",
        )
    ):
        plots += sections.before_after(loaded, inp, view, layer, head)

    # --- why this key: the score split over the singular directions of B ---------------------------------
    if head != ALL and st.toggle(
        "Why this key",
        key=ui.remember("why_key", False),
        help="Split the query's scores into the rank-1 terms σᵢ (x·uᵢ)(y·vᵢ) of B, see which directions "
        "make the top key beat the runner-up, and what each key actually sends (value-weighted)",
    ):
        plots += sections.why_this_key(loaded, inp, layer, head)

    # --- concentration, then the vocabulary and positional views ---------------------------------------------
    plots.append(sections.concentration(view.concentration_table(k, sm.on, sm.eps), head, head == ALL))
    if st.toggle("Attention sinks of every head", key=ui.remember("sinks_section", False), help=sinks.SECTION_HELP):
        plots += sinks.section(loaded, inp, sm)
    plots += sections.vocabulary_and_positions(loaded, inp, layer, head if head != ALL else 0, head == ALL)

    # --- export ---------------------------------------------------------------------------------------------
    st.divider()
    ui.export_all(
        plots,
        {
            "page": "Heatmaps",
            "model": loaded.name,
            "model_key": loaded.key,
            "layer": layer,
            "head": head,
            "query": query,
            "query_label": labels[query],
            "input": inp.source,
            "tokens": tokens,
            "token_labels": labels,
            "k": k,
            "why_this_key": bool(st.session_state.get("why_key")) and head != ALL,
            "sinks": {"mode": sm.mode, "eps": sm.eps},
        },
        key="heatmaps",
    )


head_views()
