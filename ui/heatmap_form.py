"""The Heatmaps page's section on the parts of a head's scores: for a QK-norm model the per-token
gains g_q(i), g_k(j) (a factor of S beside the scores), for a soft-capped model the scores before
or after the cap (a toggle), with biases the affine form's terms, with learned sinks each query's
mass on the sink beside token 0's. Computed by ``attn_core.bilinear.score_parts``; drawn by
``attn_core.figures.score_parts``."""

from __future__ import annotations

import streamlit as st

from attn_core.bilinear import score_parts
from attn_core.figures import Plot
from attn_core.figures import score_parts as fp
from attn_core.sources import LoadedModel
from ui.plots import show_plot
from ui.state import remember

GAINS_HELP = (
    "QK-norm divides q_i and k_j by their RMS, so S_ij = g_q(i) g_k(j) · x_i B̃ x_j^T: the gains g are a per-token "
    "factor of the scores, and B̃ (the norm weights folded in) is the head's bilinear core"
)
MLA_HELP = (
    "Multi-head latent attention: S_ij = g_q(i) g_kv(j) · x_i B x_j^T + g_q(i) · x_i B_R(j − i) x_j^T, the head's "
    "absorbed B (W_DQ diag(w_q) W_UQ W_UKᵀ diag(w_kv) W_DKVᵀ, scaled) and the decoupled rotary term; the two add up to S"
)
CAP_HELP = "The model's scores are c·tanh(S / c); off: S itself, before the cap"
TERMS_HELP = (
    "With query/key biases S = x'_i B' x'_j^T on x' = [x | 1]: the bilinear term x B y^T and three bias terms; "
    "each bar is a term's mean size over the visible cells as a share of the four"
)
SINK_HELP = (
    "A learned sink logit joins each row's softmax as one more column that no value reads: the mass a query puts "
    "there, beside the weight it puts on token 0"
)


def applies(loaded: LoadedModel) -> bool:
    """Whether the model's scores have parts to show (QK-norm gains, a soft cap, biases, learned sinks, MLA)."""
    cfg = loaded.config
    return cfg.qk_norm != "none" or cfg.attn_softcap is not None or cfg.attn_bias or cfg.attn_sinks or cfg.mla


def section(loaded: LoadedModel, tokens: list[int], layer: int, head: int) -> list[Plot]:
    """The gains and/or the capped scores of one head on the page's input; the plots drawn."""
    if not applies(loaded):
        return []
    st.header("The parts of the score")
    parts = score_parts(loaded, tokens, layer, head)
    plots, cols = [], st.columns(2)
    if parts.norm != "none":
        plots.append(fp.gains_plot(parts))
        with cols[0]:
            show_plot(plots[-1], key="score_gains", help=GAINS_HELP)
    if parts.cap is not None:
        capped = st.toggle("Scores after the soft cap", key=remember("after_cap", True), help=CAP_HELP)
        plots.append(fp.capped_plot(parts, capped))
        with cols[1]:
            show_plot(plots[-1], key="score_cap")
    cols = st.columns(2)
    if parts.terms is not None:
        plots.append(fp.terms_plot(parts))
        with cols[0]:
            show_plot(plots[-1], key="score_terms", help=TERMS_HELP)
    if parts.sink_share is not None:
        plots.append(fp.sink_share_plot(parts))
        with cols[1]:
            show_plot(plots[-1], key="score_sink", help=SINK_HELP)
    if parts.absorbed is not None:
        plots.append(fp.mla_terms_plot(parts))
        show_plot(plots[-1], key="score_mla_terms", help=MLA_HELP)
    return plots
