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
from attn_core.text import files as text_files
from attn_core.validate import whole_number

PLAY_S = 1.0  # seconds per step while playing
MAX_SKIPPED_SHOWN = 10  # lines, one per checkpoint skipped
MAX_CURVE_STEPS = 500  # steps a curve draws (a series may hold 10,000: drawn at all, a rerun takes seconds)
SOURCES = {"checkpoints": "a run or folder with checkpoints", "folders": "model folders, one per step"}


@ui.cached(resource=True, max_entries=8)
def build_series(names: tuple[str, ...], steps: tuple[int, ...] | None, stamp: tuple) -> D.Series:
    """The series (its members listed anew when ``stamp``, its folders' and index's times, changes)."""
    return D.series(list(names), list(steps) if steps is not None else None)


@ui.cached(resource=True, max_entries=64)
def load_step(names: tuple[str, ...], steps: tuple[int, ...] | None, stamp: tuple, step: int, member_key: str):
    """One checkpoint as a model, cached by its file (``member_key``: path, size, mtime)."""
    return build_series(names, steps, stamp).load(step)


@ui.cached
def metrics_of(
    names: tuple,
    steps: tuple | None,
    stamp: tuple,
    series_key: str,
    samples: int,
    seed: int,
    text: str | None,
    text_key: tuple | None,
) -> D.Dynamics:
    """The metrics of every checkpoint (each one also cached on disk, so a new checkpoint costs
    only itself), on the task's held-out sequences or windows of a text of the data folder;
    ``series_key`` and ``text_key`` change when any checkpoint file or the text does."""
    series = build_series(names, steps, stamp)
    if text is not None:
        inputs = D.series_text_inputs(series, text_files.data_path(text), None, samples)
    else:
        inputs = D.default_inputs(series, samples=samples, seed=seed)
    bar = st.progress(0.0, text=f"Measuring {len(series.members)} checkpoints…")

    def progress(done: int, total: int) -> None:
        bar.progress(done / total, text=f"Measured {done} of {total} checkpoints")

    dyn = D.dynamics(series, inputs, cache=D.MetricCache(), progress=progress, seed=seed)
    bar.empty()
    return dyn


@ui.cached
def has_task(names: tuple, steps: tuple | None, stamp: tuple) -> bool:
    """Whether the series has a task to draw held-out sequences from (else it is measured on a text)."""
    return D.default_inputs(build_series(names, steps, stamp), samples=1) is not None


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
try:
    if kind == "checkpoints":
        problems: list[str] = []
        found = D.available(problems=problems)
        labels = {f["source"]: f["label"] for f in found}
        c_pick, c_path = st.columns([3, 2])
        options = list(labels) + ["(a folder)"]
        picked = c_pick.selectbox(
            "Run, model or folder with checkpoints",
            options,
            format_func=lambda s: labels.get(s, "a folder path →"),
            key=ui.remember("dyn_source", options[0], options),
            help="Runs, models (zoo, $ATTN_LAB_MODELS) whose folder holds checkpoints/, and folders of model folders "
            "named by step (step1000/ ...) or listed in series.json / series.csv ($ATTN_LAB_MODELS, $ATTN_LAB_DATA)",
        )
        path = c_path.text_input(
            "Folder",
            key=ui.remember("dyn_path", ""),
            disabled=picked != "(a folder)",
            help="Inside the run store, the model folders or the data folder; nothing else on the server is read",
        )
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
            help="Folders of one architecture (e.g. local copies of a model's training revisions) in the run store, the "
            "model folders or the data folder; the step of each is the one its name carries (step1000, checkpoint-1000) "
            "unless given below",
        )
        raw_steps = st.text_input("Steps (optional, comma-separated, one per folder)", key=ui.remember("dyn_steps", ""))
        names = tuple(line.strip() for line in text.splitlines() if line.strip())
        if not names:
            st.info("Give two or more model folders.")
            st.stop()
        if raw_steps.strip():
            parts = [whole_number(p.strip(), 15) for p in raw_steps.split(",")]
            if any(p is None for p in parts):
                raise ValueError(f"steps are whole numbers separated by commas, got {raw_steps.strip()[:80]!r}")
            steps_given = tuple(parts)
    names = tuple(D.check_browsable(n) for n in names)  # no path outside the folders the dashboard reads
    stamp = D.stamp(list(names))
    series = build_series(names, steps_given, stamp)
    series_key = series.key  # every checkpoint's file, size and modification time
except (ValueError, OSError) as e:
    st.error(f"This series cannot be read: {ui.plain(e)}")
    st.stop()
cfg = series.config

c_samples, c_seed, c_text = st.columns([1, 1, 2])
try:
    needs_text = not has_task(names, steps_given, stamp)
except (ValueError, OSError) as e:  # no checkpoint can be loaded to ask
    st.error(f"This series cannot be measured: {ui.plain(e)}")
    st.stop()
text_name = None
if needs_text:  # a model without a task (an imported series): windows of a text of the data folder
    texts = [n for n in text_files.data_files() if n.lower().endswith(".txt")]
    text_name = c_text.selectbox(
        "Text",
        texts or ["(none)"],
        key=ui.remember("dyn_text", (texts or ["(none)"])[0], texts or ["(none)"]),
        help="These models have no task: loss and ICL score are measured on windows of this text ($ATTN_LAB_DATA)",
    )
    if not texts:
        text_name = None
        c_text.caption("No .txt file in $ATTN_LAB_DATA: only the weight metrics and detectors are measured.")
samples = c_samples.number_input(
    "Held-out windows" if text_name else "Held-out sequences",
    min_value=16,
    max_value=2048,
    step=16,
    key=ui.remember("dyn_samples", 256, range(16, 2049)),
    help="Sequences of the task (or windows of the text) every checkpoint is measured on (a fixed seed: the same "
    "for every step); the caption below says how many were used",
)
seed = c_seed.number_input("Seed", 0, 2**31 - 1, key=ui.remember("dyn_seed", 0, range(2**31)))
try:
    text_key = D.stamp([str(text_files.data_path(text_name))]) if text_name else None
    dyn = metrics_of(names, steps_given, stamp, series_key, int(samples), int(seed), text_name, text_key)
except (ValueError, OSError) as e:  # no checkpoint measurable, a text that cannot be read or tokenized
    st.error(f"This series cannot be measured: {ui.plain(e)}")
    st.stop()
steps = dyn.steps
st.caption(
    f"{len(steps)} checkpoints, steps {steps[0]}..{steps[-1]}; measured on {ui.plain(dyn.inputs)}. "
    + ui.plain(D.describe_phase(dyn.phase_change)[:1].upper() + D.describe_phase(dyn.phase_change)[1:])
    + "."
)
for s in dyn.skipped[:MAX_SKIPPED_SHOWN]:
    st.warning(f"Skipped {ui.plain(s.line())}", icon=":material/broken_image:")
if len(dyn.skipped) > MAX_SKIPPED_SHOWN:
    st.warning(
        f"… and {len(dyn.skipped) - MAX_SKIPPED_SHOWN} more checkpoints skipped (`attn-lab dynamics --json` lists them)."
    )
if series.partial:
    st.info(
        "These checkpoints keep only attention and LayerNorm weights: the views that need the whole model "
        "(heatmaps on an input, detectors, loss) are not drawn; the spectrum and composition are."
    )


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
    loaded = loaded_step(step)
    views = []
    if loaded is None:
        pass  # said in one line: the curves below are still drawn
    elif not series.partial:
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
    if loaded is not None:
        left, right = st.columns(2)
        with left:
            views.append(fb.spectrum_plot(spectrum_of(loaded, layer)))
            ui.show_plot(views[-1], key="dyn_spectrum")
        with right:
            views.append(fc.composition_plot(composition_of(loaded), width=HALF_PX))  # laid out for its half row
            ui.show_plot(views[-1], key="dyn_composition")
    if loaded is not None and not series.partial:
        views.append(fb.heads_plot(detectors_of(loaded, int(seed))))
        ui.show_plot(views[-1], key="dyn_detectors")

    st.subheader("Across training")
    shown = dyn.thinned(MAX_CURVE_STEPS)  # a long series: its curves drawn at evenly spaced steps
    if len(shown.steps) < len(dyn.steps):
        st.caption(
            f"The curves show {len(shown.steps):,} of the {len(dyn.steps):,} steps, evenly spaced; the slider has all."
        )
    curves = fd.panels(shown, layer, head, step)
    for i in range(0, len(curves), 2):
        for col, plot in zip(st.columns(2), curves[i : i + 2]):
            with col:
                ui.show_plot(plot, key=plot.name.replace(f"_L{layer}H{head}", ""))
    animation_export(layer, head, value, step)
    ui.export_all(
        views + curves,
        {
            "page": "Dynamics",
            "series": list(names),
            "steps": dyn.steps,
            "step": step,
            "layer": layer,
            "head": head,
            "inputs": dyn.inputs,
            "phase_change": dyn.phase_change,
        },
        key="dynamics",
    )


def loaded_step(step: int, quiet: bool = False):
    """The checkpoint of ``step`` as a model; None (said in one line unless ``quiet``) when it cannot
    be read now (damaged or removed since its metrics were read from the cache)."""
    try:
        return load_step(names, steps_given, stamp, step, series.member(step).key)
    except (ValueError, OSError) as e:
        if not quiet:
            st.warning(f"Step {step} cannot be read: {ui.plain(e)}", icon=":material/broken_image:")
        return None


def animation_export(layer: int, head: int, value: str, step: int) -> None:
    """The animation of the head's heatmap and spectrum across every step, as one HTML file."""
    if series.partial:
        return
    with st.expander("Animation across steps (HTML)"):
        if st.button(
            "Build the animation", key="dyn_build_animation", help="One frame per checkpoint, a slider and play/pause"
        ):
            found = {s: m for s in dyn.steps if (m := loaded_step(s, quiet=True)) is not None}
            if not found:
                st.warning("No checkpoint can be read now: there is nothing to animate.")
                return
            first = next(iter(found.values()))
            tokens = (
                bilinear.sample_tokens(first, int(seed))
                if first.task is not None or series.task
                else bilinear.random_tokens(first, int(seed))
            )
            views = [view_of(m, tokens, layer) for m in found.values()]
            spectra = [frame[frame["head"] == head] for frame in (spectrum_of(m, layer) for m in found.values())]
            shown = list(found)
            plot = fd.animation_plot(shown, views, spectra, head, value, start=step if step in found else shown[-1])
            st.session_state["dyn_animation"] = (plot.name, export_bytes(plot, "html"))
            ui.show_plot(plot, key="dyn_animation", downloads=False)
        built = st.session_state.get("dyn_animation")
        if built is not None:
            st.download_button(
                "Download the animation (HTML)",
                built[1],
                file_name=f"{built[0]}.html",
                mime="text/html",
                key="dyn_animation_html",
                on_click="ignore",
            )


step_views()
