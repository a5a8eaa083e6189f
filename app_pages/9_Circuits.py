"""Circuits of every head (Elhage et al. 2021): what it writes (the OV map W_OV = W_V W_O, its
spectrum and copying score), whether it attends to and copies the same token (QK vs OV
eigenvalue positivity), which earlier heads feed it (Q-, K-, V-composition against a
random-matrix baseline) and its full OV circuit over the vocabulary."""

import pandas as pd
import streamlit as st
import torch

import ui
from attn_core import bilinear, circuits
from attn_core.circuits import KINDS, Composition
from attn_core.circuits.composition import N_SAMPLES
from attn_core.figures import circuits as fc
from attn_core.sources import LoadedModel

MAX_OV_TOKENS = 64  # rows and columns of the full OV circuit drawn for a big vocabulary
KIND_LABELS = {"q": "Q (queries)", "k": "K (keys)", "v": "V (values)"}
TABLE_COLUMNS = {
    "label": st.column_config.TextColumn("head", help="L<layer>H<head>"),
    "copying_score": st.column_config.NumberColumn(
        "OV copying score",
        format="%.3f",
        help="Σλ/Σ|λ| of the full OV circuit E W_V W_O U over the whole "
        "vocabulary, unitless, −1..1: near 1 when attending to a token raises that token's own logit, near −1 "
        "when it lowers it",
    ),
    "qk_positivity": st.column_config.NumberColumn(
        "QK positivity",
        format="%.3f",
        help="Σλ/Σ|λ| of the full QK circuit E B Eᵀ (the vocabulary view), "
        "unitless, −1..1: near 1 when a token attends to copies of itself",
    ),
    "qk_positivity_composed": st.column_config.NumberColumn(
        "QK positivity via writer",
        format="%.3f",
        help="The same, with the keys read through the OV map of the "
        "earlier head with the strongest baseline-corrected K-composition into this head (column 'K writer'); "
        "near 1 for an induction head reading a previous-token head",
    ),
    "writer": st.column_config.TextColumn("K writer", help="The earlier head that K-composes most into this head"),
    "ov_norm": st.column_config.NumberColumn(
        "‖W_OV‖_F", format="%.4g", help="Frobenius norm of W_V W_O, √Σσᵢ² (residual-stream units out per unit in)"
    ),
    "ov_singular_values": st.column_config.BarChartColumn("σᵢ(W_OV)", help="Singular values of W_OV, descending"),
}


@ui.cached
def ov_tables(loaded: LoadedModel) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per head (copying score, QK positivity, OV spectrum) and the tidy OV spectrum."""
    return circuits.head_circuits(loaded.model), circuits.ov_spectrum_frame(loaded.model)


@ui.cached
def composition_of(loaded: LoadedModel, n_samples: int, seed: int) -> Composition:
    return circuits.composition(loaded.model, n_samples=n_samples, seed=seed)


@ui.cached
def composed_positivity(loaded: LoadedModel, n_samples: int, seed: int) -> pd.DataFrame:
    comp = composition_of(loaded, n_samples, seed)
    return pd.DataFrame(
        circuits.composed_qk_positivities(loaded.model, comp),
        columns=["layer", "head", "writer", "qk_positivity_composed"],
    )


@ui.cached
def ov_circuit(loaded: LoadedModel, layer: int, head: int, n_tokens: int | None) -> torch.Tensor:
    tokens = None if n_tokens is None else list(range(n_tokens))
    return circuits.full_ov_circuit(loaded.model, layer, head, tokens)


loaded = ui.setup("Circuits")
cfg = loaded.config
st.markdown(
    "A head reads key $y$ and writes $A_{xy}\\,y W_V W_O$ into query $x$'s residual stream: "
    "$W_{OV} = W_V W_O$ ($d_{model}\\times d_{model}$, rank $\\le d_{head}$) is **what** it moves, "
    "$B$ **where** it looks. Through the embedding $E$ and the unembedding $U$, "
    "$E W_{OV} U$ says which logits attending to each token raises (its **copying score** "
    "$\\sum\\lambda_i/\\sum|\\lambda_i|$), and composition scores say which earlier heads feed a later one. "
    "See docs/maths.md, *Circuits*."
)

heads, spectrum = ov_tables(loaded)
plots = []

# --- OV spectra and copying scores -------------------------------------------------------------------
st.header("What each head writes: W_OV and its copying score")
normalized = st.toggle(
    "σᵢ / σ₁",
    key=ui.remember("ov_normalized", False),
    help="Divide each head's singular values by its largest, to compare shapes not scales",
)
spectrum_plot = fc.ov_spectrum_plot(spectrum, normalized=normalized)
ui.show_plot(spectrum_plot, key="ov_spectrum")
plots.append(spectrum_plot)
shown = heads[[c for c in TABLE_COLUMNS if c in heads]]
ui.show_table(shown, hide_index=True, column_config=TABLE_COLUMNS)
ui.download_table(shown, "head_circuits", key="dl_circuits_csv", help="The table above, singular values as lists")

# --- composition ---------------------------------------------------------------------------------------
st.header("Which heads feed which: composition")
n_samples = comp_seed = None
if cfg.n_layers > 1:
    st.markdown(
        "$C(A, B) = \\|W_A W_B\\|_F / (\\|W_A\\|_F\\,\\|W_B\\|_F)$, unitless in $[0, 1]$, from the OV map "
        "$W_A$ of an earlier head into a later head's queries ($W_B = B$), keys ($B^\\top$) or values "
        "($W_{OV}$), each read through its LayerNorm. Unrelated matrices still score about "
        "$1/\\sqrt{d_{model}}$: the baseline is the mean score of random matrices of the same shapes, "
        "and the corrected score is the score minus it."
    )
    c_samples, c_seed = st.columns(2)
    n_samples = int(
        c_samples.number_input(
            "Random pairs per shape",
            min_value=1,
            max_value=1024,
            step=16,
            key=ui.remember("comp_samples", N_SAMPLES, range(1, 1025)),
            help="Random matrix pairs averaged for the baseline of each shape",
        )
    )
    comp_seed = int(
        c_seed.number_input(
            "Baseline seed",
            min_value=0,
            max_value=2**31 - 1,
            step=1,
            key=ui.remember("comp_seed", 0, range(2**31)),
            help="Seed of the random matrices: the same seed gives the same baseline",
        )
    )
    comp = composition_of(loaded, n_samples, comp_seed)
    heads = heads.merge(composed_positivity(loaded, n_samples, comp_seed), on=["layer", "head"], how="left")
    comp_plot = fc.composition_plot(comp)
    ui.show_plot(comp_plot, key="composition")
    corrected_plot = fc.composition_plot(comp, corrected=True)
    ui.show_plot(corrected_plot, key="composition_corrected")
    c_kinds, c_top = st.columns([3, 1])
    kinds = c_kinds.multiselect(
        "Kinds of edge",
        list(KINDS),
        format_func=KIND_LABELS.get,
        key=ui.remember("graph_kinds", list(KINDS)),
        help="Which composition the graph draws: into queries, keys or values",
    )
    top = int(
        c_top.number_input(
            "Edges",
            min_value=1,
            max_value=64,
            step=1,
            key=ui.remember("graph_top", 12, range(1, 65)),
            help="The strongest baseline-corrected edges drawn",
        )
    )
    graph_plot = fc.head_graph_plot(comp, tuple(kinds) or KINDS, corrected=True, top=top)
    ui.show_plot(graph_plot, key="head_graph")
    plots += [comp_plot, corrected_plot, graph_plot]
else:
    st.info("This model has one layer, so no head can read what another writes: there is no composition.")

# --- positivity ------------------------------------------------------------------------------------------
st.header("Attends to and copies the same token? QK vs OV positivity")
if cfg.n_layers > 1:
    st.caption(
        "Open circles: a later head's QK positivity with its keys read through the OV map of its strongest "
        "K-composition writer. An induction head reading a previous-token head moves to the top right."
    )
positivity_plot = fc.positivity_plot(heads)
ui.show_plot(positivity_plot, key="positivity")
plots.append(positivity_plot)

# --- the full OV circuit of one head ---------------------------------------------------------------------
st.header("The full OV circuit of one head: E W_OV U")
c_layer, c_head = st.columns(2)
layer, head = ui.layer_head_picker(cfg, (c_layer, c_head))
ui.to_url(layer=layer, head=head)
n_tokens = None if cfg.d_vocab <= MAX_OV_TOKENS else MAX_OV_TOKENS
if n_tokens is not None:
    st.caption(
        f"The vocabulary has {cfg.d_vocab} tokens: the heatmap shows the first {n_tokens} (ids 0..{n_tokens - 1}) "
        "against themselves. The copying score is over the whole vocabulary."
    )
names = bilinear.token_names(loaded)[: n_tokens or cfg.d_vocab]
score = float(heads[(heads["layer"] == layer) & (heads["head"] == head)]["copying_score"].iloc[0])
ov_plot = fc.ov_circuit_plot(ov_circuit(loaded, layer, head, n_tokens), names, layer, head, score)
ui.show_plot(ov_plot, key="ov_circuit")
plots.append(ov_plot)

# --- export ---------------------------------------------------------------------------------------------
st.divider()
ui.export_all(
    plots,
    {
        "page": "Circuits",
        "model": loaded.name,
        "model_key": loaded.key,
        "layer": layer,
        "head": head,
        "ov_normalized": normalized,
        "composition": {"samples": n_samples, "seed": comp_seed} if n_samples else None,
        "ov_tokens_shown": n_tokens or cfg.d_vocab,
        "heads": heads.drop(columns=["ov_singular_values"])
        .astype(object)
        .where(heads.notna(), None)
        .to_dict(orient="records"),
    },
    key="circuits",
)
