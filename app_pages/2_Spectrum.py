"""The spectrum of B = W_Q W_K^T / sqrt(d_head) for every head: singular values, eigenvalues in
the complex plane, eigenvalues of the symmetric part, norms and ranks, the two ranks of each head
(of B and of its scores on probes), and head detectors."""

import pandas as pd
import streamlit as st

import ui
from attn_core import bilinear
from attn_core.bilinear import offsets
from attn_core.figures import bilinear as fb
from attn_core.figures import ranks as franks
from attn_core.figures import rotary as fr
from ui.probes import pick_probes, ranks_on

ALL = "all"
NORM_COLUMNS = {
    "rank_cap": ("rank cap", "Upper bound on rank(B): d_head for a factored head, d_model for a merged one"),
    "spectral_norm": ("‖B‖₂ = σ₁", "Spectral norm: the largest singular value (unitless gain of x ↦ xB)"),
    "frobenius_norm": ("‖B‖_F", "Frobenius norm √Σσᵢ²"),
    "nuclear_norm": ("‖B‖_*", "Nuclear norm Σσᵢ, a convex surrogate of rank"),
    "stable_rank": ("stable rank", "‖B‖_F² / ‖B‖₂²: how many directions carry the energy (1 .. rank)"),
    "effective_rank": ("effective rank", "exp(H(σ/Σσ)) (Roy & Vetterli): 1 .. rank"),
    "sink_logit": (
        "sink logit",
        "The head's learned sink logit z (gpt-oss): outside B, in each row's softmax denominator",
    ),
    "lambda_max": ("λ_max(sym)", "Largest eigenvalue of (B + Bᵀ)/2: the most positive x B xᵀ over unit x"),
    "lambda_min": ("λ_min(sym)", "Smallest eigenvalue of (B + Bᵀ)/2: the most negative x B xᵀ over unit x"),
    "singular_values": ("σᵢ", "Singular values of B, descending"),
    "eigenvalues_sym": (
        "eigenvalues of (B + Bᵀ)/2",
        "Descending; positive ones mean a token scores itself high along those directions, negative ones low",
    ),
}


@ui.cached
def spectra(m, augmented: bool) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Singular values (tidy), eigenvalues (tidy) and one row of norms and ranks per head."""
    rows = bilinear.spectrum_rows(m.model, augmented)
    extremes = [{"lambda_max": r["eigenvalues_sym"][0], "lambda_min": r["eigenvalues_sym"][-1]} for r in rows]
    table = pd.DataFrame(
        [
            {"layer": r["layer"], "head": r["head"], **{c: {**r, **e}[c] for c in NORM_COLUMNS if c in {**r, **e}}}
            for r, e in zip(rows, extremes)
        ]
    )
    return bilinear.spectrum_frame(m.model, augmented), bilinear.eigen_frame(m.model, augmented), table


@ui.cached
def latent_spectra(m) -> pd.DataFrame:
    """An MLA model's absorbed B on the latents: tidy singular values."""
    return bilinear.latent_spectrum_frame(m.model)


@ui.cached
def offset_spectra(m, layer: int, head: int, span: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """sigma_i(B(delta)) for delta = 0, -step, ..., -(span - 1) (at most 256 offsets), and the
    spectra no offset changes."""
    step = max(1, span // 256)
    deltas = list(range(0, -span, -step))
    return offsets.offset_spectrum(m.model, layer, head, deltas), offsets.reference_spectra(m.model, layer, head)


@ui.cached
def detectors(m, n_samples: int, seed: int, rows: str) -> pd.DataFrame:
    return bilinear.head_detectors(m.model, n_samples=n_samples, seed=seed, rows=rows)


loaded = ui.setup("Spectrum of B")
cfg = loaded.config
st.markdown(
    "Per head, $B = W_Q W_K^\\top/\\sqrt{d_{head}}$ ($d_{model}\\times d_{model}$; a merged head stores it). "
    "Its singular values say how many directions the head reads, its eigenvalues whether a token "
    "scores itself high ($x B x^\\top > 0$) and the symmetric part $(B+B^\\top)/2$ is the quadratic form "
    "$x B x^\\top$ itself. Computed from the factors (QR + a small SVD), never the dense matrix."
)

# --- choices ------------------------------------------------------------------------------------
c_which, c_layer, c_head, c_opts = st.columns([2, 1, 1, 3])
which = c_which.radio(
    "Heads",
    ["all", "one"],
    horizontal=True,
    key=ui.remember("spectrum_heads", "all", ["all", "one"]),
    format_func={"all": "all heads", "one": "one head"}.get,
)
# With rotary positions the picked head is also the one whose B(delta) is shown below.
layer, head = ui.layer_head_picker(cfg, (c_layer, c_head), disabled=which == ALL and cfg.positional != "rotary")
with c_opts:
    normalized = st.toggle(
        "σᵢ / σ₁",
        key=ui.remember("spectrum_normalized", False),
        help="Divide each head's singular values by its largest, to compare shapes not scales",
    )
    per_layer = st.toggle("One panel per layer", key=ui.remember("spectrum_per_layer", False))
    augmented = st.toggle(
        "With biases (B′)",
        key=ui.remember("spectrum_augmented", False),
        disabled=not bilinear.has_bias(loaded.model),
        help="The (d_model+1)² form B′ of [x | 1]: exact scores when the head has query/key "
        "biases (this model has none)"
        if not bilinear.has_bias(loaded.model)
        else "The (d_model+1)² form B′ of [x | 1]: exact scores with the query/key biases",
    )
ui.to_url(layer=layer, head=head)

sigma, eigen, table = spectra(loaded, bool(augmented))
if which == "one":

    def pick(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[(frame["layer"] == layer) & (frame["head"] == head)]

    sigma, eigen = pick(sigma), pick(eigen)

# --- singular values and eigenvalues ----------------------------------------------------------------
st.header("Singular values and eigenvalues")
left, right = st.columns(2)
with left:
    sigma_plot = fb.spectrum_plot(sigma, normalized=normalized, small_multiples=per_layer and which == ALL)
    ui.show_plot(sigma_plot, key="spectrum")
with right:
    eigen_plot = fb.eigen_plot(eigen)
    ui.show_plot(eigen_plot, key="eigenvalues")

# --- multi-head latent attention: the absorbed B on the latents ----------------------------------------
latent_plot = None
if cfg.mla:
    st.header("Multi-head latent attention: the absorbed B")
    st.markdown(
        "Each head's no-position score is $g_q g_{kv}\\, x B y^\\top$ with the absorbed "
        "$B = s\\, W_{DQ}\\,\\mathrm{diag}(w_q)\\, W_{UQ}^h W_{UK}^{h\\top} \\mathrm{diag}(w_{kv})\\, W_{DKV}^\\top$ "
        f"(the spectra above, rank ≤ {cfg.d_head}); on the latents it is $B_{{lat}} = s\\, W_{{UQ}}^h W_{{UK}}^{{h\\top}}$ "
        f"({cfg.q_lora_rank or cfg.d_model} × {cfg.kv_lora_rank}), the matrix inference multiplies. "
        "The decoupled rotary term is apart (below)."
    )
    latent = latent_spectra(loaded)
    if which == "one":
        latent = latent[(latent["layer"] == layer) & (latent["head"] == head)]
    latent_plot = fb.spectrum_plot(latent, normalized=normalized, small_multiples=per_layer and which == ALL)
    ui.show_plot(latent_plot, key="latent_spectrum")

# --- rotary heads: B(delta) -------------------------------------------------------------------------
offset_plot = None
if cfg.positional == "rotary":
    st.header("Rotary positions: the form against the offset")
    if cfg.mla:
        st.markdown(
            "An MLA head's form at offset $\\delta$ is $B + B_R(\\delta)$: its absorbed $B$ (above, the same at "
            f"every offset) and its decoupled rotary term of rank ≤ {cfg.rotary_dims}, the latent gains left out."
        )
    else:
        st.markdown(
            "With rotary positions a query at $i$ and a key at $j$ meet through "
            "$B(\\delta) = W_Q R(\\delta) W_K^\\top/\\sqrt{d}$, $\\delta = j - i \\le 0$: one form per offset. "
            "The spectra above are of the un-rotated $W_Q W_K^\\top/\\sqrt{d} = B(0)$"
            + (
                f"; only {cfg.rotary_dims} of the head's {cfg.d_head} dims rotate, and the rest form an "
                "offset-free part shown on the right."
                if cfg.rotary_dims < cfg.d_head
                else "."
            )
        )
    r_layer, r_head = layer, head  # the head picked at the top of the page
    top = min(cfg.n_ctx, 4096)
    span = st.slider(
        "Offsets back from the query",
        min_value=2,
        max_value=top,
        key=ui.remember("offset_span", min(64, top), range(2, top + 1)),
        help="δ from 0 down to −(this − 1) positions; past 256 offsets they are sampled evenly",
    )
    with st.spinner(f"Singular values of B(δ) at up to 256 offsets for L{r_layer}H{r_head}…"):
        by_offset, reference = offset_spectra(loaded, int(r_layer), int(r_head), int(span))
    offset_plot = fr.offset_spectrum_plot(by_offset, reference, int(r_layer), int(r_head))
    ui.show_plot(offset_plot, key="offset_spectrum")

# --- norms, ranks, symmetric part ---------------------------------------------------------------------
st.header("Norms, ranks and the symmetric part, every head")
shown = table if which == ALL else table[(table["layer"] == layer) & (table["head"] == head)]
ui.show_table(
    shown,
    hide_index=True,
    column_config={
        "layer": st.column_config.NumberColumn(help="Layer l"),
        "head": st.column_config.NumberColumn(help="Head h"),
        **{
            c: (
                st.column_config.BarChartColumn(label, help=tip)
                if c in ("singular_values", "eigenvalues_sym")
                else st.column_config.NumberColumn(label, help=tip, format="%.4g")
            )
            for c, (label, tip) in NORM_COLUMNS.items()
        },
    },
)
ui.download_table(
    shown,
    "norms_and_ranks",
    key="dl_norms_csv",
    help="The table above, singular values and eigenvalues of the symmetric part as lists",
)
sym_plot = fb.eigen_sym_plot(shown)
ui.show_plot(sym_plot, key="eigenvalues_sym")

# --- the two ranks: weight space and data space -------------------------------------------------------
st.header("The two ranks of each head")
st.markdown(
    "How many components carry 90% of the variance of $B$ (weight space), and of the scores it produces, "
    "$S_c = S(I - \\tfrac{1}{T}\\mathbf{1}\\mathbf{1}^\\top)$, each probe's full pre-mask score matrix (rotary "
    "applied, biases included) with each query's row centred (data space; the mean over the probes). "
    "Large models' heads need 5–25× more components in weight space than their scores use on text "
    "(arXiv 2604.04384)."
)
rank_plots = []
choice = pick_probes(loaded, "spectrum")
frac = st.slider("Share of the variance", 0.5, 0.99, key=ui.remember("rank_variance", 0.9), step=0.01)
if choice is not None:
    try:
        with st.spinner("Singular values of every head's centred scores on every probe…"):
            both = ranks_on(loaded, choice, float(frac))
    except ValueError as e:
        st.error(f"These probes do not work: {ui.plain(e)}")
        both = None
    if both is not None:
        rank_plots.append(franks.ranks_plot(both))
        ui.show_plot(rank_plots[-1], key="two_ranks")
        focus = (layer, head) if which == "one" else (0, 0)
        left_col, right_col = st.columns(2)
        with left_col:
            rank_plots.append(franks.variance_plot(both, *focus))
            ui.show_plot(rank_plots[-1], key="rank_variance")
        with right_col:
            rows = pd.DataFrame(both.heads())
            st.metric(
                "mean gap (B / S_c)",
                f"{rows['weight_rank'].mean() / rows['data_rank'].mean():.2f}×",
                help="The mean effective rank of B over that of the scores, every head",
            )
            ui.show_table(rows, hide_index=True, height=260)
            st.caption(f"Probes: {both.what}.")

# --- head detectors -----------------------------------------------------------------------------------
st.header("Head detectors")
st.markdown(
    "The attention mass each head puts where a textbook head would look, on seeded generated sequences: "
    "previous token ($i \\to i-1$) and self ($i \\to i$) on random tokens, duplicate token and induction "
    "($i \\to$ the token after an earlier copy of token $i$) on a random half written twice."
)
c_n, c_seed, c_rows = st.columns(3)
n_samples = c_n.number_input(
    "Sequences",
    min_value=1,
    max_value=256,
    step=8,
    key=ui.remember("detector_samples", 32, range(1, 257)),
    help="Generated sequences per detector",
)
det_seed = c_seed.number_input(
    "Seed",
    min_value=0,
    max_value=2**31 - 1,
    step=1,
    key=ui.remember("detector_seed", 0, range(2**31)),
    help="Seed of the generated sequences",
)
rows = c_rows.radio(
    "Average over",
    ["supported", "all"],
    horizontal=True,
    key=ui.remember("detector_rows", "supported", ["supported", "all"]),
    help="supported: only query rows where the pattern has a target (a perfect head scores 1); "
    "all: every row, as TransformerLens does",
)
with st.spinner(f"Scoring every head on {int(n_samples)} × 2 generated sequences…"):
    det = detectors(loaded, int(n_samples), int(det_seed), rows)
best = bilinear.best_heads(det)
for col, (name, top) in zip(st.columns(len(best)), best.items()):
    what = name.replace("_", " ")
    if top is None:  # no query row of these sequences can show the pattern (a very short context)
        col.metric(
            f"best {what} head",
            "n/a",
            help=f"No query row of the generated sequences can show the {what} "
            f"pattern in this model's context of {cfg.n_ctx} tokens",
        )
        continue
    col.metric(
        f"best {what} head",
        f"L{top['layer']}H{top['head']}",
        f"score {top['score']:.2f}",
        delta_color="off",
        delta_arrow="off",
        help=f"The head with the highest {what} score: its share of attention on the detection pattern, 0..1",
    )
heads_plot = fb.heads_plot(det)
ui.show_plot(heads_plot, key="heads")

# --- export -------------------------------------------------------------------------------------------
st.divider()
ui.export_all(
    [p for p in (sigma_plot, eigen_plot, offset_plot, sym_plot, *rank_plots, heads_plot) if p is not None],
    {
        "page": "Spectrum",
        "model": loaded.name,
        "model_key": loaded.key,
        "heads": which,
        "layer": layer if which == "one" else None,
        "head": head if which == "one" else None,
        "normalized": normalized,
        "augmented": augmented,
        "detectors": {"samples": int(n_samples), "seed": int(det_seed), "rows": rows},
        "norms_and_ranks": shown.to_dict(orient="records"),
        "two_ranks": {"probes": None if choice is None else choice.kind, "variance": float(frac)},
    },
    key="spectrum",
)
