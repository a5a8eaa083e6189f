"""Saved retraining runs side by side: their curves, where they land in accuracy against
concentration, the spectra of B before and after, and one head's heatmap in each (and in the
parent)."""

import re

import pandas as pd
import streamlit as st

import ui
from attn_core import bilinear
from attn_core import regularizers as R
from attn_core import runs as rs
from attn_core.card import Card
from attn_core.figures import bilinear as fb
from attn_core.figures import text as ftext
from attn_core.figures import training as ft
from attn_core.text import source as text_source

MAX_SIDE = 2  # panels per row when runs are compared side by side (a third of the page is too narrow to read)
HEAD_FOR = "runs_head_for"  # the runs for which the page last picked their regularized head
sequence_view = ui.cached(bilinear.sequence_view)


@ui.cached
def run_metrics(run_id: str, updated: str):
    """A finished run's metric log (``updated`` keys the cache: a run's log never changes once finished)."""
    return rs.RunStore().metrics(run_id)


def side_by_side(items: list, draw) -> None:
    """Call ``draw(item, i)`` for each item in rows of at most MAX_SIDE columns."""
    for start in range(0, len(items), MAX_SIDE):
        cols = st.columns(min(MAX_SIDE, len(items)))
        for i, (col, item) in enumerate(zip(cols, items[start : start + MAX_SIDE]), start=start):
            with col:
                draw(item, i)


loaded = ui.setup("Compare runs")
store = rs.RunStore()
ui.run_store_panel(store)
try:
    every_run = [r for r in store.list_runs() if r["status"] != "running"]
except rs.RunStoreError as e:  # corrupt, unreadable: said once, here; the zoo stays usable elsewhere
    st.error(f"{e}. The other pages still work with the zoo models.")
    st.stop()
if not every_run:
    st.info(
        f"No finished runs in {ui.code(store.root)} yet: retrain a model on the Retrain page, or with "
        f"{ui.code(f'attn-lab retrain {ui.job_source(st.session_state[ui.MODEL_KEY])} --reg entropy=0.1')}."
    )
    st.stop()


def regs(r: dict) -> str:
    return ", ".join(r["config"].get("regularizers", [])) or "no regularizer"


def measured(r: dict, when: str, name: str):
    """The run's ``when`` ("before" or "after") measurement ``name`` from the run index, or None."""
    return (r["summary"].get(when) or {}).get(name)


def on_text(r: dict) -> bool:
    """A run on a text (an imported model): measured by held-out perplexity, not a task's accuracy."""
    return bool(r["config"].get("text")) or measured(r, "after", "perplexity") is not None


def regularized(r: dict, cfg) -> list[tuple[int, int]]:
    """The heads the run's penalties acted on (none if its settings do not fit ``cfg``)."""
    try:
        return R.regularized_heads(r["config"].get("regularizers"), r["config"].get("heads"), cfg)
    except ValueError:
        return []


# --- the runs --------------------------------------------------------------------------------------
table = pd.DataFrame(
    [
        {
            "id": r["id"],
            "parent": r["parent"],
            "status": r["status"],
            "regularizers": regs(r),
            "steps": r["config"].get("steps"),
            "entmax α": r["config"].get("entmax_alpha"),
            "accuracy before": measured(r, "before", "accuracy"),
            "accuracy after": measured(r, "after", "accuracy"),
            "perplexity before": measured(r, "before", "perplexity"),
            "perplexity after": measured(r, "after", "perplexity"),
            "entropy before": measured(r, "before", "entropy_data"),
            "entropy after": measured(r, "after", "entropy_data"),
            "created": r["created"],
            "message": r["message"],
        }
        for r in every_run
    ]
)
pct = dict(min_value=0.0, max_value=1.0, format="percent")
ui.show_table(
    table,
    hide_index=True,
    column_config={
        "id": st.column_config.TextColumn(help="Run id; the model is run:<id> in the sidebar"),
        "parent": st.column_config.TextColumn(help="The model the run started from"),
        "status": st.column_config.TextColumn(
            help="completed, stopped (by you), diverged (last good weights kept) or failed"
        ),
        "regularizers": st.column_config.TextColumn(help="name[:k][@heads]=λ of each penalty"),
        "steps": st.column_config.NumberColumn(help="Training steps asked for"),
        "entmax α": st.column_config.NumberColumn(help="1 softmax, 1.5 entmax15, 2 sparsemax; empty = the parent's"),
        "accuracy before": st.column_config.ProgressColumn(help="Held-out accuracy of the parent (512 samples)", **pct),
        "accuracy after": st.column_config.ProgressColumn(help="Held-out accuracy of the run (512 samples)", **pct),
        "entropy before": st.column_config.NumberColumn(
            help="Mean normalized attention entropy H/log n of the "
            "regularized heads, parent (0 = one key, 1 = uniform)",
            format="%.3f",
        ),
        "entropy after": st.column_config.NumberColumn(help="The same after retraining", format="%.3f"),
        "perplexity before": st.column_config.NumberColumn(help="Held-out perplexity of the parent (text runs)"),
        "perplexity after": st.column_config.NumberColumn(help="Held-out perplexity of the run (text runs)"),
    },
)

ids = [r["id"] for r in every_run]
by_id = {r["id"]: r for r in every_run}
current = st.session_state.get(ui.MODEL_KEY, "")
default = [current.removeprefix(rs.RUN_PREFIX)] if current.removeprefix(rs.RUN_PREFIX) in ids else ids[:2]
key = ui.remember("runs_selected", default)
st.session_state[key] = [i for i in st.session_state[key] if i in ids] or default  # deleted runs drop out
chosen = st.multiselect(
    "Runs to compare",
    ids,
    key=key,
    format_func=lambda i: rs.run_label(by_id[i]),
    help="Newest first; each run's curves, spectra and heatmaps are drawn side by side",
)
if not chosen:
    st.info("Pick at least one run.")
    st.stop()
with_parent = st.toggle(
    "Include the parent model",
    key=ui.remember("runs_with_parent", True),
    help="Draw the model each run started from next to the runs",
)
picker = ui.model_names()
parents = list(dict.fromkeys(ui.picker_name(by_id[i]["parent"]) for i in chosen))
parents = [p for p in parents if p in picker] if with_parent else []
plots = []

# --- curves and the trade-off --------------------------------------------------------------------------
st.header("Training curves")


def draw_curves(run_id: str, i: int) -> None:
    plot = ft.curves_plot(
        run_metrics(run_id, by_id[run_id]["finished"] or ""), title=f"{run_id}: {regs(by_id[run_id])}"
    )
    plot = plot.renamed(f"training_curves_{run_id}")
    ui.show_plot(plot, key=f"curves_{i}")
    plots.append(plot)
    if on_text(by_id[run_id]):  # a run on text is judged by its held-out perplexity
        ppl = ftext.perplexity_plot(
            run_metrics(run_id, by_id[run_id]["finished"] or ""),
            title=f"Perplexity of {run_id}",
            before=measured(by_id[run_id], "before", "perplexity"),
        ).renamed(f"perplexity_{run_id}")
        ui.show_plot(ppl, key=f"perplexity_{i}")
        plots.append(ppl)


side_by_side(chosen, draw_curves)

st.header("Accuracy against concentration")
for text_runs, measure, label in (
    (False, "accuracy", "Held-out accuracy"),
    (True, "perplexity", "Held-out perplexity"),
):
    group = [i for i in chosen if on_text(by_id[i]) == text_runs]  # a task's accuracy, a text's perplexity
    points = pd.DataFrame(
        [
            {
                "model": i,
                "regularizer": regs(by_id[i]),
                measure: measured(by_id[i], when, measure),
                "entropy_data": measured(by_id[i], when, "entropy_data"),
                "when": when,
            }
            for i in group
            for when in ("before", "after")
        ],
        columns=["model", "regularizer", measure, "entropy_data", "when"],
    ).dropna(subset=[measure, "entropy_data"])
    if len(points):
        trade = ft.tradeoff_plot(
            points,
            x="entropy_data",
            y=measure,
            color="model",
            title=f"{label} against mean normalized entropy (regularized heads): "
            "each arrow goes from before (the parent) to after (the run)",
        )
        ui.show_plot(trade, key="tradeoff" if not text_runs else "tradeoff_perplexity")
        plots.append(trade if not text_runs else trade.renamed("tradeoff_perplexity"))

# --- spectra before and after -------------------------------------------------------------------------------
st.header("Singular values of B, before and after")


def draw_spectra(run_id: str, i: int) -> None:
    try:
        card = Card.from_dict(store.get(run_id).get("card"))
    except ValueError as e:  # a card edited by hand or damaged: said, and the other runs still drawn
        st.warning(f"Run {run_id}: its card cannot be read ({ui.plain(str(e))}).")
        return
    per_head = card.details.get("per_head") or {}
    st.caption(f"**{run_id}**: {regs(by_id[run_id])}")
    if not per_head.get("before") or not per_head.get("after"):
        st.info(f"Run {run_id} ({by_id[run_id]['status']}) has no before/after measurement.")
        return
    plot = ft.spectra_before_after_plot(per_head["before"], per_head["after"]).renamed(f"spectra_before_after_{run_id}")
    ui.show_plot(plot, key=f"spectra_{i}")
    plots.append(plot)


side_by_side(chosen, draw_spectra)

# --- heatmaps side by side ---------------------------------------------------------------------------------
st.header("One head, side by side")
models = parents + [rs.RUN_PREFIX + i for i in chosen if by_id[i]["has_weights"]]
first = sampled = None
for name in models:  # the first model that loads sets the layers and heads; the first with a held-out input, the input
    try:
        loaded_model = ui.load_model(name)
    except (ValueError, OSError):  # said below, beside the other runs
        continue
    first = first or loaded_model
    if text_source.has_sample(loaded_model):  # its task, or a run's held-out text (an imported parent has none)
        sampled = loaded_model
        break
if first is None:
    st.info(
        "None of the chosen runs has weights (failed runs keep none) and no parent model can be loaded, "
        "so there is no heatmap to draw; pick a run that completed."
    )
    st.stop()
cfg = first.config
# the head the chosen runs regularized (the first of them), picked again whenever the runs change
target = next((pairs[0] for i in chosen if (pairs := regularized(by_id[i], cfg))), None)
if target is not None and st.session_state.get(HEAD_FOR) != tuple(chosen):
    st.session_state[ui.LAYER_KEY], st.session_state[ui.HEAD_KEY] = target
st.session_state[HEAD_FOR] = tuple(chosen)
c_layer, c_head, c_value, c_seed = st.columns(4)
layer, head = ui.layer_head_picker(cfg, (c_layer, c_head), url=False)
value = ui.value_choice("Show", "runs_value", "pattern", c_value)
seed = c_seed.number_input(
    "Task sample",
    min_value=0,
    max_value=2**31 - 1,
    step=1,
    key=ui.remember("runs_sample", 0, range(2**31)),
    help="Seed of the held-out task sample every model reads",
)
try:
    tokens = text_source.held_out_input(sampled or first, int(seed))
except ValueError as e:
    st.error(f"No common input: {e}")
    st.stop()


def draw_heatmap(name: str, i: int) -> None:
    try:
        m = ui.load_model(name)
    except ValueError as e:  # CheckpointError included: a damaged run is said, the others drawn
        st.warning(f"{name} cannot be loaded: {ui.plain(str(e))}")
        return
    if (m.config.n_layers, m.config.n_heads) != (cfg.n_layers, cfg.n_heads):
        st.info(f"{name} has another shape ({m.config.n_layers} layers × {m.config.n_heads} heads).")
        return
    plot = fb.view_plot(sequence_view(m, tokens, layer), head, value=value)
    plot = plot.renamed(f"{plot.name}_{re.sub(r'[^A-Za-z0-9_.-]+', '-', name)}")
    st.caption(f"**{name}**" + (" (parent)" if name in parents else ""))
    ui.show_plot(plot, key=f"heat_{i}")
    plots.append(plot)


side_by_side(models, draw_heatmap)

# --- export -------------------------------------------------------------------------------------------
st.divider()
ui.export_all(
    plots,
    {
        "page": "Runs",
        "runs": chosen,
        "parents": parents,
        "layer": layer,
        "head": head,
        "value": value,
        "sample_seed": int(seed),
        "configs": {i: by_id[i]["config"] for i in chosen},
    },
    key="runs",
)
