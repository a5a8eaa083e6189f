"""Training dynamics: a run's checkpoints (or several model folders) scrubbed step by step. Every
view of one step (S and A on an input, the spectrum of B, composition between heads, head
detectors) and curves of every metric against the step, the phase change shaded."""

import streamlit as st

import ui
from attn_core import bilinear, circuits
from attn_core import dynamics as D
from attn_core.figures import bilinear as fb
from attn_core.figures import circuits as fc
from attn_core.figures import dynamics as fd
from attn_core.figures.base import export_bytes
from attn_core.figures.layout import HALF_PX

PLAY_S = 1.0  # seconds per step while playing
SOURCES = {"checkpoints": "a run or folder with checkpoints", "folders": "model folders, one per step"}


@ui.cached(resource=True, max_entries=8)
def build_series(names: tuple[str, ...], steps: tuple[int, ...] | None) -> D.Series:
    return D.series(list(names), list(steps) if steps is not None else None)


@ui.cached(resource=True, max_entries=64)
def load_step(names: tuple[str, ...], steps: tuple[int, ...] | None, step: int, member_key: str):
    """One checkpoint as a model, cached by its file (``member_key``: path, size, mtime)."""
    return build_series(names, steps).load(step)


@ui.cached
def metrics_of(names: tuple, steps: tuple | None, series_key: str, samples: int, seed: int) -> D.Dynamics:
    """The metrics of every checkpoint (each one also cached on disk, so a new checkpoint costs
    only itself); ``series_key`` changes when any checkpoint file does."""
    series = build_series(names, steps)
    inputs = D.default_inputs(series, samples=samples, seed=seed)
    bar = st.progress(0.0, text=f"Measuring {len(series.members)} checkpoints…")

    def progress(done: int, total: int) -> None:
        bar.progress(done / total, text=f"Measured {done} of {total} checkpoints")

    dyn = D.dynamics(series, inputs, cache=D.MetricCache(), progress=progress, seed=seed)
    bar.empty()
    return dyn


view_of = ui.cached(bilinear.sequence_view)


@ui.cached
def spectrum_of(loaded, layer: int):
    frame = bilinear.spectrum_frame(loaded.model)
    return frame[frame["layer"] == layer]


@ui.cached
def composition_of(loaded):
    return circuits.composition(loaded.model)


@ui.cached
def detectors_of(loaded, seed: int):
    return bilinear.head_detectors(loaded.model, n_samples=32, seed=seed)


def input_tokens(loaded) -> list[int]:
    """The input of the heatmaps: a held-out sample of the task (random tokens without one)."""
    if loaded.task is not None:
        return bilinear.sample_tokens(loaded, int(seed))
    return bilinear.random_tokens(loaded, int(seed))


ui.setup("Training dynamics", needs_model=False)
st.markdown(
    "How a model got where it is: pick a run trained with checkpoints (`attn-lab retrain … --checkpoint-log 40`, "
    "`attn-lab train --preset … --checkpoint-log 40 --out DIR`) or several model folders, then a head and an input. "
    "The slider scrubs every view to one step; the curves show each metric against the step, the "
    "[phase change](https://transformer-circuits.pub/2022/in-context-learning-and-induction-heads/) shaded."
)

# --- the series -------------------------------------------------------------------------------------
kind = st.radio(
    "Series", list(SOURCES), horizontal=True, format_func=SOURCES.get, key=ui.remember("dyn_kind", "checkpoints")
)
steps_given = None
if kind == "checkpoints":
    problems: list[str] = []
    found = D.available(problems=problems)
    labels = {f["source"]: f["label"] for f in found}
    c_pick, c_path = st.columns([3, 2])
    options = list(labels) + ["(a folder)"]
    picked = c_pick.selectbox(
        "Run or model with checkpoints",
        options,
        format_func=lambda s: labels.get(s, "a folder path →"),
        key=ui.remember("dyn_source", options[0], options),
        help="Runs and models (zoo, $ATTN_LAB_MODELS) whose folder holds checkpoints/",
    )
    path = c_path.text_input("Folder", key=ui.remember("dyn_path", ""), disabled=picked != "(a folder)")
    names = (path.strip(),) if picked == "(a folder)" else (picked,)
    if problems:
        st.caption(f"Left out of the list: {ui.plain('; '.join(problems))}")
    if not names[0]:
        st.info(
            "No run or model with checkpoints yet. Train one with "
            "`attn-lab train --preset induction-2l --checkpoint-log 40 --out my-run` (then give its folder) or "
            "`attn-lab retrain induction-2l --checkpoint-every 20`."
        )
        st.stop()
else:
    text = st.text_area(
        "Model folders, one per line",
        key=ui.remember("dyn_folders", ""),
        help="Folders of one architecture (e.g. local copies of a model's training revisions); the step of each is "
        "the one its name carries (step1000, checkpoint-1000) unless given below",
    )
    raw_steps = st.text_input("Steps (optional, comma-separated, one per folder)", key=ui.remember("dyn_steps", ""))
    names = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not names:
        st.info("Give two or more model folders.")
        st.stop()
    if raw_steps.strip():
        parts = [p.strip() for p in raw_steps.split(",")]
        if not all(p.isdigit() for p in parts):
            st.error("Steps are whole numbers separated by commas.")
            st.stop()
        steps_given = tuple(int(p) for p in parts)
try:
    series = build_series(names, steps_given)
    series_key = series.key  # every checkpoint's file, size and modification time
except (ValueError, OSError) as e:
    st.error(f"This series cannot be read: {ui.plain(e)}")
    st.stop()
cfg = series.config

c_samples, c_seed = st.columns(2)
samples = c_samples.number_input(
    "Held-out sequences", 16, 2048, step=16, key=ui.remember("dyn_samples", 256, range(16, 2049)),
    help="Sequences of the task every checkpoint is measured on (a fixed seed: the same for every step)",
)  # fmt: skip
seed = c_seed.number_input("Seed", 0, 2**31 - 1, key=ui.remember("dyn_seed", 0, range(2**31)))
dyn = metrics_of(names, steps_given, series_key, int(samples), int(seed))
st.caption(
    f"{len(dyn.steps)} checkpoints, steps {dyn.steps[0]}..{dyn.steps[-1]}; {ui.plain(dyn.inputs)}. "
    + (
        f"Phase change at step {dyn.phase_change['step']} (window {dyn.phase_change['window'][0]}"
        f"..{dyn.phase_change['window'][1]}: the steepest fall of the ICL score)."
        if dyn.phase_change
        else "No phase change: the ICL score has no sudden fall after a plateau."
    )
)
if series.partial:
    st.info("These checkpoints keep only attention and LayerNorm weights: the views that need the whole model "
            "(heatmaps on an input, detectors, loss) are not drawn; the spectrum and composition are.")  # fmt: skip


# --- one step, every view ------------------------------------------------------------------------------
playing = st.toggle(
    "▶ Play", key=ui.remember("dyn_play", False), help=f"Step through the checkpoints, one every {PLAY_S:g} s"
)


@st.fragment(run_every=PLAY_S if playing else None)
def step_views() -> None:
    """The slider and every view of its step: a step change or a play tick reruns only this."""
    c_layer, c_head, c_value = st.columns([1, 1, 3])
    layer, head = ui.layer_head_picker(cfg, (c_layer, c_head))
    value = ui.value_choice("Heatmap", "dyn_value", "scores", c_value)
    key = ui.remember("dyn_step", dyn.steps[-1], dyn.steps)
    if playing:  # the next step (the fragment reruns on its own timer while playing)
        i = dyn.steps.index(st.session_state[key])
        st.session_state[key] = dyn.steps[(i + 1) % len(dyn.steps)]
    step = st.select_slider("Step", options=dyn.steps, key=key, help="The training step every view below shows")
    loaded = load_step(names, steps_given, step, series.member(step).key)

    views = []
    if not series.partial:
        tokens = input_tokens(loaded)
        view = view_of(loaded, tokens, layer)
        st.subheader(f"Step {step}: L{layer}H{head} on a held-out input")
        left, right = st.columns(2)
        with left:
            views.append(fb.view_plot(view, head, value=value))
            ui.show_plot(views[-1], key="dyn_heatmap")
        with right:
            other = "pattern" if value == "scores" else "scores"
            views.append(fb.view_plot(view, head, value=other))
            ui.show_plot(views[-1], key="dyn_heatmap_other")
    left, right = st.columns(2)
    with left:
        views.append(fb.spectrum_plot(spectrum_of(loaded, layer)))
        ui.show_plot(views[-1], key="dyn_spectrum")
    with right:
        views.append(fc.composition_plot(composition_of(loaded), width=HALF_PX))  # laid out for its half row
        ui.show_plot(views[-1], key="dyn_composition")
    if not series.partial:
        views.append(fb.heads_plot(detectors_of(loaded, int(seed))))
        ui.show_plot(views[-1], key="dyn_detectors")

    st.subheader("Across training")
    curves = fd.panels(dyn, layer, head, step)
    for i in range(0, len(curves), 2):
        for col, plot in zip(st.columns(2), curves[i : i + 2]):
            with col:
                ui.show_plot(plot, key=plot.name.replace(f"_L{layer}H{head}", ""))
    animation_export(layer, head, value, step)
    ui.export_all(
        views + curves,
        {"page": "Dynamics", "series": list(names), "steps": dyn.steps, "step": step, "layer": layer, "head": head,
         "inputs": dyn.inputs, "phase_change": dyn.phase_change},
        key="dynamics",
    )  # fmt: skip


def animation_export(layer: int, head: int, value: str, step: int) -> None:
    """The animation of the head's heatmap and spectrum across every step, as one HTML file."""
    if series.partial:
        return
    with st.expander("Animation across steps (HTML)"):
        if st.button(
            "Build the animation", key="dyn_build_animation", help="One frame per checkpoint, a slider and play/pause"
        ):
            first = load_step(names, steps_given, dyn.steps[0], series.member(dyn.steps[0]).key)
            tokens = (
                bilinear.sample_tokens(first, int(seed))
                if first.task is not None or series.task
                else bilinear.random_tokens(first, int(seed))
            )
            views, spectra = [], []
            for s in dyn.steps:
                loaded = load_step(names, steps_given, s, series.member(s).key)
                views.append(view_of(loaded, tokens, layer))
                spectra.append(spectrum_of(loaded, layer).query("head == @head"))
            plot = fd.animation_plot(dyn.steps, views, spectra, head, value, start=step)
            st.session_state["dyn_animation"] = (plot.name, export_bytes(plot, "html"))
            ui.show_plot(plot, key="dyn_animation", downloads=False)
        built = st.session_state.get("dyn_animation")
        if built is not None:
            st.download_button("Download the animation (HTML)", built[1], file_name=f"{built[0]}.html",
                               mime="text/html", key="dyn_animation_html", on_click="ignore")  # fmt: skip


step_views()
