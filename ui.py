"""Streamlit glue shared by app.py and every page: page setup, the sidebar model picker,
figures with their downloads, and caching. Everything computational lives in attn_core."""
from __future__ import annotations

import functools
from typing import Callable, Optional

import streamlit as st

from attn_core import zoo
from attn_core.figures import EXPORT_FORMATS, Plot, bundle_zip, export_bytes
from attn_core.model import Transformer

MIME = {"png": "image/png", "svg": "image/svg+xml", "html": "text/html", "csv": "text/csv"}
_CHOICE = "model_choice"  # session key that survives page switches (widget keys do not)
_UPLOADS = "uploaded_models"
UPLOAD_PREFIX = "upload: "


def setup(title: str, needs_model: bool = True) -> Optional[zoo.LoadedModel]:
    """Page config, title and, when the page needs one, the shared model picker."""
    st.set_page_config(page_title=f"{title} · attn-lab", page_icon="🔍", layout="wide")
    st.title(title)
    return model_picker() if needs_model else None


# --- models ------------------------------------------------------------------------------------

@st.cache_resource(show_spinner="Loading model…", max_entries=16)
def _load_cached(name: str, stamp: float) -> zoo.LoadedModel:
    return zoo.load(name)


def load_model(name: str) -> zoo.LoadedModel:
    """A zoo/user model or a saved run (cached across reruns and pages)."""
    if name.startswith(UPLOAD_PREFIX):
        return st.session_state[_UPLOADS][name]
    path = zoo.resolve(name)
    weights = path / zoo.WEIGHTS if path.is_dir() else path
    return _load_cached(name, weights.stat().st_mtime)


def model_names() -> list[str]:
    names = [m["name"] for m in zoo.list_models()]
    names += list(st.session_state.get(_UPLOADS, {}))
    return names


def model_picker() -> Optional[zoo.LoadedModel]:
    names = model_names()
    if not names:
        st.error("No models found: the zoo in assets/models is empty and no model was uploaded.")
        st.stop()
    wanted = st.query_params.get("model")
    if wanted and wanted not in names and st.session_state.get("_bad_param") != wanted:
        st.session_state["_bad_param"] = wanted
        st.sidebar.warning(f"Model {wanted!r} from the URL is unknown; showing {names[0]!r} instead.")
    current = st.session_state.get(_CHOICE)
    if wanted in names and current is None:
        current = wanted
    if current not in names:
        current = names[0]
    choice = st.sidebar.selectbox("Model", names, index=names.index(current),
                                  help="Zoo models and models you uploaded.")
    st.session_state[_CHOICE] = choice
    if st.query_params.get("model") != choice:
        st.query_params["model"] = choice
    _upload_widget()
    try:
        loaded = load_model(choice)
    except (zoo.CheckpointError, ValueError, KeyError) as e:
        st.error(f"Model {choice!r} could not be loaded: {e}")
        st.stop()
    _model_caption(loaded)
    return loaded


def _model_caption(m: zoo.LoadedModel) -> None:
    c = m.config
    acc = m.card.get("metrics", {}).get("accuracy")
    acc_txt = f", accuracy {acc:.1%}" if isinstance(acc, (int, float)) else ""
    st.sidebar.caption(f"**{m.name}**: task {m.card.get('task', '?')}, {c.n_layers} layer(s) × {c.n_heads} heads, "
                       f"d_model {c.d_model}, d_head {c.d_head}, {c.qk} QK{acc_txt}")


def _upload_widget() -> None:
    with st.sidebar.expander("Upload a model"):
        files = st.file_uploader("model.safetensors (+ optional config.json, card.json)",
                                 type=["safetensors", "json"], accept_multiple_files=True, key="upload_files",
                                 help="Validated like the zoo: only safetensors and JSON are read, never pickles. "
                                      "Kept in memory for this session; nothing is written to disk.")
        if not files:
            return
        weights = [f for f in files if f.name.endswith(".safetensors")]
        configs = {f.name: f for f in files if f.name.endswith(".json")}
        if len(weights) != 1:
            st.error("Upload exactly one .safetensors file (with its config.json unless the file carries it).")
            return
        try:
            cfg = zoo.read_config_bytes(configs["config.json"].getvalue()) if "config.json" in configs else None
            card = zoo.read_json_bytes(configs["card.json"].getvalue()) if "card.json" in configs else None
            loaded = zoo.load_bytes(weights[0].getvalue(), cfg=cfg, card=card, name=weights[0].name.rsplit(".", 1)[0])
        except zoo.CheckpointError as e:
            st.error(f"{weights[0].name} was not loaded: {e}")
            return
        label = UPLOAD_PREFIX + loaded.name
        st.session_state.setdefault(_UPLOADS, {})[label] = loaded
        st.success(f"Loaded {loaded.name}; pick “{label}” in the model list.")


# --- figures -----------------------------------------------------------------------------------

def show_plot(plot: Plot, key: str, help: Optional[str] = None) -> None:
    """The chart and one download button per format; files are made only when clicked."""
    st.plotly_chart(plot.fig, key=f"chart_{key}", config={"displaylogo": False})
    cols = st.columns(len(EXPORT_FORMATS) + 2)
    for col, fmt in zip(cols, EXPORT_FORMATS):
        col.download_button(fmt.upper(), data=functools.partial(_export_or_message, plot, fmt),
                            file_name=f"{plot.name}.{fmt}", mime=MIME[fmt], key=f"dl_{key}_{fmt}",
                            on_click="ignore", help=help or f"Download this figure as {fmt.upper()}")


def _export_or_message(plot: Plot, fmt: str) -> bytes:
    from attn_core.figures import ExportError

    try:
        return export_bytes(plot, fmt)
    except ExportError as e:  # no browser: the download carries the reason instead of failing silently
        return f"{e}\n".encode()


def export_all(plots: list[Plot], manifest: dict, key: str) -> None:
    """One zip with every figure of the page in every format and a JSON manifest."""
    st.download_button("Download all figures (zip)", data=functools.partial(bundle_zip, plots, manifest),
                       file_name=f"{key}.zip", mime="application/zip", key=f"zip_{key}", on_click="ignore",
                       help="PNG, SVG, HTML and CSV of every figure on this page, plus manifest.json "
                            "(model, layer/head, settings).")


# --- caching -----------------------------------------------------------------------------------

def _model_hash(m: zoo.LoadedModel) -> str:
    return m.key


def cached(fn: Callable) -> Callable:
    """Memoise a pure attn_core call by its arguments; models hash by their weights' key."""
    return st.cache_data(show_spinner=False, max_entries=256,
                         hash_funcs={zoo.LoadedModel: _model_hash, Transformer: id})(fn)
