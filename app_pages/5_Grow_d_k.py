"""Grow the query/key width d_k of one head along the functional gradient: the spectrum
of the fitted form with its cut at d_k + p, predicted vs measured loss decrease, and fine-tuning
against random and zero growth; the head's heatmap before and after."""

import functools

import streamlit as st

import ui
from attn_core import bilinear, checkpoint, grow
from attn_core.card import Card
from attn_core.figures import bilinear as fb
from attn_core.figures import grow as fg
from attn_core.sources import LoadedModel

STAGES = {"step": "after the growth step", "finetuned": "after fine-tuning"}
VALUES = {"pattern": "pattern A", "scores": "scores S"}
ADD = 2  # the page grows by 2 (GrowConfig's 1 is the smallest step); everything else is GrowConfig's
# on a server page a growth is kept short: at most MAX_BATCH sequences fitted, MAX_STEPS fine-tuning steps
MAX_BATCH, MAX_STEPS = 256, 2000
RESULT = "grow_settings"  # session key: the settings of the last growth asked for, per model


# Shared, not copied: the result holds models, and pickling them fails whenever Streamlit has
# reloaded attn_core since. Nothing downstream mutates the result.
@ui.cached(resource=True, max_entries=8)
def run_growth(m: LoadedModel, cfg: grow.GrowConfig) -> grow.GrowResult:
    # the bar is made here, inside the cached call (Streamlit replays what a cached call drew, and
    # only what it drew in its own blocks), and emptied when the growth is done
    bar = st.progress(
        0.0, text=f"Growing head {cfg.head} of layer {cfg.layer} by {cfg.add} and fine-tuning three models…"
    )
    res = grow.grow(
        m.model, m.task, cfg, progress=lambda what, done: bar.progress(min(1.0, done), text=f"Growing: {what}…")
    )
    bar.empty()
    return res


@ui.cached
def head_now(m: LoadedModel, layer: int, head: int, seed: int):
    """The head as it is: its singular values and its attention on a task sample (cheap, shown
    before Grow is pressed)."""
    frame = bilinear.spectrum_frame(m.model)
    spectrum = frame[(frame["layer"] == layer) & (frame["head"] == head)]
    return spectrum, bilinear.sequence_view(m, bilinear.sample_tokens(m, seed), layer, [head])


loaded = ui.setup("Grow d_k of a head")
cfg = loaded.config
st.markdown(
    "A head scores $S = X B X^\\top$ with $B = W_Q W_K^\\top/\\sqrt{d_k}$ of rank $\\le d_k$. To give it $p$ more "
    "dimensions, move the scores against the gradient of the loss, $T = S - \\eta\\,\\nabla_S L$, fit $T$ by "
    "least squares over a batch of task sequences, keep the best rank $d_k + p$ (Eckart–Young) and factor it into "
    "the new $W_Q, W_K$. At $\\eta = 0$ the grown model computes exactly what the old one did; the step size is "
    "chosen on the actual loss, then every method is fine-tuned the same way."
)
st.latex(  # one statement per line: on one line it does not fit the page at 1440 px
    r"\begin{gathered}"
    r"Z^*(\eta)=\arg\min_Z \sum_b \big\|C\big(S_b-\eta\,\nabla_{S_b}L - X_b Z X_b^\top\big)\big\|_F^2,\\"
    r"Z_k=\text{best rank-}(d_k+p)\ \text{approximation},\qquad \|Z^*-Z_k\|^2=\sum_{i>d_k+p}\sigma_i^2"
    r"\end{gathered}"
)
st.caption(
    "C keeps the visible (causal) entries and centres each query row: softmax ignores a constant added to a "
    "row. The norm is the whitened one of the batch, in which ‖Z* − Z_k‖² is the mean squared change of the "
    "scores over every pair of rows; the raw basis is the seed's own recipe."
)
ui.require_task(loaded, "there is no loss to grow it on")
if cfg.qk != "factored":
    st.warning(f"{loaded.name} has merged heads (one W_QK = B per head, any rank): there is no d_k to grow.")
    st.stop()

# --- settings ------------------------------------------------------------------------------------
d_aug = cfg.d_model + cfg.attn_bias
with st.form("grow_form"):
    c_layer, c_head, c_add, c_batch, c_steps, c_seed = st.columns(6)
    layer, head = ui.layer_head_picker(cfg, (c_layer, c_head))
    # each input is GrowConfig's declaration; the page grows by ADD and keeps a server's growth short
    add = ui.setting_input(
        c_add, grow.GrowConfig, "add", "grow_add", max_value=max(1, d_aug - 1), value=ADD, width=d_aug
    )
    batch = ui.setting_input(c_batch, grow.GrowConfig, "batch", "grow_batch", max_value=MAX_BATCH)
    steps = ui.setting_input(c_steps, grow.GrowConfig, "steps", "grow_steps", max_value=MAX_STEPS)
    seed = ui.setting_input(c_seed, grow.GrowConfig, "seed", "grow_seed")
    with st.expander("More settings"):
        c_basis, c_damp, c_lr = st.columns(3)
        basis = ui.setting_input(c_basis, grow.GrowConfig, "basis", "grow_basis")
        damping = ui.setting_input(c_damp, grow.GrowConfig, "damping", "grow_damping")
        lr = ui.setting_input(c_lr, grow.GrowConfig, "lr", "grow_lr")
    submitted = st.form_submit_button("Grow", type="primary", icon=":material/open_in_full:")
ui.to_url(layer=layer, head=head)

settings = dict(
    layer=int(layer),
    head=int(head),
    add=int(add),
    batch=int(batch),
    steps=int(steps),
    seed=int(seed),
    basis=basis,
    damping=float(damping),
    lr=float(lr),
)
requests = st.session_state.setdefault(RESULT, {})
if submitted:
    requests[loaded.key] = settings
if loaded.key not in requests:
    st.info(
        "Choose a head and p, then press **Grow** (a zoo model takes about half a minute on a CPU; a bar "
        "shows how far it got). Below, the head as it is now.",
        icon=":material/arrow_upward:",
    )
    now_spectrum, now_view = head_now(loaded, int(layer), int(head), 0)
    left, right = st.columns(2)
    with left:
        ui.show_plot(fb.spectrum_plot(now_spectrum), key="grow_now_spectrum")
    with right:
        ui.show_plot(fb.view_plot(now_view, int(head), value="pattern"), key="grow_now_pattern")
    st.stop()
settings = requests[loaded.key]
try:
    gcfg = grow.GrowConfig(**settings)
    res = run_growth(loaded, gcfg)
except ValueError as e:
    st.error(f"These settings do not work: {e}")
    st.stop()
s = res.summary()

# --- headline ------------------------------------------------------------------------------------
best_base = min(("random", "zero"), key=lambda m: s["baselines"][m]["loss_after_finetune"])
m1, m2, m3, m4 = st.columns(4)
m1.metric("d_k", f"{s['d_k']} → {s['d_k_new']}", help="Query/key width of the head before → after")
m2.metric("held-out loss before", f"{s['loss_before']:.4g}")
m3.metric(
    "after the growth step",
    f"{s['loss_after_step']:.4g}",
    delta=f"{s['loss_after_step'] - s['loss_before']:.3g}",
    delta_color="inverse",
    help="Before any fine-tuning",
)
m4.metric(
    f"after {settings['steps']} steps",
    f"{s['loss_after_finetune']:.4g}",
    delta=f"{s['loss_after_finetune'] - s['baselines'][best_base]['loss_after_finetune']:.3g} vs {best_base}",
    delta_color="inverse",
    help="Grown model fine-tuned; the delta compares with the better baseline",
)

# --- why these directions ------------------------------------------------------------------------
st.header("Why these directions")
spectrum = fg.spectrum_plot(res)
left, right = st.columns([3, 2])
with left:
    ui.show_plot(spectrum, key="grow_spectrum")
with right:
    st.markdown(
        f"The fitted form $Z^*(\\eta^*)$ has the singular values on the left. Keeping the largest "
        f"**{s['d_k_new']}** is the best rank-{s['d_k_new']} form (Eckart–Young): no other choice of the "
        f"{s['add']} new directions loses less than the discarded energy."
    )
    st.latex(r"\textstyle\sum_{i>d_k+p}\sigma_i^2" + f"={s['discarded_energy']:.4g}")
    st.markdown(
        f"- the {s['add']} new directions hold **{s['captured_share']:.1%}** of the energy beyond the old $d_k$;\n"
        f"- score residual of the grown head on the batch: **{s['residual']:.4g}** (mean over visible entries) = "
        f"fit residual {s['fit_residual']:.4g} (no rank limit) + truncation {s['truncation_residual']:.4g};\n"
        f"- the batch's attention input spans {s['data_rank'][0]} query / {s['data_rank'][1]} key directions "
        f"of {d_aug}."
    )

# --- step size -----------------------------------------------------------------------------------
st.header("Step size: predicted vs measured")
decrease = fg.decrease_plot(res)
left, right = st.columns([3, 2])
with left:
    ui.show_plot(decrease, key="grow_decrease")
with right:
    st.markdown(
        f"First order, $L(S+\\Delta S)\\approx L(S)+\\langle\\nabla_S L,\\Delta S\\rangle$: for small steps the "
        f"measured decrease matches the prediction. The chosen step $\\eta^* = {s['eta'] / s['eta_ref'] if s['eta_ref'] else 0:.3g}\\,\\eta_{{ref}}$ "
        f"has the least loss on a second batch among the steps keeping at least half the predicted decrease (Armijo)."
    )
    st.metric("predicted decrease at η*", f"{s['predicted_decrease']:.4g}")
    st.metric("measured decrease at η* (fitting batch)", f"{s['measured_decrease']:.4g}")
    with st.expander("Line search table"):
        ui.show_table(res.line_search, hide_index=True)

# --- against the baselines -----------------------------------------------------------------------
st.header("Against random and zero growth")
curves, summary = fg.curves_plot(res), fg.summary_plot(res)
left, right = st.columns(2)
with left:
    ui.show_plot(curves, key="grow_curves")
with right:
    ui.show_plot(summary, key="grow_summary")
st.caption(
    "Zero-initialised dimensions never move under fine-tuning: both of their factors are zero, so both "
    "gradients vanish (a saddle). Random ones start at N(0, 0.02²) like the model's own init."
)

# --- the head before and after -------------------------------------------------------------------
st.header("The head before and after")
c_value, c_stage, c_sample = st.columns(3)
value = c_value.radio(
    "Show",
    list(VALUES),
    format_func=VALUES.get,
    horizontal=True,
    key=ui.remember("grow_value", "pattern", list(VALUES)),
)
stage = c_stage.radio(
    "Grown model",
    list(STAGES),
    format_func=STAGES.get,
    horizontal=True,
    key=ui.remember("grow_stage", "step", list(STAGES)),
)
sample = c_sample.number_input(
    "Held-out sample",
    min_value=0,
    max_value=2**31 - 1,
    step=1,
    key=ui.remember("grow_sample", 0, range(2**31)),
    help="Seed of the task sample drawn in both heatmaps",
)
tokens = bilinear.sample_tokens(loaded, int(sample))
after_model = res.models["grown" if stage == "step" else "grown_finetuned"]
after = LoadedModel(name=f"{loaded.name} (grown)", model=after_model, config=after_model.cfg, card=loaded.card)
g_layer, g_head = settings["layer"], settings["head"]
view_before = bilinear.sequence_view(loaded, tokens, g_layer, [g_head])
view_after = bilinear.sequence_view(after, tokens, g_layer, [g_head])
before_plot, after_plot = fg.heatmap_pair(view_before, view_after, g_head, value=value, after_label=STAGES[stage])
left, right = st.columns(2)
with left:
    ui.show_plot(before_plot, key="grow_before")
with right:
    ui.show_plot(after_plot, key="grow_after")
change = (view_after.pattern - view_before.pattern).abs().max().item()
st.caption(
    f"Largest change of an attention weight on this sample: {change:.3g} (the step alone moves the head "
    "by η*; at η = 0 the grown head attends exactly as the old one)."
)

# --- export --------------------------------------------------------------------------------------
st.divider()
c_zip, c_model = st.columns(2)
with c_zip:
    ui.export_all(
        [spectrum, decrease, curves, summary, before_plot, after_plot],
        {"page": "Grow d_k", "seed_text": "001", "model": loaded.name, "settings": settings, "result": s},
        key=f"grow_{loaded.name}_L{g_layer}H{g_head}",
    )
with c_model:
    card = Card(
        task=loaded.task.name,
        parent=loaded.name,
        details={"grow": s},
        description=f"{loaded.name}, head {g_head} of layer {g_layer} grown to d_k {s['d_k_new']} and fine-tuned",
    )
    st.download_button(
        "Grown, fine-tuned model (safetensors)",
        icon=":material/download:",
        data=functools.partial(checkpoint.to_safetensors_bytes, res.models["grown_finetuned"], card),
        file_name=f"{loaded.name}-L{g_layer}H{g_head}-dk{s['d_k_new']}.safetensors",
        mime="application/octet-stream",
        key="grow_model_download",
        on_click="ignore",
        help="Config and card travel in the file's metadata: upload it in the sidebar to inspect it.",
    )
