"""Streamlit glue shared by app.py and every page: page setup, the sidebar model picker (zoo
models, saved runs, uploads), widget state that survives page switches and URL parameters,
figures with their downloads, and caching. Everything computational lives in attn_core."""
from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from typing import Any, Callable, Collection, Optional

import streamlit as st

from attn_core.sources import LoadedModel
from attn_core import runs, zoo
from attn_core.card import Card
from attn_core.figures import EXPORT_FORMATS, ExportError, Plot, bundle_zip, export_bytes
from attn_core.model import Transformer

MIME = {"png": "image/png", "svg": "image/svg+xml", "html": "text/html", "csv": "text/csv"}
MODEL_KEY = "model_choice"  # the picker's widget key; kept across pages like every remembered key
_KEPT = "_kept_keys"  # session key: widget keys whose values survive page switches
_UPLOAD_MSG = "_upload_message"
_URL_WARNED = "_url_warned"
UPLOAD_PREFIX = "upload: "
UPLOAD_DIR = "uploads"  # under the data directory (ATTN_LAB_RUNS), never anywhere else


def setup(title: str, needs_model: bool = True) -> Optional[LoadedModel]:
    """Page config, remembered widget state, title and, when the page needs one, the shared
    model picker."""
    st.set_page_config(page_title=f"{title} · attn-lab", page_icon="🔍", layout="wide")
    _keep_widget_state()
    st.title(title)
    return model_picker() if needs_model else None


# --- widget state across pages and URLs --------------------------------------------------------

def _keep_widget_state() -> None:
    # Streamlit forgets the value of a widget that is not drawn on the current page; writing the
    # value back as plain session state keeps it for when the user returns (Streamlit's own recipe).
    for key in st.session_state.get(_KEPT, ()):
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def remember(key: str, default: Any, valid: Optional[Collection] = None, param: Optional[str] = None) -> str:
    """Make ``key`` a widget key whose value survives page switches; returns ``key``.

    The first time (per session) the value comes from the URL parameter ``param`` when it is
    one of ``valid`` (else a warning says what was ignored), otherwise ``default``; a remembered
    value that is no longer valid (another model has fewer heads, say) goes back to ``default``.
    Give the widget no ``value``/``index`` of its own: the session state holds it."""
    st.session_state.setdefault(_KEPT, set()).add(key)
    if key not in st.session_state:
        st.session_state[key] = _from_url(param, default, valid) if param else default
    elif valid is not None and st.session_state[key] not in valid:
        st.session_state[key] = default
    return key


def _from_url(param: str, default: Any, valid: Optional[Collection]) -> Any:
    raw = st.query_params.get(param)
    if raw is None:
        return default
    if valid is None or isinstance(valid, range):  # a number: parse it, then check the range
        try:
            value = type(default)(raw)
            if valid is None or value in valid:
                return value
        except (TypeError, ValueError):
            pass
        allowed = f"{valid.start}..{valid.stop - 1}" if valid is not None else f"a {type(default).__name__}"
    else:
        found = [v for v in valid if str(v) == raw]
        if found:
            return found[0]
        allowed = ", ".join(map(str, list(valid)[:12]))
    warned = st.session_state.setdefault(_URL_WARNED, set())
    if (param, raw) not in warned:
        warned.add((param, raw))
        st.warning(f"URL parameter {param}={raw!r} is not valid (allowed: {allowed}); using {default!r} instead.")
    return default


def to_url(**params: Any) -> None:
    """Write the current choices into the URL, so a copied link opens the same view."""
    for name, value in params.items():
        if st.query_params.get(name) != str(value):
            st.query_params[name] = str(value)


# --- models ------------------------------------------------------------------------------------

def data_dir() -> Path:
    """Where the dashboard writes (runs and uploads): $ATTN_LAB_RUNS or ./runs."""
    return runs.default_root()


def upload_dir() -> Path:
    return data_dir() / UPLOAD_DIR


@st.cache_resource(show_spinner="Loading model…", max_entries=16)
def _load_cached(name: str, stamp: float) -> LoadedModel:
    if runs.is_run_ref(name):
        return runs.load_run_model(name)
    if name.startswith(UPLOAD_PREFIX):
        loaded = zoo.load(upload_dir() / name[len(UPLOAD_PREFIX):])
        loaded.name = name
        return loaded
    return zoo.load(name)


def weights_path(name: str) -> Path:
    """The safetensors file behind a picker entry (its mtime keys the cache)."""
    if runs.is_run_ref(name):
        return runs.RunStore().path(name) / zoo.WEIGHTS
    if name.startswith(UPLOAD_PREFIX):
        return upload_dir() / name[len(UPLOAD_PREFIX):] / zoo.WEIGHTS
    path = zoo.resolve(name)
    return path / zoo.WEIGHTS if path.is_dir() else path


def load_model(name: str) -> LoadedModel:
    """A zoo model, a saved run (``run:<id>``) or an upload (``upload: <name>``), cached across
    reruns, pages and sessions until its weights file changes."""
    path = weights_path(name)
    if not path.is_file():
        raise zoo.CheckpointError(f"{name} has no weights file ({path.name} is missing)")
    return _load_cached(name, path.stat().st_mtime)


def job_source(name: str) -> str:
    """What a retraining job is given for a picker entry: zoo name, run:<id> or a folder."""
    if name.startswith(UPLOAD_PREFIX):
        return str(upload_dir() / name[len(UPLOAD_PREFIX):])
    return name


def picker_name(source: str) -> str:
    """The picker entry of a job's source (the inverse of :func:`job_source`)."""
    path = Path(source)
    if path.is_absolute() and path.parent == upload_dir():
        return UPLOAD_PREFIX + path.name
    return source


def saved_runs() -> list[dict]:
    """Runs with weights, newest first (the index is small; read on every rerun so a run that
    just finished shows up at once)."""
    try:
        return [r for r in runs.RunStore().list_runs() if r["has_weights"]]
    except (ValueError, OSError) as e:  # an unreadable store must not take the zoo down with it
        st.sidebar.warning(f"The run store in {data_dir()} could not be read: {e}")
        return []


def model_names() -> list[str]:
    names = [m["name"] for m in zoo.list_models()]
    names += [runs.RUN_PREFIX + r["id"] for r in saved_runs()]
    if upload_dir().is_dir():
        names += [UPLOAD_PREFIX + p.name for p in sorted(upload_dir().iterdir())
                  if (p / zoo.WEIGHTS).is_file() and not p.name.startswith(".")]
    return names


def model_picker() -> Optional[LoadedModel]:
    names = model_names()
    if not names:
        st.error("No models found: the zoo in assets/models is empty and nothing was uploaded or trained.")
        st.stop()
    wanted = st.query_params.get("model")
    if MODEL_KEY not in st.session_state and wanted is not None and wanted not in names:
        st.sidebar.warning(f"Model {wanted!r} from the URL is unknown; showing {names[0]!r} instead.")
    remember(MODEL_KEY, wanted if wanted in names else names[0], names)
    choice = st.sidebar.selectbox("Model", names, key=MODEL_KEY,
                                  help="Zoo models (assets/models), your saved runs (run:…) and your uploads "
                                       "(upload: …). Every page uses this model.")
    to_url(model=choice)
    _upload_widget()
    try:
        loaded = load_model(choice)
    except (zoo.CheckpointError, ValueError, KeyError, OSError) as e:
        st.error(f"Model {choice!r} could not be loaded: {e}")
        st.stop()
    _model_caption(loaded)
    return loaded


def _model_caption(m: LoadedModel) -> None:
    c = m.config
    acc = m.card.accuracy
    acc_txt = f", held-out accuracy {acc:.1%}" if acc is not None else ""
    parent = f" Retrained from {m.card.parent}." if m.card.parent else ""
    st.sidebar.caption(f"**{m.name}**: task {m.card.task or '?'}, {c.n_layers} layer(s) × {c.n_heads} heads, "
                       f"d_model {c.d_model}, d_head {c.d_head}, {c.qk} QK{acc_txt}.{parent}")


def _upload_widget() -> None:
    with st.sidebar.expander("Upload a model"):
        folder = st.toggle("Whole folder", key="upload_folder",
                           help="Pick a model folder (model.safetensors, config.json, card.json) "
                                "instead of single files.")
        st.file_uploader("Model folder" if folder else "model.safetensors (+ config.json, card.json)",
                         type=["safetensors", "json"], accept_multiple_files="directory" if folder else True,
                         key="upload_files", on_change=_on_upload,
                         help="Validated like the zoo: only safetensors and JSON are read, never pickles. "
                              f"A valid model is kept under {upload_dir()} and appears in the model list.")
        kind, text = st.session_state.get(_UPLOAD_MSG, (None, ""))
        if kind == "error":
            st.error(text)
        elif kind == "success":
            st.success(text)


def _on_upload() -> None:
    # A callback runs before the script, so it may also select the new model in the picker.
    files = st.session_state.get("upload_files") or []
    if not files:
        st.session_state.pop(_UPLOAD_MSG, None)
        return
    try:
        label = save_upload({Path(f.name).name: f.getvalue() for f in files})
    except zoo.CheckpointError as e:
        st.session_state[_UPLOAD_MSG] = ("error", f"Not loaded: {e}")
        return
    st.session_state[MODEL_KEY] = label
    st.session_state[_UPLOAD_MSG] = ("success", f"Loaded and selected “{label}”.")


def save_upload(files: dict[str, bytes]) -> str:
    """Validate uploaded files (``{file name: content}``) as the zoo loader does and keep the
    model under ``<data dir>/uploads/<name>-<hash>/``; returns its picker label.

    The folder name is built from a sanitised file stem and the content hash, never from a
    path the user sent, so nothing can be written outside the data directory; the same upload
    twice lands in the same folder."""
    weights = [n for n in files if n.endswith(".safetensors")]
    unknown = sorted(n for n in files if not n.endswith(".safetensors") and n not in (zoo.CONFIG, zoo.CARD))
    if len(weights) != 1:
        raise zoo.CheckpointError(f"upload exactly one .safetensors file (got {len(weights)}), with its "
                                  "config.json unless the file carries its config")
    if unknown:
        raise zoo.CheckpointError(f"unexpected file {unknown[0]!r}: a model is model.safetensors, "
                                  "config.json and card.json")
    data = files[weights[0]]
    if len(data) > zoo.MAX_WEIGHTS_BYTES:
        raise zoo.CheckpointError(f"{weights[0]} is larger than {zoo.MAX_WEIGHTS_BYTES // 2**20} MiB")
    cfg = zoo.read_config_bytes(files[zoo.CONFIG]) if zoo.CONFIG in files else None
    card = Card.from_dict(zoo.read_json_bytes(files[zoo.CARD])) if zoo.CARD in files else None
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(weights[0]).stem).strip("-")[:40] or "model"
    digest = hashlib.sha1(data + (files.get(zoo.CONFIG) or b"")).hexdigest()[:8]
    loaded = zoo.load_bytes(data, cfg=cfg, card=card, name=stem)
    folder = upload_dir() / f"{stem}-{digest}"
    if not (folder / zoo.WEIGHTS).is_file():
        zoo.save(loaded.model, folder, card=loaded.card, overwrite=True)
    return UPLOAD_PREFIX + folder.name


# --- figures -----------------------------------------------------------------------------------

def show_plot(plot: Plot, key: str, help: Optional[str] = None, downloads: bool = True) -> None:
    """The chart and one download button per format; files are made only when clicked."""
    st.plotly_chart(plot.fig, key=f"chart_{key}", config={"displaylogo": False})
    if not downloads:
        return
    with st.container(horizontal=True, gap="small"):
        for fmt in EXPORT_FORMATS:
            st.download_button(fmt.upper(), data=functools.partial(_export_or_message, plot, fmt),
                               file_name=f"{plot.name}.{fmt}", mime=MIME[fmt], key=f"dl_{key}_{fmt}",
                               on_click="ignore", help=help or _FORMAT_HELP[fmt])


_FORMAT_HELP = {"png": "This figure as a PNG image", "svg": "This figure as an SVG vector image",
                "html": "This figure as an interactive HTML page", "csv": "The data drawn in this figure, as CSV"}


def _export_or_message(plot: Plot, fmt: str) -> bytes:
    try:
        return export_bytes(plot, fmt)
    except ExportError as e:  # no browser: the download carries the reason instead of failing silently
        return f"{e}\n".encode()


def export_all(plots: list[Plot], manifest: dict, key: str) -> None:
    """One zip with every figure of the page in every format and a JSON manifest."""
    st.download_button("Download all figures (zip)", data=functools.partial(bundle_zip, plots, manifest),
                       file_name=f"{key}.zip", mime="application/zip", key=f"zip_{key}", on_click="ignore",
                       icon=":material/download:",
                       help="PNG, SVG, HTML and CSV of every figure on this page, plus manifest.json "
                            "(model, layer/head, settings).")


# --- caching -----------------------------------------------------------------------------------

def _model_hash(m: LoadedModel) -> str:
    return m.key


def cached(fn: Callable) -> Callable:
    """Memoise a pure attn_core call by its arguments; models hash by their weights' key."""
    return st.cache_data(show_spinner=False, max_entries=256,
                         hash_funcs={LoadedModel: _model_hash, Transformer: id})(fn)
