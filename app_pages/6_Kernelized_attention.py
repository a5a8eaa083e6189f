"""Kernelized attention: how well random-feature and Nystrom approximations reproduce
one head's softmax attention as the number of features m grows, next to the head's spectrum, and
how fast they are against exact attention."""

import json
from pathlib import Path

import streamlit as st

import ui
from attn_core import bilinear, kernels
from attn_core.figures import kernels as fk

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "kernels.json"
DEFAULT_METHODS = ["favor", "nystromformer"]
DEFAULT_FEATURES = [m for m in kernels.FEATURES if m <= 256]


def _tokens(loaded, samples: int):
    return loaded.task.sample(samples, 0, "test").tokens


@ui.cached(max_entries=64)
def error_table(loaded, layer: int, head: int, methods: tuple, features: tuple, seeds: int, causal: bool, samples: int):
    qkv = kernels.head_qkv(loaded.model, _tokens(loaded, samples), layer, head)
    return kernels.error_curve(*qkv, methods, features, range(seeds), causal)


loaded = ui.setup("Kernelized attention")
cfg = loaded.config
st.markdown(
    "Softmax attention costs $O(n^2)$ because every query meets every key through $\\exp(q_i\\cdot k_j)$. "
    "**FAVOR+** writes that kernel as an expectation over $m$ positive random features, $\\exp(q\\cdot k) = "
    "\\mathbb{E}_w[\\phi_w(q)\\phi_w(k)]$; **Maclaurin** and **SchoenbAt** sample terms of the power series of "
    "$\\exp$ (SchoenbAt on normalised $q, k$); **Nyström** and **Nyströmformer** interpolate the $n\\times n$ "
    "matrix through $m$ landmark keys (sampled, or segment means). All then run in $O(nmd)$. "
    "Their error follows the head's bilinear form $B = W_Q W_K^\\top/\\sqrt{d_k}$: a large $\\|B\\|_2$ makes the "
    "kernel's dynamic range, hence the estimator's variance, explode, and a flat, high-rank spectrum (large stable "
    "rank) leaves no few directions for landmarks to capture — those heads are hard."
)
if cfg.entmax_alpha != 1.0:
    st.warning(
        f"{loaded.name} uses α-entmax (α = {cfg.entmax_alpha:g}), not softmax: the kernel methods approximate "
        "softmax, so there is no exact pattern here to compare them with."
    )
    st.stop()
ui.require_task(loaded, "there are no input sequences to run its heads on")

# --- settings ------------------------------------------------------------------------------------
c_layer, c_head, c_seeds, c_samples, c_causal = st.columns([1, 1, 2, 2, 1])
layer, head = ui.layer_head_picker(cfg, (c_layer, c_head))
seeds = c_seeds.slider(
    "Seeds",
    1,
    10,
    key=ui.remember("kernels_seeds", 3, range(1, 11)),
    help="Independent random draws (seeds 0..K-1) per method and m; bars span their range",
)
samples = c_samples.number_input(
    "Input samples",
    min_value=1,
    max_value=256,
    step=1,
    key=ui.remember("kernels_samples", 8, range(1, 257)),
    help="Held-out task sequences (seed 0) the head is run on",
)
causal = c_causal.checkbox(
    "Causal",
    key=ui.remember("kernels_causal", True),
    help="Mask future keys, as the model does. Nyström's landmarks are built from all keys, "
    "so only favor, maclaurin and schoenbat have a true causal (prefix-sum) form.",
)
c_methods, c_features = st.columns(2)
methods = c_methods.multiselect("Methods", list(kernels.METHODS), key=ui.remember("kernels_methods", DEFAULT_METHODS))
features = c_features.multiselect(
    "Features m",
    list(kernels.FEATURES),
    key=ui.remember("kernels_features", DEFAULT_FEATURES),
    help="Random features (favor, maclaurin, schoenbat) or landmarks (Nyström)",
)
ui.to_url(layer=layer, head=head)
if not methods or not features:
    st.error("Choose at least one method and one feature count.")
    st.stop()
methods, features = tuple(m for m in kernels.METHODS if m in methods), tuple(sorted(features))

# --- the head's spectrum -------------------------------------------------------------------------
try:
    spec = kernels.head_spectrum(loaded.model, layer, head)
except ValueError as e:
    st.error(f"This head cannot be analysed: {e}")
    st.stop()
m1, m2, m3 = st.columns(3)
m1.metric(
    "stable rank of B",
    f"{spec['stable_rank']:.2f}",
    help="‖B‖_F² / ‖B‖_2²: how many directions carry the form's energy. Large and flat: hard to approximate "
    "with few landmarks.",
)
m2.metric(
    "spectral norm ‖B‖₂",
    f"{spec['spectral_norm']:.3g}",
    help="Largest singular value of B: the largest score a unit query/key pair can get. The random-feature "
    "variance grows like exp(|q + k|²), so large norms need many more features.",
)
m3.metric("Frobenius norm ‖B‖_F", f"{spec['frobenius_norm']:.3g}", help="Square root of the sum of all σ_i²")

# --- error curves --------------------------------------------------------------------------------
st.header("Error against the number of features")
try:
    with st.spinner(
        f"Approximating head {head} of layer {layer} with {len(methods)} method(s) × {len(features)} "
        f"feature count(s) × {seeds} seed(s)…"
    ):
        errors = error_table(loaded, int(layer), int(head), methods, features, int(seeds), bool(causal), int(samples))
except ValueError as e:
    st.error(f"These settings do not work: {e}")
    st.stop()
rel_plot, tv_plot = fk.error_curves(errors, "rel_error"), fk.error_curves(errors, "tv")
left, right = st.columns(2)
with left:
    ui.show_plot(rel_plot, key="kernels_rel")
with right:
    ui.show_plot(tv_plot, key="kernels_tv")
st.caption(
    "Relative output error ‖Ô − O‖_F / ‖O‖_F and mean total variation ½Σ_j|Â_ij − A_ij| of the pattern rows, "
    "in float64 with q, k rebalanced as a Performer would split the scale. The dashed line is the Monte-Carlo "
    "rate 1/√m."
)
ui.show_table(kernels.error_summary(errors), hide_index=True)

# --- one approximation, side by side -------------------------------------------------------------
st.header("Exact vs approximate pattern")
c_pick, c_m = st.columns(2)
pick = c_pick.selectbox("Method", list(methods), key=ui.remember("kernels_pick", methods[0], list(methods)))
pick_m = c_m.selectbox("Features m", list(features), key=ui.remember("kernels_pick_m", features[-1], list(features)))
tokens = _tokens(loaded, 1)
exact, approx = kernels.head_patterns(loaded.model, tokens, int(layer), int(head), pick, int(pick_m), 0, bool(causal))
names = bilinear.token_names(loaded)
pattern_plot = fk.pattern_comparison(
    exact[0], approx[0], [names[t] for t in tokens[0].tolist()], f"{pick}, m={pick_m} (seed 0)"
)
ui.show_plot(pattern_plot, key="kernels_pattern")

# --- speed ---------------------------------------------------------------------------------------
st.header("Speed against exact attention")
plots = [rel_plot, tv_plot, pattern_plot]
if not BENCH.is_file():
    st.info(
        "No benchmark result yet: run `python benchmarks/kernel_methods.py` (about 4 minutes) to write "
        "benchmarks/results/kernels.json, or `attn-lab kernels-bench --max-n 4096` for a quick look."
    )
else:
    bench = json.loads(BENCH.read_text())
    for result in (bench, bench.get("causal")):
        if not result:
            continue
        speed = fk.speed_chart(result)
        mode = "causal" if result["config"].get("causal") else "non-causal"
        speed.name = f"kernels_speed_{mode.replace('-', '_')}"
        ui.show_plot(speed, key=f"kernels_speed_{mode}")
        cross = ", ".join(
            f"{m} from n = {n}" if n else f"{m} never (up to n = {result['config']['max_n']})"
            for m, n in result["crossover"].items()
        )
        st.caption(
            f"{mode.capitalize()}: faster than torch's exact sdpa {cross}. Measured with "
            f"{result['config'].get('torch_threads', 1)} torch thread on the shared 2-core CPU "
            f"(4 heads, d_head {result['config']['d_head']}, m = {result['config']['features']}, "
            "median of 5); timings on a busy machine move, their ratios less so."
        )
        plots.append(speed)

st.divider()
ui.export_all(
    plots,
    manifest={
        "page": "Kernelized attention",
        "model": loaded.name,
        "layer": int(layer),
        "head": int(head),
        "methods": list(methods),
        "features": list(features),
        "seeds": int(seeds),
        "causal": bool(causal),
        "samples": int(samples),
    },
    key="kernels",
)
