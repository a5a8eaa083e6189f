"""The algebra of one softmax head, by hand: what one softmax head can and cannot do with keys you draw yourself."""

import math

import numpy as np
import pandas as pd
import streamlit as st

import ui
from attn_core import toy_attention as ta
from attn_core.figures import toy

ui.setup("Attention explorer", needs_model=False)
st.markdown(
    "One query $q$ attends over keys $k_1,\\dots,k_n$ and values $v_1,\\dots,v_n$ (here $v_i=\\mu_i$). "
    "Draw the keys at random and watch whether the head copies one value, averages two, or does "
    "neither. Keys and values are indexed from 0."
)
st.latex(
    r"\alpha_i=\frac{\exp(k_i^\top q)}{\sum_{j=1}^{n}\exp(k_j^\top q)},\qquad c=\sum_{i=1}^{n}\alpha_i v_i,"
    r"\qquad k_i\sim\mathcal N(\mu_i,\ \alpha I),"
    r"\quad k_j\sim\mathcal N(\mu_j,\ \alpha I+\sigma^2\mu_j\mu_j^\top)"
)

# --- settings ------------------------------------------------------------------------------------
# Every choice is remembered (ui.remember): it survives a visit to another page.
MEANS = ["standard basis", "random orthonormal", "custom"]
left, middle, right = st.columns(3)
with left:
    st.markdown("**Keys and values**")
    n = st.number_input("n (keys)", min_value=2, max_value=32, step=1, key=ui.remember("toy_n", 4, range(2, 33)))
    d = st.number_input(
        "d (dimension)",
        min_value=1,
        max_value=64,
        step=1,
        key=ui.remember("toy_d", 8, range(1, 65)),
        help="Orthonormal means need d ≥ n.",
    )
    means_kind = st.radio(
        "Means μ_i",
        MEANS,
        horizontal=True,
        key=ui.remember("toy_means", MEANS[0], MEANS),
        help="The seed's limits assume orthonormal means; 'custom' lets you break that.",
    )
keys = range(int(n))
with middle:
    st.markdown("**Query**")
    case = st.radio(
        "Case",
        ta.CASES,
        horizontal=True,
        key=ui.remember("toy_case", ta.CASES[1], ta.CASES),
        format_func=lambda c: {"copy": "copy v_a", "average": "average v_a, v_b"}[c],
    )
    a = st.number_input("a", min_value=0, max_value=int(n) - 1, step=1, key=ui.remember("toy_a", 0, keys))
    b = st.number_input(
        "b",
        min_value=0,
        max_value=int(n) - 1,
        step=1,
        key=ui.remember("toy_b", min(1, int(n) - 1), keys),
        help="The second value to average; in the copy case only a reference point.",
    )
    beta = st.slider("β (query scale)", 0.0, 50.0, step=0.5, key=ui.remember("toy_beta", 10.0))
    heads = st.radio(
        "Heads",
        ta.HEAD_COUNTS,
        horizontal=True,
        key=ui.remember("toy_heads", ta.HEAD_COUNTS[0], ta.HEAD_COUNTS),
        disabled=case == "copy",
        help="Two heads split the average query: q₁ = βμ_a, q₂ = βμ_b, c = (c₁ + c₂)/2.",
    )
with right:
    st.markdown("**Noise and sampling**")
    alpha = st.number_input(
        "α (variance of every key)", min_value=0.0, step=1e-4, format="%.6f", key=ui.remember("toy_alpha", 1e-4)
    )
    j = st.selectbox("Key with large variance along its mean", keys, key=ui.remember("toy_j", int(a), keys))
    big_var = st.number_input(
        "σ² (its variance along μ_j)", min_value=0.0, step=0.1, format="%.3f", key=ui.remember("toy_big_var", 0.5)
    )
    n_samples = st.number_input(
        "Key samples", min_value=1, max_value=20_000, step=500, key=ui.remember("toy_samples", 2000, range(1, 20_001))
    )
    seed = st.number_input("Seed", min_value=0, step=1, key=ui.remember("toy_seed", 0))

n_heads = 1 if case == "copy" else int(heads)
try:
    if means_kind == "custom":
        start = pd.DataFrame(
            np.eye(int(n), int(d)), columns=[f"x{i}" for i in range(int(d))], index=[f"μ{i}" for i in range(int(n))]
        )
        means = st.data_editor(start, key=f"means_{n}_{d}").to_numpy(dtype=np.float64)
    else:
        means = ta.orthonormal_means(int(n), int(d), seed=int(seed) if means_kind == "random orthonormal" else None)
    shared = dict(
        a=int(a),
        b=int(b),
        alpha=alpha,
        beta=beta,
        big_var_index=int(j),
        big_var=big_var,
        n_samples=int(n_samples),
        seed=int(seed),
    )
    # The same seed draws the same keys, so these two differ only in their queries.
    pair = [ta.experiment(means, case="average", n_heads=h, **shared) for h in ta.HEAD_COUNTS]
    shown = pair[n_heads - 1] if case == "average" else ta.experiment(means, case="copy", n_heads=1, **shared)
except ValueError as e:
    st.error(f"These settings do not work: {e}")
    st.stop()

error = ta.orthonormality_error(means)
if error > 1e-9:
    st.warning(
        f"The means are not orthonormal (max |μᵢᵀμⱼ − δᵢⱼ| = {error:.3g}): the closed forms "
        "below assume they are; the sampled figures are still exact."
    )

# --- weights ---------------------------------------------------------------------------------------
st.header("Attention weights")
if case == "copy":
    st.latex(
        r"q=\beta\mu_a\ \Rightarrow\ k_a^\top q\approx\beta,\ k_i^\top q\approx0\ \Rightarrow\ "
        r"\alpha_a=\frac{e^\beta}{e^\beta+n-1}\xrightarrow{\beta\to\infty}1,\quad c\to v_a"
    )
    limit, limit_name = ta.copy_limit(int(n), beta), "e^β/(e^β+n−1)"
elif n_heads == 1:
    st.latex(
        r"q=\beta(\mu_a+\mu_b)\ \Rightarrow\ k_a^\top q\approx k_b^\top q\approx\beta\ \Rightarrow\ "
        r"\alpha_a=\alpha_b=\frac{e^\beta}{2e^\beta+n-2}\xrightarrow{\beta\to\infty}\tfrac12,"
        r"\quad c\to\tfrac12(v_a+v_b)"
    )
    limit, limit_name = ta.average_limit(int(n), beta), "e^β/(2e^β+n−2)"
else:
    st.latex(
        r"q_1=\beta\mu_a,\ q_2=\beta\mu_b\ \Rightarrow\ c_1\to v_a,\ c_2\to v_b,\quad "
        r"c=\tfrac12(c_1+c_2)\to\tfrac12(v_a+v_b),\quad \alpha_a=\tfrac12\big(\alpha^{(1)}_a+\alpha^{(2)}_a\big)"
    )
    limit, limit_name = ta.two_head_limit(int(n), beta), "(e^β+1)/(2(e^β+n−1))"
m1, m2, m3 = st.columns(3)
m1.metric("mean α_a over samples", f"{shown.alpha_a.mean():.4f}")
m2.metric(f"fixed keys: α_a = {limit_name}", f"{limit:.4f}", help="The value at α = σ² = 0 and orthonormal means.")
m3.metric("std of α_a", f"{shown.alpha_a.std():.4f}")
weights_fig = toy.weights_plot(shown)
ui.show_plot(weights_fig, key="toy_weights")

# --- output ----------------------------------------------------------------------------------------
st.header("The output c")
text, chart = st.columns([1, 2])
with text:
    st.markdown(
        "Each point is $c$ for one draw of the keys, in the coordinates of $v_a$ and $v_b$, coloured "
        "by $\\gamma = k_j^\\top\\mu_j/\\|\\mu_j\\|^2$, the chosen key's scale along its mean "
        "(red above 1, blue below)."
    )
    st.metric("median |c − v_a|", f"{np.median(shown.dist_a):.4f}")
    st.metric("median |c − v_b|", f"{np.median(shown.dist_b):.4f}")
    st.metric("median |c − (v_a+v_b)/2|", f"{np.median(shown.dist_average):.4f}")
with chart:
    output_fig = toy.output_plot(shown)
    ui.show_plot(output_fig, key="toy_output")

# --- histogram -------------------------------------------------------------------------------------
st.header("α_a over the samples")
st.latex(
    r"k_j=\gamma\mu_j+\sqrt{\alpha}\,z,\quad\gamma\sim\mathcal N(1,\sigma^2):\qquad "
    r"\operatorname{std}(k_a^\top q-k_b^\top q)\approx2\beta\sqrt{\alpha}\ \text{from }\alpha I,\quad "
    r"\beta\,|\gamma-1|\ \text{from }\sigma^2\ (j=a)"
)
st.markdown(
    "The average survives isotropic noise while $2\\beta\\sqrt{\\alpha}\\ll1$; a large $\\sigma^2$ "
    "on key $a$ breaks it for any $\\beta$."
)
hist_fig = toy.alpha_histogram([shown])
ui.show_plot(hist_fig, key="toy_alpha_a_hist")

# --- one head vs two -------------------------------------------------------------------------------
st.header("One head vs two")
st.markdown("The average case on the same key draws, with one head and with two.")
st.latex(
    r"\text{one head: }\alpha_a\approx\frac{e^{\gamma\beta}}{e^{\gamma\beta}+e^{\beta}+n-2}"
    r"\approx\operatorname{sigmoid}\big((\gamma-1)\beta\big)\ \Rightarrow\ c\approx v_a\ (\gamma>1)"
    r"\ \text{or}\ v_b\ (\gamma<1)"
)
st.latex(
    r"\text{two heads: }\alpha^{(1)}_a\approx\frac{e^{\gamma\beta}}{e^{\gamma\beta}+n-1}\to1"
    r"\ \text{whenever}\ \gamma\beta\gg\log(n-1)\ \Rightarrow\ c=\tfrac12(c_1+c_2)\approx\tfrac12(v_a+v_b)"
)
if j == a and big_var > 0 and beta > 0:
    threshold = math.log(int(n) - 1) / beta if n > 2 else 0.0
    tail = 0.5 * (1 + math.erf((threshold - 1) / math.sqrt(2 * big_var)))
    st.caption(
        f"Two heads still fail in the tail γ < log(n−1)/β = {threshold:.3g}, which has probability "
        f"{tail:.3f} for γ ~ N(1, {big_var:g}); the seed's fix assumes γ stays well above 0."
    )
heads_fig = toy.head_comparison_plot(pair)
ui.show_plot(heads_fig, key="toy_heads")
heads_hist_fig = toy.alpha_histogram(
    pair, name="toy_alpha_a_hist_heads", title="α_a over the same key draws: one head vs two"
)
ui.show_plot(heads_hist_fig, key="toy_alpha_a_hist_heads")
ui.show_table(toy.summary_table(pair), width="stretch")

# --- export ----------------------------------------------------------------------------------------
st.divider()
ui.export_all(
    [weights_fig, output_fig, hist_fig, heads_fig, heads_hist_fig],
    {
        "page": "Attention explorer",
        "seed_text": "003",
        "means_kind": means_kind,
        "settings": shown.settings,
        "means": means.tolist(),
    },
    key="attention_explorer",
)
