"""Edit a head's B without retraining and see what it does (loss, perplexity, the head's attention
before and after), ablate or transplant it, save the edit as a run; and compare the heads of two
models from B alone (attn_core.surgery; docs/maths.md, "Surgery" and "Head diffing")."""

from urllib.parse import urlencode

import pandas as pd
import streamlit as st

import ui
from attn_core import surgery
from attn_core.bilinear import token_names
from attn_core.figures import surgery as fs
from attn_core.sources import LoadedModel
from attn_core.surgery.save import save_run
from navigation import page
from ui.probes import pick_probes

VIEWS = ("Heatmaps", "Spectrum")  # the pages a matched pair opens in, by URL (model, layer, head)
EXTRA = "edit_extra"  # session key: the ablation / transplant the buttons asked for, per head


@ui.cached(resource=True)
def inputs_of(loaded: LoadedModel, text: str | None, stamp: int | None, samples: int):
    return surgery.edit_inputs(loaded, text, samples=samples)


@ui.cached
def unedited(loaded: LoadedModel, text: str | None, stamp: int | None, samples: int, layer: int, head: int):
    inputs = inputs_of(loaded, text, stamp, samples)
    q = surgery.quick_loss(loaded.model, inputs)
    return q, surgery.head_pattern(loaded.model, inputs.tokens[0], layer, head)


@ui.cached(resource=True)
def modes_of(loaded: LoadedModel, layer: int, head: int):
    return surgery.head_modes(loaded.model, layer, head)


@ui.cached
def preview_of(loaded: LoadedModel, text, stamp, samples: int, edits: tuple, layer: int, head: int, sources: tuple):
    """What a slider move shows (loss, perplexity, the head's pattern, its mode factors), shared by
    every session that makes the same edit; ``sources``: (name, model) pairs of the transplant
    sources, keyed by their weights. The edited model itself is made again only to save it (a
    copy of the model per edit would stay in the cache)."""
    inputs = inputs_of(loaded, text, stamp, samples)
    shown = surgery.edit_preview(loaded, list(edits), inputs, layer, head, dict(sources))
    return dict(loss=shown.loss, perplexity=shown.perplexity), shown.pattern, shown.edited.factors[0]


def applied(extra: dict) -> str:
    """The ablation / transplant a button asked for, in words."""
    if extra.get("ablate") == "zero":
        return "the head's output zeroed (W_O = 0)"
    if extra.get("ablate") == "mean":
        return "the head's output replaced by its mean over the probes"
    what = "W_Q, W_K, W_V, W_O" if extra.get("with_ov") else "W_Q, W_K"
    return f"{what} transplanted from {ui.plain(extra['source'])} {ui.plain(extra['source_head'])}"


@ui.cached
def diff_of(a: LoadedModel, b: LoadedModel):
    return surgery.diff(a, b)


@ui.cached(resource=True, max_entries=32)
def diff_figure(a: LoadedModel, b: LoadedModel, other: str, index: int):
    """The distance matrix of one layer (the ``index``-th), shared by every session."""
    return fs.diff_plot(diff_of(a, b).layers[index], a.name, other)


@ui.cached(resource=True, max_entries=32)
def edit_figures(loaded: LoadedModel, text, stamp, samples: int, edits: tuple, layer: int, head: int, sources: tuple):
    """The head's attention before and after the edit, and its modes with the edit's factors (no
    edit: as they are), shared by every session that makes the same edit."""
    inputs = inputs_of(loaded, text, stamp, samples)
    modes = modes_of(loaded, layer, head)
    _, pattern0 = unedited(loaded, text, stamp, samples, layer, head)
    pattern1, factors = pattern0, None
    if edits:
        _, pattern1, factors = preview_of(loaded, text, stamp, samples, edits, layer, head, sources)
    if factors is None:  # modes untouched (no edit, an ablation, a transplant)
        factors = surgery.mode_factors(modes)
    names = token_names(loaded)
    labels = [names[int(t)] for t in inputs.tokens[0]]
    return fs.pattern_pair_plot(pattern0, pattern1, labels, layer, head), fs.modes_plot(modes, factors)


def change(after: float, before: float, edited: bool) -> dict:
    """A metric's delta: none without an edit, grey when the edit changed nothing, else red up."""
    if not edited:
        return dict(delta=None)
    d = after - before
    return dict(delta=f"{d:+.3g}", delta_color="inverse" if d != 0 else "off")


def other_model(names: list[str]) -> str:
    """Model B by default: a run of this model (newest first), else a zoo model of its d_model
    whose heads compare with this model's; this model itself when there is none."""
    runs = [f"run:{r['id']}" for r in ui.saved_runs() if r.get("parent") == loaded.name]
    same = [m["name"] for m in ui.zoo_models() if m["d_model"] == cfg.d_model]
    for name in [*runs, *same]:
        if name in names and name != loaded.name:
            try:
                surgery.check_comparable(loaded, ui.load_model(name))
            except ValueError:
                continue
            return name
    return loaded.name


loaded = ui.setup("Edit and compare")
cfg = loaded.config
edit_tab, compare_tab = st.tabs(["Edit a head", "Compare two models"])
plots = []

with edit_tab:
    st.markdown(
        "Keep, drop or scale the **modes** of a head's $B = U\\,\\mathrm{diag}(\\sigma)\\,V^\\top$ (rotary heads: "
        "its rotation planes). The edit is written into the head's own $W_Q$ "
        "($W_Q' = W_Q + U\\,\\mathrm{diag}((f-1)\\sigma)V^\\top W_K^{+\\top}\\sqrt{d}$), so the heads that share its "
        "key/value head keep theirs; no retraining, one forward on the probes per change."
    )
    choice = pick_probes(loaded, "edit")
    if choice is not None and choice.kind in ("task", "text"):
        samples = 16
        text = choice.text if choice.kind == "text" else None
        inputs = inputs_of(loaded, text, choice.stamp, samples)
        layer, head = ui.layer_head_picker(cfg, st.columns(2))
        modes = modes_of(loaded, layer, head)
        c_rank, c_drop, c_scale = st.columns(3)
        rank = c_rank.slider("Rank R kept", 1, modes.k, modes.k, key=f"edit_rank_{layer}_{head}")
        drop = c_drop.multiselect(
            "Drop modes", range(modes.k), format_func=lambda i: modes.names[i], key=f"edit_drop_{layer}_{head}"
        )
        which = c_scale.selectbox("Scale mode", range(modes.k), format_func=lambda i: modes.names[i])
        factor = c_scale.slider("by", -2.0, 2.0, 1.0, 0.05, key=f"edit_scale_{layer}_{head}_{which}")
        extra = st.session_state.setdefault(EXTRA, {}).get((loaded.name, layer, head), {})
        b_zero, b_mean, b_reset = st.columns(3)
        if b_zero.button("Ablate (zero)", help="W_O of the head set to 0: its output is zero"):
            extra = {"ablate": "zero"}
        can_mean = surgery.has_output_bias(loaded, layer)
        no_mean = f"{loaded.name} has no attention output bias b_O to hold the head's mean output"
        if b_mean.button(
            "Ablate (mean)",
            disabled=not can_mean,
            help="Its output replaced by its mean over the probes (held in the output bias b_O)"
            if can_mean
            else f"Not possible here: {no_mean}",
        ):
            extra = {"ablate": "mean"}
        if not can_mean:
            b_mean.caption(f"Ablate (mean) is off: {ui.plain(no_mean)}; Ablate (zero) works.")
        others = ui.model_names()
        c_src, c_head, c_go = st.columns([3, 2, 2])
        source = c_src.selectbox(
            "Transplant from", others, index=others.index(loaded.name) if loaded.name in others else 0
        )
        src_head = c_head.text_input("its head", f"L{layer}H{head}")
        with_ov = c_head.checkbox("with W_V, W_O")
        if c_go.button("Transplant", help="Copy W_Q, W_K (and W_V, W_O) of that head into this one"):
            extra = {"source": source, "source_head": src_head, "with_ov": with_ov}
        if b_reset.button("Reset ablation / transplant"):
            extra = {}
        st.session_state[EXTRA][(loaded.name, layer, head)] = extra
        try:
            sources, spec = {}, dict(layer=layer, head=head, ablate=extra.get("ablate"))
            if extra.get("source"):
                sources[extra["source"]] = ui.load_model(extra["source"])
                spec.update(
                    source=extra["source"],
                    source_head=surgery.parse_head(
                        extra["source_head"], sources[extra["source"]].config, extra["source"]
                    ),
                    with_ov=extra["with_ov"],
                )
            scale = ((which, float(factor)),) if factor != 1.0 else ()
            edit = surgery.HeadEdit(rank=rank if rank < modes.k else None, drop=tuple(drop), scale=scale, **spec)
            edits = [edit] if (edit.touches_modes or edit.ablate or edit.source) else []
            before, _ = unedited(loaded, text, choice.stamp, samples, layer, head)
            shared = tuple(sources.items())  # the transplant sources, keyed by their weights
            if edits:
                after, _, _ = preview_of(loaded, text, choice.stamp, samples, tuple(edits), layer, head, shared)
            else:
                after = before
        except ValueError as e:
            st.error(ui.plain(e))  # a bad edit (a head the source lacks...) is said; the compare tab still draws
        else:
            if extra:
                st.caption(f"Also applied: {applied(extra)}.")
            m_loss, m_ppl = st.columns(2)
            m_loss.metric(
                "Loss (nats)",
                f"{after['loss']:.4g}",
                **change(after["loss"], before["loss"], bool(edits)),
                help="Mean next-token cross-entropy at the scored positions (a task's answers; every token of a text)",
            )
            m_ppl.metric(
                "Perplexity (every position)",
                f"{after['perplexity']:.4g}",
                **change(after["perplexity"], before["perplexity"], bool(edits)),
                help="exp of the mean next-token loss over every position, the unpredictable tokens of a task's "
                "prompt included (so it stays high on a task model whose scored loss is near zero)",
            )
            st.caption(f"On {ui.plain(inputs.describe())}.")
            pair, mp = edit_figures(loaded, text, choice.stamp, samples, tuple(edits), layer, head, shared)
            ui.show_plot(pair, key="edit_pattern")
            ui.show_plot(mp, key="edit_modes")
            plots += [pair, mp]
            if edits and st.button("Save the edited model as a run", icon=":material/save:"):
                run_id = save_run(loaded, surgery.edit_model(loaded, edits, sources, tokens=inputs.tokens))
                st.success(f"Saved as run:{run_id} (in the model picker and on the Runs page).")


with compare_tab:
    names = ui.model_names()
    other = st.selectbox(
        "Compare with",
        names,
        key=ui.remember("compare_with", other_model(names), names),
        help="Model B: another model or checkpoint of the same d_model (a run and its parent, two seeds...)",
    )
    st.markdown(f"Distance: {surgery.DISTANCE}; blind to how a head factors $B$. Matched pairs are outlined.")
    try:
        result = diff_of(loaded, ui.load_model(other))
    except ValueError as e:
        st.error(ui.plain(e))
        result = None
    if result is not None:
        index = st.selectbox("Layer", range(len(result.layers)), format_func=lambda i: str(result.layers[i].layer))
        ld = result.layers[index]
        dp = diff_figure(loaded, ui.load_model(other), other, index)
        ui.show_plot(dp, key=f"diff_{ld.layer}")
        plots.append(dp)
        pairs = pd.DataFrame(result.to_json()["pairs"])
        shown_pairs = pairs[pairs["layer"] == ld.layer].rename(columns={"head_a": "head of A", "head_b": "head of B"})
        ui.show_table(shown_pairs, hide_index=True)
        if ld.unmatched_a or ld.unmatched_b:
            st.caption(f"Unmatched: A {ld.unmatched_a}, B {ld.unmatched_b}")
        i, j = ld.pairs[
            st.selectbox(
                "Open a matched pair",
                range(len(ld.pairs)),
                format_func=lambda k: f"A H{ld.pairs[k][0]} ↔ B H{ld.pairs[k][1]}",
            )
        ]
        links = []
        for name, h in ((loaded.name, i), (other, j)):
            query = urlencode({"model": name, "layer": ld.layer, "head": h})
            links += [
                f"[{title} of {ui.plain(name)} L{ld.layer}H{h}](/{page(title).url_path}?{query})" for title in VIEWS
            ]
        st.markdown(" · ".join(links))

st.divider()
ui.export_all(plots, {"page": "Edit and compare", "model": loaded.name, "model_key": loaded.key}, key="edit")
