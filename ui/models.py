"""The sidebar's model picker (zoo models, saved runs, uploads), loading a model under the one
caching rule, and the run store panel."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from attn_core import checkpoint, runs, sources, zoo
from attn_core.limits import LimitError
from attn_core.runs import migrate
from attn_core.runs.names import scoped
from attn_core.sources import LoadedModel
from ui.markup import code, plain
from ui.state import MODEL_KEY, remember, to_url
from ui.upload import upload_widget

_ZOO_WARNED = "_zoo_warned"


def data_dir() -> Path:
    """Where the dashboard writes (runs and uploads): $ATTN_LAB_RUNS, else this user's data
    folder (``attn_core.runs.default_root``), the store the CLI uses too; in shared mode the
    logged-in person's own store (``ui.access``)."""
    return runs.default_root()


_IMPORTED = "_store_imported"


def run_store_panel(store: runs.RunStore) -> None:
    """Where the run store is and why; for each ``runs/`` folder of an older release whose runs
    it lacks, an offer to copy them in (``attn_core.runs.migrate``; the old folder is only read)."""
    if scoped():  # shared mode: the person's own store; the machine's folders are not theirs to import
        st.caption(f"Run store: {plain(runs.root_origin())}.")
        return
    st.caption(f"Run store: {code(store.root)} ({plain(runs.root_origin())}); the CLI's `attn-lab runs` reads it too.")
    kind, text = st.session_state.pop(_IMPORTED, (None, ""))
    if kind:
        (st.success if kind == "success" else st.error)(text)
    for old in migrate.legacy_stores(store):
        info, button = st.columns([4, 1], vertical_alignment="center")
        info.info(
            f"{old['runs']} run(s) in {code(old['path'])}, the store an older release used when started from "
            "that folder, are not in this one. Importing copies them (and their sweeps and uploads) here; the old "
            "folder is left as it is.",
            icon=":material/move_to_inbox:",
        )
        button.button(
            "Import them",
            key=f"import_store_{old['path']}",
            on_click=_import_store,
            args=(str(old["path"]), str(store.root)),
            icon=":material/download:",
        )


def _import_store(source: str, root: str) -> None:
    try:
        c = migrate.import_store(source, runs.RunStore(root))
    except (ValueError, OSError) as e:  # RunStoreError included
        st.session_state[_IMPORTED] = ("error", f"Not imported: {plain(e)}")
        return
    st.session_state[_IMPORTED] = (
        "success",
        f"Imported {c['runs']} run(s), {c['sweeps']} sweep(s) and {c['uploads']} upload(s) from {plain(source)}.",
    )


@st.cache_resource(show_spinner="Loading model…", max_entries=16)
def _load_cached(source: str, path: str, mtime: float) -> LoadedModel:
    return sources.resolve(source)


@st.cache_resource
def _load_failures() -> dict:
    """(source, weights path, mtime) -> why it could not be loaded: a broken model is read once per change."""
    return {}


def load_model(source: str) -> LoadedModel:
    """A zoo model, a saved run (``run:<id>``) or an upload (``upload: <name>``), cached across
    reruns, pages and sessions by its source, its weights file and that file's modification time:
    a file written again (a run saved over, a zoo model retrained) is read again, and the same
    ``run:<id>`` in two users' stores (shared mode) is two models. A model that
    cannot be loaded is remembered so too, and refused again without being read."""
    path = sources.weights_path(source)
    if not path.is_file():
        raise checkpoint.CheckpointError(f"{source} has no weights file ({path.name} is missing)")
    key = (source, str(path), path.stat().st_mtime)
    failed = _load_failures().get(key)
    if failed is not None:
        raise checkpoint.CheckpointError(failed)
    try:
        return _load_cached(*key)
    except (ValueError, OSError) as e:
        if not isinstance(e, LimitError):  # the memory free now may differ on the next try
            failures = _load_failures()
            if len(failures) > 256:
                failures.clear()
            failures[key] = str(e)
        raise


def job_source(name: str) -> str:
    """What a retraining job is given for a picker entry: zoo name, run:<id> or a folder."""
    if sources.is_upload(name):
        return str(sources.upload_dir() / name[len(sources.UPLOAD_PREFIX) :])
    return name


def picker_name(source: str) -> str:
    """The picker entry of a job's source (the inverse of :func:`job_source`)."""
    return sources.shown_name(source)


def saved_runs() -> list[dict]:
    """Runs with weights, newest first (the index is small; read on every rerun so a run that
    just finished shows up at once)."""
    try:
        return [r for r in runs.RunStore().list_runs() if r["has_weights"]]
    except (ValueError, OSError) as e:  # an unreadable store must not take the zoo down with it
        st.sidebar.warning(f"The run store in {plain(data_dir())} could not be read: {plain(e)}")
        return []


def zoo_models() -> list[dict]:
    """The zoo's models; folders that cannot be read are skipped and named once per session in
    a sidebar warning (``zoo.list_models`` says why)."""
    problems: list[str] = []
    models = zoo.list_models(problems)
    shown = st.session_state.setdefault(_ZOO_WARNED, set())
    for text in problems:
        if text not in shown:
            shown.add(text)
            st.sidebar.warning(plain(text), icon=":material/folder_off:")
    return models


def model_names(labels: dict[str, str] | None = None) -> list[str]:
    """Every model the picker offers: zoo models, saved runs (``run:<id>``), uploads. ``labels``,
    when given, receives each run's readable label (``runs.run_label``) by its name."""
    names = [m["name"] for m in zoo_models()]
    for r in saved_runs():
        names.append(sources.RUN_PREFIX + r["id"])
        if labels is not None:
            labels[names[-1]] = runs.run_label(r)
    uploads = sources.upload_dir()
    if uploads.is_dir():
        names += [
            sources.UPLOAD_PREFIX + p.name
            for p in sorted(uploads.iterdir())
            if not p.name.startswith(".") and sources.weights_path(sources.UPLOAD_PREFIX + p.name).is_file()
        ]
    return names


def model_picker() -> LoadedModel | None:
    labels: dict[str, str] = {}
    names = model_names(labels)
    if not names:
        st.error("No models found: the zoo in assets/models is empty and nothing was uploaded or trained.")
        st.stop()
    wanted = st.query_params.get("model")
    if MODEL_KEY not in st.session_state and wanted is not None and wanted not in names:
        st.sidebar.warning(
            f"Model {plain(repr(wanted), 80)} from the URL is unknown; showing {plain(repr(names[0]))} instead."
        )
    remember(MODEL_KEY, wanted if wanted in names else names[0], names)
    choice = st.sidebar.selectbox(
        "Model",
        names,
        key=MODEL_KEY,
        format_func=lambda name: labels.get(name, name),  # a run: its parent, regularizers, status and date
        help="Zoo models (assets/models), your saved runs (run:<id> · parent · regularizers · status · date) "
        "and your uploads (upload: …). Every page uses this model.",
    )
    to_url(model=choice)
    upload_widget()
    try:
        loaded = load_model(choice)
    except (checkpoint.CheckpointError, ValueError, KeyError, OSError) as e:
        st.error(f"Model {plain(repr(choice))} could not be loaded: {plain(e)}")
        st.stop()
    _model_caption(loaded)
    return loaded


def _model_caption(m: LoadedModel) -> None:
    c = m.config
    acc = m.card.accuracy
    acc_txt = f", held-out accuracy {acc:.1%}" if acc is not None else ""
    parent = f" Retrained from {plain(sources.shown_name(m.card.parent))}." if m.card.parent else ""
    arch = m.card.details.get("architecture")
    kind = f"{plain(str(arch))} (imported, no task)" if arch else f"task {plain(m.card.task or '?')}"
    extra = ""
    if c.kv_heads < c.n_heads:
        extra += f", {c.kv_heads} key/value heads"
    if c.mla:
        latent = f"query latent {c.q_lora_rank}, " if c.q_lora_rank else ""
        extra += f", latent attention ({latent}key/value latent {c.kv_lora_rank}, rotary part {c.rotary_dims})"
    elif c.positional == "rotary":
        extra += f", rotary on {c.rotary_dims} of {c.d_head} dims (θ = {c.rope_theta:g})"
    st.sidebar.caption(
        f"**{plain(m.name)}**: {kind}, {c.n_layers} layer(s) × {c.n_heads} heads, "
        f"d_model {c.d_model}, d_head {c.d_head}, {c.qk} QK{extra}{acc_txt}.{parent}",
        help=f"Retrained from {m.card.parent}" if m.card.parent else None,  # the path, in the tooltip
    )
