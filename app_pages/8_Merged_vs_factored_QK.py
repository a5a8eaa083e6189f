"""Merged vs factored QK: can W_Q W_K^T be one d_model x d_model matrix? The same model trained with factored
QK (several d_qk) and merged QK (plain, with weight decay, with a nuclear-norm penalty)."""

from pathlib import Path

import streamlit as st

import ui
from attn_core import qk as Q
from attn_core.figures import qk as fq
from attn_core.runs import RunStore, RunStoreError
from attn_core.tasks import TASKS
from attn_core.validate import default

SOURCES = ("saved", "fresh")
SOURCE_LABELS = {"saved": "Saved full comparison (experiments/results)", "fresh": "Run a fresh comparison"}
# A fresh comparison in the browser is smaller than CompareConfig's full run (400 steps x 3 seeds,
# four factored widths: the saved result) so that it finishes while the user waits.
STEPS, SEEDS, D_QKS = 200, 1, [2, 16]
PAGE_MAX_STEPS, PAGE_MAX_SEEDS = 5000, 10  # of a fresh comparison on the server (the CLI's are CompareConfig's)
FRESH = "qk_fresh_comparison"  # session key of the last fresh comparison


@ui.cached(max_entries=4)
def load_saved(path: str, mtime: float) -> dict:
    """The saved comparison as JSON-ready data (``mtime`` keys the cache: a rerun of the
    experiment replaces the file)."""
    return Q.Comparison.load(path).to_dict()


@ui.cached(resource=True, max_entries=4)
def saved_plots(path: str, mtime: float) -> list:
    """The saved comparison's figures (``mtime`` keys the cache: a rerun of the experiment
    replaces the file), shared, not copied."""
    return fq.all_plots(Q.Comparison.from_dict(load_saved(path, mtime)))


ui.setup("Merged vs factored QK", needs_model=False)
st.markdown(
    "Can the two projections $W_Q, W_K$ of a head be merged into one "
    "$d_{model}\\times d_{model}$ matrix $W_{QK}$? Both compute a bilinear form $f_x(y) = x B y^\\top$; "
    "the factored form caps its rank at $d_{qk}$, the merged one does not. Below, one architecture is trained "
    "on the same data and seeds with each parametrisation; only the query/key part changes (values and outputs "
    "keep $d_{head}$)."
)
st.latex(
    r"\text{factored: } S=\frac{(XW_Q)(XW_K)^\top}{\sqrt{d_{qk}}},\quad B=\frac{W_QW_K^\top}{\sqrt{d_{qk}}},"
    r"\quad\operatorname{rank}B\le d_{qk},\quad 2\,d_{model}\,d_{qk}\ \text{parameters per head}"
)
st.latex(
    r"\text{merged: } S=XW_{QK}X^\top,\quad B=W_{QK},\quad\operatorname{rank}B\le d_{model},"
    r"\quad d_{model}^2\ \text{parameters per head}"
)
st.markdown(
    "With $W_{QK}=W_QW_K^\\top/\\sqrt{d_{qk}}$ the two give identical scores (tested). What differs is "
    "the implicit bias of training. For any matrix $M$:"
)
st.latex(r"\min_{W_QW_K^\top=M}\ \tfrac12\left(\|W_Q\|_F^2+\|W_K\|_F^2\right)=\|M\|_*=\sum_i\sigma_i(M)")
st.markdown(
    "attained by the balanced factors $W_Q=U\\Sigma^{1/2}$, $W_K=V\\Sigma^{1/2}$ of the SVD "
    "$M=U\\Sigma V^\\top$ (tested numerically)."
)
st.markdown(
    "So **weight decay on both factors penalises the nuclear norm of $B$**, a convex surrogate of rank "
    "(with $B=M/\\sqrt{d_{qk}}$ the minimum is $\\sqrt{d_{qk}}\\,\\|B\\|_*$; exact for an L2 penalty at the "
    "balanced factorization, only in spirit for AdamW's decoupled decay), while "
    "weight decay on $W_{QK}$ penalises $\\|B\\|_F^2$, which does not favour low rank. The variant "
    "*merged + nuclear* adds $\\lambda\\,\\operatorname{mean}_h\\|B_h\\|_*$ explicitly."
)

# --- which comparison ---------------------------------------------------------------------------------
source = st.radio(
    "Comparison",
    SOURCES,
    key=ui.remember("qk_source", "saved", SOURCES),
    horizontal=True,
    format_func=SOURCE_LABELS.get,
    help="The saved one is the full experiment (several seeds, experiments/merged_vs_factored.py); "
    "a fresh one trains here, in about half a minute with the defaults.",
)
comparison = None
if source == "saved":
    path = Q.results_path()
    try:
        mtime = path.stat().st_mtime if path.is_file() else 0.0
        comparison = Q.Comparison.from_dict(load_saved(str(path), mtime))
    except ValueError as e:
        st.info(f"{e}. Or choose “{SOURCE_LABELS['fresh']}”.")
else:
    st.subheader("Settings")
    c1, c2, c3 = st.columns(3)
    with c1:
        # each input is CompareConfig's declaration; a fresh comparison is smaller (STEPS, SEEDS, two
        # factored widths) and a server's is bounded (PAGE_MAX_STEPS, PAGE_MAX_SEEDS) so that it ends while the user waits
        task = ui.setting_input(st, Q.CompareConfig, "task", "qk_task", options=list(TASKS))
        steps = ui.setting_input(st, Q.CompareConfig, "steps", "qk_steps", max_value=PAGE_MAX_STEPS, value=STEPS)
        seeds = ui.setting_input(st, Q.CompareConfig, "seeds", "qk_seeds", max_value=PAGE_MAX_SEEDS, value=SEEDS)
    with c2:
        d_model = ui.setting_input(st, Q.CompareConfig, "d_model", "qk_d_model")
        d_qks = ui.setting_input(st, Q.CompareConfig, "d_qks", "qk_d_qks", value=D_QKS)
        kinds = ui.setting_input(st, Q.CompareConfig, "merged_kinds", "qk_kinds")
    with c3:
        decay = default(Q.CompareConfig, "weight_decay")
        qk_wd = ui.setting_input(st, Q.CompareConfig, "qk_weight_decay", "qk_wd", decay=decay)
        nuclear = ui.setting_input(st, Q.CompareConfig, "nuclear", "qk_nuclear")
        save = st.checkbox(
            "Save every run in the run store",
            key=ui.remember("qk_save", True),
            help="Runs get parent compare-qk:<task>; the Runs page compares them.",
        )
    if st.button("Run comparison", type="primary", key="qk_run"):
        try:
            cfg = Q.CompareConfig(
                task=task,
                steps=int(steps),
                seeds=int(seeds),
                d_qks=tuple(d_qks),
                merged_kinds=tuple(kinds),
                d_model=int(d_model),
                qk_weight_decay=float(qk_wd),
                nuclear=float(nuclear),
            )
        except ValueError as e:
            st.error(f"These settings do not work: {e}")
            st.stop()
        bar = st.progress(0.0, text="starting")
        st.session_state[FRESH] = Q.compare(
            cfg, store=None if save else False, progress=lambda f, msg: bar.progress(min(1.0, f), text=msg)
        )
        bar.empty()
    comparison = st.session_state.get(FRESH)
    if comparison is None:
        st.info("Set up a comparison and press **Run comparison**.")

if comparison is None:
    st.stop()

cfg = comparison.config
st.caption(
    f"Task **{cfg.task}**, {cfg.n_layers} layers × {cfg.n_heads} heads, d_model {cfg.d_model}, d_head (V/O) "
    f"{cfg.d_head}, {cfg.steps} steps, seeds {cfg.seed_list}; {comparison.machine}; created {comparison.created}, "
    f"{comparison.wall_time_s:.0f} s in all. Reproduce with `{cfg.command()}`."
)
# Building the seven figures takes about 0.9 s; the saved comparison's are made once per file
# version and shared by every session and rerun (nothing changes a Plot once it is made).
plots = saved_plots(str(path), mtime) if source == "saved" else fq.all_plots(comparison)
by_name = {p.name: p for p in plots}

# --- the table ---------------------------------------------------------------------------------------
st.header("Summary")
table = comparison.summary_frame()
table["final_loss"] = [f"{m:.4f} ± {sd:.4f}" for m, sd in zip(table["final_loss_mean"], table["final_loss_std"])]
table = table[
    [
        "name",
        "rank_cap",
        "params_qk_per_head",
        "params",
        "final_loss",
        "accuracy_mean",
        "accuracy_std",
        "stable_rank_mean",
        "rank_needed",
        "steps_to_bar",
        "ms_per_step",
    ]
]
ui.show_table(
    table,
    hide_index=True,
    column_config={
        "name": st.column_config.TextColumn("variant"),
        "rank_cap": st.column_config.NumberColumn("rank cap", help="d_qk for factored heads, d_model for merged ones"),
        "params_qk_per_head": st.column_config.NumberColumn("QK/head", help="2·d_model·d_qk or d_model²"),
        "params": st.column_config.NumberColumn("params", help="Whole model"),
        "final_loss": st.column_config.TextColumn("final loss", help="Held-out, mean ± std over seeds"),
        "accuracy_mean": st.column_config.ProgressColumn(
            "accuracy", min_value=0.0, max_value=1.0, format="percent", help="Held-out, mean over seeds"
        ),
        "accuracy_std": st.column_config.NumberColumn("± std", format="%.4f"),
        "stable_rank_mean": st.column_config.NumberColumn(
            "stable rank", format="%.2f", help="‖B‖²_F/‖B‖²₂, mean over heads and seeds (by layer: below)"
        ),
        "rank_needed": st.column_config.NumberColumn(
            "rank needed", help="Least tested r such that cutting every B to rank r keeps the accuracy within 1%"
        ),
        "steps_to_bar": st.column_config.NumberColumn(
            "steps to bar",
            help="First evaluation step at which the mean held-out accuracy reaches the task's bar; empty: never",
        ),
        "ms_per_step": st.column_config.NumberColumn(
            "ms/step", format="%.2f", help="Median over training steps (evaluations excluded), measured in one process"
        ),
    },
)

st.header("What the numbers say")
st.markdown("\n".join(f"- {s}" for s in comparison.findings()))
st.markdown(
    "How to read them for the seed's question: factored widths that fall short of the best accuracy mark the rank "
    "the task needs; *rank needed* says how much of its cap each trained B actually uses. A merged head is free to "
    "use all $d_{model}$ dimensions, so a stable rank and a rank needed well below $d_{model}$ mean the extra rank "
    "goes unused: the merged form then buys freedom from the cap and a different training path (compare the "
    "learning curves), not a high-rank solution. Weight decay on $W_Q, W_K$ is an implicit nuclear-norm penalty, "
    "so the factored rows already carry a low-rank bias that *merged* lacks and *merged + nuclear* restores. Merged heads cost $d_{model}^2$ "
    "parameters per head against $2\\,d_{model}d_{qk}$, fewer whenever $d_{qk} > d_{model}/2$."
)
if comparison.config.device == "cpu":
    st.caption(
        "ms/step comes from one process on this machine's CPU; on a shared machine it varies from run to run, "
        "so compare variants within one comparison only."
    )

# --- figures -------------------------------------------------------------------------------------------
st.header("Learning curves")
ui.show_plot(by_name["qk_curves_eval_loss"], key="qk_loss")
ui.show_plot(by_name["qk_curves_eval_accuracy"], key="qk_accuracy")
st.header("Final loss and accuracy")
ui.show_plot(by_name["qk_final"], key="qk_final")
st.header("Parameters and time per step")
ui.show_plot(by_name["qk_cost"], key="qk_cost")
st.header("Rank of the learned B")
ui.show_plot(by_name["qk_stable_rank"], key="qk_stable_rank")
ui.show_plot(by_name["qk_spectrum"], key="qk_spectrum")
ui.show_plot(by_name["qk_truncation"], key="qk_truncation")

# --- runs and export --------------------------------------------------------------------------------------
ids = [i for r in comparison.summary() for i in r["run_ids"]]
store = RunStore()
try:
    present = [i for i in ids if i in {r["id"] for r in store.list_runs()}]
except RunStoreError:  # an unreadable store: said on the Runs page; here, none of them is there
    present = []
where = f"your run store ({ui.code(store.root)})"
mine = (
    f"{len(present)} of them are in {where} with parent `compare-qk:{cfg.task}`: compare them on the "
    "[Runs page](Runs) or with `attn-lab runs`."
    if present
    else f"none of them is in {where}."
)
if source == "saved":
    st.caption(
        f"These are saved results shipped with attn-lab in {ui.code(Path(*Q.results_path().parts[-3:]))}, made by "
        f"`python experiments/merged_vs_factored.py` (the same as {ui.code(cfg.command())}) on "
        f"{ui.plain(comparison.machine)}, {ui.plain(comparison.created)}. Its {len(ids)} runs were saved in the run "
        f"store of the machine that made them; {mine} Running the command makes them anew in yours."
    )
elif ids:
    st.caption(f"This comparison saved {len(ids)} runs: {mine}")
st.divider()
ui.export_all(
    plots,
    {
        "page": "Merged vs factored QK",
        "seed_text": "004",
        "source": source,
        "config": cfg.to_dict(),
        "command": cfg.command(),
        "machine": comparison.machine,
        "variants": comparison.summary(),
        "findings": comparison.findings(),
    },
    key="merged_vs_factored_qk",
)
