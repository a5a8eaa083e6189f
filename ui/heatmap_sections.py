"""The Heatmaps page's sections below the scores and pattern of one head: a query's metrics,
before and after retraining, "why this key", the concentration table and
the vocabulary and positional views. Each draws its part and returns the figures it drew (for
the page's zip)."""

from __future__ import annotations

import streamlit as st

from attn_core import bilinear, circuits, metrics
from attn_core.bilinear import offsets
from attn_core.figures import Plot
from attn_core.figures import attribution as fa
from attn_core.figures import bilinear as fb
from attn_core.figures import rotary as fr
from attn_core.figures import text as ftext
from attn_core.sources import LoadedModel
from ui.cache import cached
from ui.heatmap_input import Input
from ui.markup import plain
from ui.models import load_model
from ui.pickers import value_choice
from ui.plots import show_plot, show_table
from ui.state import remember

METRIC_HELP = {
    "entropy": (
        "H(A_i) = −Σ_j A_ij log A_ij, in nats: 0 when the query looks at one key, log n_i when it "
        "spreads evenly over its n_i visible keys"
    ),
    "normalized_entropy": "H(A_i) / log n_i, from 0 (one key) to 1 (uniform); unitless",
    "hoyer": "Hoyer sparsity (√n − ‖A_i‖₁/‖A_i‖₂)/(√n − 1): 0 for a uniform row, 1 for a one-hot row",
    "topk_mass": "Attention mass on the k largest weights: k/n (uniform) .. 1 (all on k keys)",
    "participation_ratio": "1 / Σ_j A_ij²: the effective number of keys the query looks at (1 .. n_i)",
    "gini": "Gini coefficient of the row: 0 for uniform, 1 − 1/n for one-hot",
}

sequence_view = cached(bilinear.sequence_view)
vocabulary_view = cached(bilinear.vocabulary_view)
positional_view = cached(bilinear.positional_view)
attribution = cached(circuits.attribute)
token_position_split = cached(circuits.token_position_split)


# Figures are shared by every session too (building a plotly figure is most of a rerun's work): a
# rerun or another user on the same inputs draws the figure already built (nothing mutates a Plot;
# Streamlit serialises a copy). Few entries: a heatmap holds up to LONG_INPUT^2 cells.
@cached(resource=True, max_entries=32)
def head_plot(loaded: LoadedModel, tokens: list[int], layer: int, head: int, query: int, value: str) -> Plot:
    """The sequence view's heatmap of one head (scores or pattern), the query's row outlined."""
    return fb.view_plot(sequence_view(loaded, tokens, layer), head, query, value=value)


@cached(resource=True, max_entries=32)
def query_row_plot(loaded: LoadedModel, tokens: list[int], layer: int, head: int, query: int) -> Plot:
    """f_x(y) of one query over its keys."""
    return fb.query_plot(sequence_view(loaded, tokens, layer), head, query)


@cached(resource=True, max_entries=16)
def vocabulary_plot(loaded: LoadedModel, layer: int, head: int, offset: int, token: int) -> Plot:
    """The vocabulary view of one head, the query's token marked (when the view holds it)."""
    vocab = vocabulary_view(loaded, layer, [head], offset=offset)
    return fb.view_plot(vocab, head, token if token < len(vocab.queries) else None)


@cached(resource=True, max_entries=16)
def positional_plot(loaded: LoadedModel, layer: int, head: int, query: int) -> Plot:
    """The positional view of one head, the query's position marked (when the view holds it)."""
    positions = positional_view(loaded, layer, [head])
    return fb.view_plot(positions, head, query if query < len(positions.queries) else None)


@cached
def pair_curve(loaded: LoadedModel, layer: int, head: int, query_token: int, key_token: int, span: int):
    return offsets.token_pair_scores(loaded.model, layer, head, query_token, key_token, list(range(0, -span, -1)))


@cached
def value_weighted(loaded: LoadedModel, tokens: list[int], layer: int, head: int) -> dict:
    return circuits.value_weighted(loaded.model, tokens, layer, [head])


def query_metrics(n_keys: int, values: dict, k: int, keys_help: str) -> None:
    """The query's visible keys and its concentration metrics, one st.metric each."""
    st.metric("visible keys n_i", n_keys, help=keys_help)
    for name, v in values.items():
        label = name.replace("_", " ") + (f" (k={k})" if name == "topk_mass" else "")
        st.metric(label, f"{float(v):.3f}", help=METRIC_HELP[name])


def before_after(loaded: LoadedModel, inp: Input, view, layer: int, head: int) -> list[Plot]:
    """The parent's same head on the same input beside this one, on one colour scale."""
    st.header("Before and after retraining")
    parent = loaded.card.parent
    cfg = loaded.config
    try:
        before = load_model(parent)
        same = (before.config.n_layers, before.config.n_heads, before.config.d_vocab)
        if same != (cfg.n_layers, cfg.n_heads, cfg.d_vocab):
            raise ValueError(f"it has a different shape (layers, heads, tokens {same})")
    except (ValueError, OSError) as e:
        st.info(f"The parent {plain(parent, 120)} cannot be shown: {plain(e)}")
        return []
    value = value_choice("Show", "before_after_value", "pattern")
    before_view = sequence_view(before, inp.tokens, layer)
    pair = ftext.before_after_plots(
        before_view, view, head, inp.query, value, titles=(f"before ({before.name})", f"after ({loaded.name})")
    )
    tables = (before_view.concentration_table(inp.k), view.concentration_table(inp.k))
    for col, plot, table in zip(st.columns(2), pair, tables):
        with col:
            show_plot(plot, key=plot.name.split("_")[0])
            row = table[table["head"] == head].set_index("metric")["mean"]
            st.caption(
                f"Mean over this input's query rows: normalized entropy {row['normalized_entropy']:.3f}, "
                f"top-{inp.k} mass {row['topk_mass']:.3f}"
            )
    return list(pair)


def why_this_key(loaded: LoadedModel, inp: Input, layer: int, head: int) -> list[Plot]:
    """The query's scores split over the singular directions of B, the runner-up, the
    token/position split at layer 0, and the value-weighted attention."""
    st.header(f"Why this key: query {inp.labels[inp.query]}")
    st.markdown(
        "With $B = \\sum_i \\sigma_i u_i v_i^\\top$, $f_x(y) = \\sum_i \\sigma_i (x\\cdot u_i)(y\\cdot v_i)$ "
        "+ bias: each bar is one singular direction's contribution to a key's score (same units as S)."
    )
    attr = attribution(loaded, inp.tokens, layer, head, inp.query)
    plots = [fa.attribution_plot(attr, top=min(8, len(attr.keys)))]
    why_left, why_right = st.columns(2)
    with why_left:
        show_plot(plots[0], key="why_attribution")
    with why_right:
        if len(attr.keys) > 1:
            plots.append(fa.runner_up_plot(attr))
            show_plot(plots[-1], key="why_runner_up")
        else:
            st.info("The first query sees one key only: there is no runner-up.")
    if layer == 0 and loaded.config.positional == "learned":
        st.markdown(
            "At layer 0, with each token's LayerNorm scale frozen, $x = tok + pos + b$ exactly, so each "
            "score splits into token-token, token-position, position-token and position-position parts "
            "(query side first)."
        )
        plots.append(fa.token_position_plot(token_position_split(loaded, inp.tokens, head, inp.query)))
        show_plot(plots[-1], key="why_token_position")
    st.markdown(
        "Value-weighted attention $A_{ij}\\,\\|v_j W_O\\|$ beside the pattern: what query $i$ actually "
        "receives from key $j$ (residual-stream norm), not only where it looks."
    )
    vw = value_weighted(loaded, inp.tokens, layer, head)
    plots.append(fa.value_weighted_plot(vw, inp.labels, layer, [head], head))
    show_plot(plots[-1], key="why_value_weighted")
    return plots


def concentration(table, head, all_heads: bool) -> Plot:
    """The concentration table of the head (or every head) and its figure (for the zip)."""
    st.header("Concentration of every head" if all_heads else "Concentration of the head")
    shown = table if all_heads else table[table["head"] == head]
    without = "sink_keys" in shown  # measured without each head's sink keys (the sink-aware mode)
    st.caption(
        f"Mean, min and max over the query rows that see at least {metrics.MIN_KEYS} keys, on this input"
        + (", each head's sink keys (sink_keys) left out and the rows renormalized." if without else ".")
    )
    show_table(
        shown[["head", "metric", "mean", "min", "max", *(["sink_keys"] if without else [])]],
        hide_index=True,
        column_config={
            "head": st.column_config.NumberColumn(help="Head index h"),
            "metric": st.column_config.TextColumn(help="See the tooltips of the per-query metrics above"),
            "mean": st.column_config.NumberColumn(help="Mean over query rows", format="%.4f"),
            "min": st.column_config.NumberColumn(help="Smallest value over query rows", format="%.4f"),
            "max": st.column_config.NumberColumn(help="Largest value over query rows", format="%.4f"),
        },
    )
    return fb.concentration_plot(shown)


def vocabulary_and_positions(loaded: LoadedModel, inp: Input, layer: int, focus: int, all_heads: bool) -> list[Plot]:
    """The same form over every token (at an offset, with rotary positions) and over every
    position (learned positions) or, with rotary positions, one token pair against the offset."""
    cfg = loaded.config
    st.header("Vocabulary view and positional view")
    st.markdown(
        (
            "The same form with $x, y$ ranging over **every token** (its embedding through this layer's "
            "norm) at the offset picked below, and, on the right, the score of this query's token and one "
            "key's token against their offset: with rotary positions, position enters only through δ. "
            if cfg.positional == "rotary"
            else "The same form with $x, y$ ranging over **every token** (its embedding plus the mean position, "
            "through this layer's LayerNorm) and over **every position** (its embedding plus the mean token). "
        )
        + ("Shown for head 0; pick a head above to see another." if all_heads else "")
    )
    offset = 0
    if cfg.positional == "rotary":
        reach = min(cfg.n_ctx - 1, 4096)
        offset = st.slider(
            "Offset δ = key position − query position (rotary)",
            min_value=-reach,
            max_value=0,
            key=remember("vocab_offset", 0, range(-reach, 1), param="offset"),
            help="With rotary positions the form is B(δ) = W_Q R(δ) W_Kᵀ/√d: the vocabulary view shows "
            "every token pair meeting δ positions apart (0: the un-rotated form)",
        )
    query, plots = inp.query, []
    vocab_col, pos_col = st.columns(2)
    with vocab_col:
        plots.append(vocabulary_plot(loaded, layer, focus, int(offset), inp.tokens[query]))
        show_plot(plots[-1], key="vocab")
    with pos_col:
        if cfg.positional == "learned":
            plots.append(positional_plot(loaded, layer, focus, query))
            show_plot(plots[-1], key="positional")
        elif cfg.positional == "rotary":  # no position embeddings: a token pair's score against the offset
            key_pos = st.selectbox(
                "Key (its token meets the query's at every offset)",
                list(range(query + 1)),
                index=max(0, query - 1),
                format_func=lambda p: inp.labels[p],
                key=f"pair_key_{query}",
                help="The query's token is fixed; its score with this key's token is plotted against "
                "the offset between them (a dashed line marks the offset in this input)",
            )
            curve = pair_curve(loaded, layer, focus, inp.tokens[query], inp.tokens[key_pos], min(cfg.n_ctx, 512))
            labels = inp.labels[query], inp.labels[key_pos]
            plots.append(fr.pair_offset_plot(curve, layer, focus, *labels, actual=key_pos - query))
            show_plot(plots[-1], key="positional")
        else:
            st.info("This model has no position embeddings, so it has no positional view.")
    return plots
