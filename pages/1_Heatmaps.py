"""Heatmaps of the bilinear form f_x(y) = x^T B y of one head (or all heads of a layer): on a real
input, over the vocabulary and over positions, with one query's row and its concentration."""

import streamlit as st

import ui
from attn_core import bilinear, circuits, metrics
from attn_core.bilinear import offsets, position_labels
from attn_core.figures import attribution as fa
from attn_core.figures import bilinear as fb
from attn_core.figures import rotary as fr
from attn_core.figures import text as ftext
from attn_core.sources import LoadedModel
from attn_core.text import source as text_source

SOURCES = {"sample": "task sample", "random": "random tokens", "typed": "typed tokens"}
DEFAULT_LENGTH = 1024  # random tokens by default: the context, at most this many (and what the limits allow)
ALL = ui.ALL_HEADS
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

sequence_view = ui.cached(bilinear.sequence_view)
# S of every head of one layer (long inputs): shared, not copied, and few (n^2 floats per head each)
layer_scores = ui.cached(bilinear.layer_scores, resource=True, max_entries=4)
vocabulary_view = ui.cached(bilinear.vocabulary_view)
positional_view = ui.cached(bilinear.positional_view)
attribution = ui.cached(circuits.attribute)
token_position_split = ui.cached(circuits.token_position_split)


@ui.cached
def pair_curve(loaded: LoadedModel, layer: int, head: int, query_token: int, key_token: int, span: int):
    return offsets.token_pair_scores(loaded.model, layer, head, query_token, key_token, list(range(0, -span, -1)))


@ui.cached
def value_weighted(loaded: LoadedModel, tokens: list[int], layer: int, head: int) -> dict:
    return circuits.value_weighted(loaded.model, tokens, layer, [head])


@ui.cached
def long_concentration(loaded: LoadedModel, tokens: list[int], layer: int, k: int):
    return layer_scores(loaded, tokens, layer).concentration_table(k)


def window_of(vw: dict, lo: int, hi: int) -> dict:
    """The value-weighted attention of the exact window only (long inputs)."""
    return {name: t[..., lo : hi + 1, lo : hi + 1] if t.dim() == 3 else t[..., lo : hi + 1] for name, t in vw.items()}


loaded = ui.setup("Heatmaps of f_x(y)")
cfg = loaded.config
st.markdown(
    "For a query token $x$ (a row) and a key token $y$ (a column), head $h$ of layer $l$ scores "
    "$f_x(y) = x^\\top B\\,y = S_{xy}$ and attends with $A = \\mathrm{softmax}_{row}(S + \\text{causal mask})$. "
    "Pick a head, an input and a query position; the red outline marks the query's row."
)

# --- the input and the query (the head-dependent views below rerun alone on a head change) ---------
c_source, c_input = st.columns([3, 5])
sources = [s for s in SOURCES if s != "sample" or text_source.has_sample(loaded)]  # a run on text: held-out text
source = c_source.radio(
    "Input",
    sources,
    format_func=SOURCES.get,
    horizontal=True,
    key=ui.remember("input", sources[0], sources, param="input"),
    help="A held-out sample of the model's task, uniform random tokens, or your own tokens",
)
with c_input:
    try:
        if source == "typed" and bilinear.tokenizer(loaded) is not None:
            text = st.text_input(
                "Text",
                key=ui.remember("typed_text", "The cat sat on the mat. The cat sat"),
                help=f"Any text, split into tokens by the model's tokenizer.json (at most {cfg.n_ctx} tokens)",
            )
            tokens = bilinear.encode(loaded, text)
        elif source == "typed":
            names = bilinear.token_names(loaded)
            text = st.text_input(
                "Tokens (space-separated)",
                key=ui.remember("typed", " ".join(names[: min(8, len(names))])),
                help=f"Token names of the vocabulary (or ids), at most {cfg.n_ctx} tokens",
            )
            tokens = bilinear.encode(loaded, text)
        else:
            s_col, l_col = st.columns(2)
            seed = s_col.number_input(
                "Seed",
                min_value=0,
                max_value=2**31 - 1,
                step=1,
                key=ui.remember("input_seed", 0, range(2**31), param="seed"),
                help="Seed of the sample / the random tokens: the same seed gives the same input",
            )
            if source == "sample":
                tokens = text_source.sample_tokens(loaded, int(seed))
            else:
                longest = max(2, bilinear.longest_input(loaded.model))  # the context, cut to the memory limit
                lengths = range(2, longest + 1)
                length = l_col.number_input(
                    "Length",
                    min_value=2,
                    max_value=longest,
                    step=1,
                    key=ui.remember("random_length", min(longest, DEFAULT_LENGTH), lengths, param="length"),
                    help=f"Number of tokens, 2..{longest}"
                    + (
                        f" (the context is {cfg.n_ctx}; the memory limit allows {longest})"
                        if longest < cfg.n_ctx
                        else ""
                    ),
                )
                tokens = bilinear.random_tokens(loaded, int(seed), int(length))
        bilinear.check_tokens(loaded.model, tokens)  # a view of this input fits the limits, or one line here
    except ValueError as e:
        st.error(f"This input does not work: {ui.plain(e)}")
        st.stop()

# Long inputs: the scores stay on the server; the browser gets a window, the top keys and an overview.
long_input = len(tokens) > bilinear.LONG_INPUT
labels = position_labels(loaded, tokens)
queries = range(len(labels))
# New typed text, another length or another model moves the query to the last token (where the next
# token is predicted); another seed of the same length keeps it (the same position, compared across samples).
ui.follow_input("query", (loaded.key, source, tokens if source == "typed" else len(tokens)), queries[-1])
c_query, c_k = st.columns([5, 1])
query = c_query.select_slider(
    "Query position i",
    options=list(queries),
    key=ui.remember("query", queries[-1], queries, param="query"),
    format_func=lambda q: labels[q],
    help="x = X[i], the attention input at position i (position:token); its row of S and A is outlined",
)
k = c_k.number_input(
    "k (top-k)",
    min_value=1,
    max_value=len(labels),
    step=1,
    key=ui.remember("topk", 1, range(1, len(labels) + 1)),
    help="k of the top-k mass metric",
)
ui.to_url(
    input=source,
    query=query,
    seed=int(seed) if source != "typed" else None,
    length=len(tokens) if source == "random" else None,
)


# --- long inputs: an exact window, the top keys, a pooled overview ----------------------------------
def long_controls() -> tuple[int, int, str]:
    w_col, t_col, p_col = st.columns([1, 1, 2])
    window = w_col.number_input(
        "Window w",
        min_value=8,
        max_value=256,
        step=8,
        key=ui.remember("window", bilinear.long.WINDOW, range(8, 257)),
        help="Exact scores of the w positions that end at the query (queries and keys)",
    )
    top = t_col.number_input(
        "Top keys",
        min_value=1,
        max_value=64,
        step=1,
        key=ui.remember("top_keys", bilinear.long.TOP_K, range(1, 65)),
        help="The keys the query attends to most, anywhere in the input",
    )
    pool = p_col.radio(
        "Overview pooling",
        bilinear.long.POOLS,
        horizontal=True,
        key=ui.remember("pool", "max", bilinear.long.POOLS),
        help="max keeps a head that looks at one key visible; mean is the block's average",
    )
    return int(window), int(top), pool


@st.fragment
def head_views() -> None:
    """Everything that depends on the layer and head: a head change reruns only this, so the page
    above (model, input, query) is neither recomputed nor redrawn."""
    c_layer, c_head, _ = st.columns([1, 1, 6])
    layer, head = ui.layer_head_picker(cfg, (c_layer, c_head), all_heads=True)
    ui.to_url(layer=layer, head=head)
    if long_input:
        scores = layer_scores(loaded, tokens, layer)
    else:
        view = sequence_view(loaded, tokens, layer)
    plots = []
    if long_input:
        window, top, pool = long_controls()
        lv = scores.view(head if head != ALL else 0, query, window=window, k=top, pool=pool)
        st.info(
            f"{len(tokens)} tokens (more than {bilinear.LONG_INPUT}): the scores are computed on the server, and "
            f"the page shows the exact scores of a {lv.hi - lv.lo + 1}-position window around the query, the "
            f"query's top {len(lv.top)} keys and a {pool}-pooled overview ({lv.n_blocks}×{lv.n_blocks} blocks of "
            f"{lv.block}×{lv.block} positions), never all {len(tokens)}² cells."
        )

    # --- the sequence view: every cell, or (long inputs) a window, the top keys and an overview ---------
    st.header("Scores S and pattern A")
    if head == ALL:
        value = ui.value_choice("Show", "grid_value", "scores")
        cols = st.columns(2)
        for h in range(cfg.n_heads):
            if long_input:  # one overview per head, coarser
                plot = fb.overview_plot(scores.view(h, query, window=window, k=top, blocks=128, pool=pool), value)
            else:
                plot = fb.view_plot(view, h, query, value=value)
            with cols[h % 2]:
                ui.show_plot(plot, key=f"grid_{h}")
            plots.append(plot)
    elif long_input:
        left, right = st.columns(2)
        for col, value in ((left, "scores"), (right, "pattern")):
            with col:
                plots.append(fb.window_plot(lv, value))
                ui.show_plot(plots[-1], key=f"window_{value}")
        st.header(f"Query {labels[query]}: its top keys")
        bar_col, metric_col = st.columns([3, 1])
        with bar_col:
            plots.append(fb.top_keys_plot(lv))
            ui.show_plot(plots[-1], key="top_keys")
        with metric_col:
            st.metric("visible keys n_i", int(lv.row_mask.sum()), help="Keys this query can attend to")
            for name, v in lv.concentration(int(k)).items():
                label = name.replace("_", " ") + (f" (k={k})" if name == "topk_mass" else "")
                st.metric(label, f"{v:.3f}", help=METRIC_HELP[name])
        st.header("The whole head, pooled")
        overview_value = ui.value_choice("Overview of", "overview_value", "pattern")
        plots.append(fb.overview_plot(lv, overview_value))
        ui.show_plot(plots[-1], key="overview")
    else:
        left, right = st.columns(2)
        with left:
            scores_plot = fb.view_plot(view, head, query, value="scores")
            ui.show_plot(scores_plot, key="scores")
        with right:
            pattern_plot = fb.view_plot(view, head, query, value="pattern")
            ui.show_plot(pattern_plot, key="pattern")
        plots += [scores_plot, pattern_plot]

        st.header(f"Query {view.queries[query]}: f_x(y) over its keys")
        bar_col, metric_col = st.columns([3, 1])
        with bar_col:
            row_plot = fb.query_plot(view, head, query)
            ui.show_plot(row_plot, key="query_row")
            plots.append(row_plot)
        with metric_col:
            per_query = view.concentration(int(k))
            i = view.head_index(head)
            n_keys = int(view.mask[query].sum())
            st.metric("visible keys n_i", n_keys, help="Keys this query can attend to (causal: positions 0..i)")
            for name, v in per_query.items():
                label = name.replace("_", " ") + (f" (k={k})" if name == "topk_mass" else "")
                st.metric(label, f"{float(v[i, query]):.3f}", help=METRIC_HELP[name])

    # --- before and after retraining: the parent's same head on the same input ---------------------------
    parent = loaded.card.parent
    if (
        parent
        and head != ALL
        and not long_input
        and st.toggle(
            "Before and after retraining",
            key=ui.remember("before_after", False),
            help=f"The same head of the model this one was retrained from ({ui.plain(parent, 80)}), on the same "
            "tokens, beside this one, on one colour scale",
        )
    ):
        st.header("Before and after retraining")
        try:
            before = ui.load_model(parent)
            same = (before.config.n_layers, before.config.n_heads, before.config.d_vocab)
            if same != (cfg.n_layers, cfg.n_heads, cfg.d_vocab):
                raise ValueError(f"it has a different shape (layers, heads, tokens {same})")
        except (ValueError, OSError) as e:
            st.info(f"The parent {ui.plain(parent, 120)} cannot be shown: {ui.plain(e)}")
        else:
            value = ui.value_choice("Show", "before_after_value", "pattern")
            pair = ftext.before_after_plots(
                sequence_view(before, tokens, layer),
                view,
                head,
                query,
                value,
                titles=(f"before ({before.name})", f"after ({loaded.name})"),
            )
            k_before = sequence_view(before, tokens, layer).concentration_table(int(k))
            k_after = view.concentration_table(int(k))
            for col, plot, table in zip(st.columns(2), pair, (k_before, k_after)):
                with col:
                    ui.show_plot(plot, key=plot.name.split("_")[0])
                    row = table[table["head"] == head].set_index("metric")["mean"]
                    st.caption(
                        f"Mean over this input's query rows: normalized entropy {row['normalized_entropy']:.3f}, "
                        f"top-{int(k)} mass {row['topk_mass']:.3f}"
                    )
            plots += pair

    # --- why this key: the score split over the singular directions of B ---------------------------------
    if head != ALL and st.toggle(
        "Why this key",
        key=ui.remember("why_key", False),
        help="Split the query's scores into the rank-1 terms σᵢ (x·uᵢ)(y·vᵢ) of B, see which directions "
        "make the top key beat the runner-up, and what each key actually sends (value-weighted)",
    ):
        st.header(f"Why this key: query {labels[query]}")
        st.markdown(
            "With $B = \\sum_i \\sigma_i u_i v_i^\\top$, $f_x(y) = \\sum_i \\sigma_i (x\\cdot u_i)(y\\cdot v_i)$ "
            "+ bias: each bar is one singular direction's contribution to a key's score (same units as S)."
        )
        attr = attribution(loaded, tokens, layer, head, query)
        why_plots = [fa.attribution_plot(attr, top=min(8, len(attr.keys)))]
        why_left, why_right = st.columns(2)
        with why_left:
            ui.show_plot(why_plots[0], key="why_attribution")
        with why_right:
            if len(attr.keys) > 1:
                why_plots.append(fa.runner_up_plot(attr))
                ui.show_plot(why_plots[-1], key="why_runner_up")
            else:
                st.info("The first query sees one key only: there is no runner-up.")
        if layer == 0 and cfg.positional == "learned":
            st.markdown(
                "At layer 0, with each token's LayerNorm scale frozen, $x = tok + pos + b$ exactly, so each "
                "score splits into token-token, token-position, position-token and position-position parts "
                "(query side first)."
            )
            why_plots.append(fa.token_position_plot(token_position_split(loaded, tokens, head, query)))
            ui.show_plot(why_plots[-1], key="why_token_position")
        st.markdown(
            "Value-weighted attention $A_{ij}\\,\\|v_j W_O\\|$ beside the pattern: what query $i$ actually "
            "receives from key $j$ (residual-stream norm), not only where it looks."
            + (f" Shown for the window {lv.lo}..{lv.hi} only (a long input)." if long_input else "")
        )
        vw = value_weighted(loaded, tokens, layer, head)
        vw_labels = labels
        if long_input:
            vw, vw_labels = window_of(vw, lv.lo, lv.hi), lv.window_labels
        why_plots.append(fa.value_weighted_plot(vw, vw_labels, layer, [head], head))
        ui.show_plot(why_plots[-1], key="why_value_weighted")
        plots += why_plots

    # --- concentration of the head(s) --------------------------------------------------------------------
    st.header("Concentration of the head" if head != ALL else "Concentration of every head")
    table = long_concentration(loaded, tokens, layer, int(k)) if long_input else view.concentration_table(int(k))
    shown = table if head == ALL else table[table["head"] == head]
    st.caption(f"Mean, min and max over the query rows that see at least {metrics.MIN_KEYS} keys, on this input.")
    st.dataframe(
        shown[["head", "metric", "mean", "min", "max"]],
        hide_index=True,
        column_config={
            "head": st.column_config.NumberColumn(help="Head index h"),
            "metric": st.column_config.TextColumn(help="See the tooltips of the per-query metrics above"),
            "mean": st.column_config.NumberColumn(help="Mean over query rows", format="%.4f"),
            "min": st.column_config.NumberColumn(help="Smallest value over query rows", format="%.4f"),
            "max": st.column_config.NumberColumn(help="Largest value over query rows", format="%.4f"),
        },
    )
    plots.append(fb.concentration_plot(shown))  # the table above as a figure, for the zip below

    # --- vocabulary and positional views --------------------------------------------------------------------
    focus = head if head != ALL else 0
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
        + ("" if head != ALL else "Shown for head 0; pick a head above to see another.")
    )
    offset = 0
    if cfg.positional == "rotary":
        reach = min(cfg.n_ctx - 1, 4096)
        offset = st.slider(
            "Offset δ = key position − query position (rotary)",
            min_value=-reach,
            max_value=0,
            key=ui.remember("vocab_offset", 0, range(-reach, 1), param="offset"),
            help="With rotary positions the form is B(δ) = W_Q R(δ) W_Kᵀ/√d: the vocabulary view shows "
            "every token pair meeting δ positions apart (0: the un-rotated form)",
        )
    vocab_col, pos_col = st.columns(2)
    with vocab_col:
        vocab = vocabulary_view(loaded, layer, [focus], offset=int(offset))  # per head: a small copy out of the cache
        x_token = tokens[query]
        vocab_plot = fb.view_plot(vocab, focus, x_token if x_token < len(vocab.queries) else None)
        ui.show_plot(vocab_plot, key="vocab")
        plots.append(vocab_plot)
    with pos_col:
        if cfg.positional == "learned":
            positions = positional_view(loaded, layer, [focus])
            pos_plot = fb.view_plot(positions, focus, query if query < len(positions.queries) else None)
            ui.show_plot(pos_plot, key="positional")
            plots.append(pos_plot)
        elif cfg.positional == "rotary":  # no position embeddings: a token pair's score against the offset
            before = list(range(query + 1))
            key_pos = st.selectbox(
                "Key (its token meets the query's at every offset)",
                before,
                index=max(0, query - 1),
                format_func=lambda p: labels[p],
                key=f"pair_key_{query}",
                help="The query's token is fixed; its score with this key's token is plotted against "
                "the offset between them (a dashed line marks the offset in this input)",
            )
            curve = pair_curve(loaded, layer, focus, tokens[query], tokens[key_pos], min(cfg.n_ctx, 512))
            pair_plot = fr.pair_offset_plot(curve, layer, focus, labels[query], labels[key_pos], actual=key_pos - query)
            ui.show_plot(pair_plot, key="positional")
            plots.append(pair_plot)
        else:
            st.info("This model has no position embeddings, so it has no positional view.")

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
            "input": source,
            "tokens": tokens,
            "token_labels": labels,
            **(dict(long_input=True, window=[lv.lo, lv.hi], top_keys=len(lv.top), pool=pool) if long_input else {}),
            "k": int(k),
            "why_this_key": bool(st.session_state.get("why_key")) and head != ALL,
        },
        key="heatmaps",
    )


head_views()
