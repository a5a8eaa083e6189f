"""Streamlit glue shared by every page: page setup, the sidebar model picker (zoo models, saved
runs, uploads), the layer/head picker, the "needs a task" guard, widget state that survives page
switches and URL parameters, figures with their downloads, and the one caching rule (see
docs/architecture.md). Everything computational lives in attn_core."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import streamlit as st

from attn_core import checkpoint, runs, sources, zoo
from attn_core.card import Card
from attn_core.figures import EXPORT_FORMATS, ExportError, Plot, bundle_zip, export_bytes
from attn_core.figures.bilinear import VALUE_LABELS
from attn_core.limits import LimitError
from attn_core.model import ModelConfig
from attn_core.runs import migrate
from attn_core.sources import LoadedModel
from attn_core.tasks import Task

MIME = {"png": "image/png", "svg": "image/svg+xml", "html": "text/html", "csv": "text/csv"}
MODEL_KEY = "model_choice"  # the picker's widget key; kept across pages like every remembered key
LAYER_KEY, HEAD_KEY = "layer", "head"  # the layer/head picker's widget keys, shared by every page
ALL_HEADS = "all"  # the head picker's extra choice on pages that can draw every head of a layer
_KEPT = "_kept_keys"  # session key: widget keys whose values survive page switches
_PAGE = "_kept_page"  # session key: the page of the last run (its title)
_UPLOAD_MSG = "_upload_message"
_URL_WARNED = "_url_warned"
_ZOO_WARNED = "_zoo_warned"


def setup(title: str, needs_model: bool = True) -> LoadedModel | None:
    """Page config, remembered widget state, title and, when the page needs one, the shared
    model picker."""
    st.set_page_config(page_title=f"{title} · attn-lab", page_icon="🔍", layout="wide")
    _keep_widget_state(title)
    st.title(title)
    return model_picker() if needs_model else None


# --- widget state across pages and URLs --------------------------------------------------------


def _keep_widget_state(page: str) -> None:
    # Streamlit forgets the value of a widget that is not drawn on the current page; writing the
    # value back as plain session state keeps it for when the user returns (Streamlit's own
    # recipe). Only on a page switch: a value written back is also sent to the browser at the end
    # of the run, over any press made meanwhile, so writing on every rerun lost quick arrow
    # presses on a slider (tests/e2e/test_state_browser.py).
    if st.session_state.get(_PAGE) == page:
        return
    st.session_state[_PAGE] = page
    for key in st.session_state.get(_KEPT, ()):
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def remember(key: str, default: Any, valid: Collection | None = None, param: str | None = None) -> str:
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


def _from_url(param: str, default: Any, valid: Collection | None) -> Any:
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
        st.warning(
            f"URL parameter {param}={plain(repr(raw), 80)} is not valid (allowed: {plain(allowed)}); "
            f"using {plain(repr(default))} instead."
        )
    return default


def to_url(**params: Any) -> None:
    """Write the current choices into the URL, so a copied link opens the same view; a parameter
    given as None is removed (a choice that does not apply to this view, e.g. ``length`` of a
    typed input). Only changed parameters are written: each write is a browser history step."""
    for name, value in params.items():
        if value is None:
            if name in st.query_params:
                del st.query_params[name]
        elif st.query_params.get(name) != str(value):
            st.query_params[name] = str(value)


_INPUTS = "_inputs_seen"


def follow_input(key: str, current: Any, value: Any) -> None:
    """Set the remembered widget ``key`` to ``value`` when ``current`` (what the page's input is
    made of: model, source, tokens) differs from the last run's, so that a new input resets a
    choice that belongs to it (the Heatmaps query moves to the new last token). A page switch, a
    head change or the first run (a URL's choice) leave it alone."""
    digest = hashlib.sha256(repr(current).encode()).hexdigest()
    seen = st.session_state.setdefault(_INPUTS, {})
    if seen.get(key) not in (None, digest):
        st.session_state[key] = value
    seen[key] = digest


# --- models ------------------------------------------------------------------------------------


def data_dir() -> Path:
    """Where the dashboard writes (runs and uploads): $ATTN_LAB_RUNS, else this user's data
    folder (``attn_core.runs.default_root``), the store the CLI uses too."""
    return runs.default_root()


_IMPORTED = "_store_imported"


def run_store_panel(store: runs.RunStore) -> None:
    """Where the run store is and why; for each ``runs/`` folder of an older release whose runs
    it lacks, an offer to copy them in (``attn_core.runs.migrate``; the old folder is only read)."""
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
def _load_cached(source: str, mtime: float) -> LoadedModel:
    return sources.resolve(source)


@st.cache_resource
def _load_failures() -> dict:
    """(source, mtime) -> why it could not be loaded: a broken model is read once per change."""
    return {}


def load_model(source: str) -> LoadedModel:
    """A zoo model, a saved run (``run:<id>``) or an upload (``upload: <name>``), cached across
    reruns, pages and sessions by its source and the modification time of its weights file: a
    file written again (a run saved over, a zoo model retrained) is read again. A model that
    cannot be loaded is remembered so too, and refused again without being read."""
    path = sources.weights_path(source)
    if not path.is_file():
        raise checkpoint.CheckpointError(f"{source} has no weights file ({path.name} is missing)")
    key = (source, path.stat().st_mtime)
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
    path = Path(source)
    if path.is_absolute() and path.parent == sources.upload_dir():
        return sources.UPLOAD_PREFIX + path.name
    return source


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


def model_names() -> list[str]:
    names = [m["name"] for m in zoo_models()]
    names += [sources.RUN_PREFIX + r["id"] for r in saved_runs()]
    uploads = sources.upload_dir()
    if uploads.is_dir():
        names += [
            sources.UPLOAD_PREFIX + p.name
            for p in sorted(uploads.iterdir())
            if (p / checkpoint.WEIGHTS).is_file() and not p.name.startswith(".")
        ]
    return names


def model_picker() -> LoadedModel | None:
    names = model_names()
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
        help="Zoo models (assets/models), your saved runs (run:…) and your uploads "
        "(upload: …). Every page uses this model.",
    )
    to_url(model=choice)
    _upload_widget()
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
    parent = f" Retrained from {plain(m.card.parent)}." if m.card.parent else ""
    arch = m.card.details.get("architecture")
    kind = f"{plain(str(arch))} (imported, no task)" if arch else f"task {plain(m.card.task or '?')}"
    extra = ""
    if c.kv_heads < c.n_heads:
        extra += f", {c.kv_heads} key/value heads"
    if c.positional == "rotary":
        extra += f", rotary on {c.rotary_dims} of {c.d_head} dims (θ = {c.rope_theta:g})"
    st.sidebar.caption(
        f"**{plain(m.name)}**: {kind}, {c.n_layers} layer(s) × {c.n_heads} heads, "
        f"d_model {c.d_model}, d_head {c.d_head}, {c.qk} QK{extra}{acc_txt}.{parent}"
    )


# what makes markdown out of text: emphasis, code, links and images ([...]), HTML, headings, LaTeX
_MARKDOWN = re.compile(r"([\\`*_\[\]<>#$~])")


def plain(text: object, limit: int = 500) -> str:
    """Card text (names, descriptions, a parent) made inert for Streamlit markdown: the markup
    characters escaped, one line, at most ``limit`` characters. A card is untrusted:
    shown as markdown, ``![x](http://...)`` would load a remote image in the viewer's browser."""
    line = " ".join(str(text).split())
    if len(line) > limit:
        line = line[:limit] + "…"
    return _MARKDOWN.sub(r"\\\1", line)


def code(text: object) -> str:
    """A path or name as inline code (shown literally; a backtick in it cannot end the span)."""
    return "`" + " ".join(str(text).split()).replace("`", "'") + "`"


def value_choice(label: str, key: str, default: str, where: Any = st) -> str:
    """The scores-or-pattern radio of a heatmap (``figures.bilinear.VALUES``), remembered under ``key``."""
    values = list(VALUE_LABELS)
    return where.radio(label, values, horizontal=True, key=remember(key, default, values), format_func=VALUE_LABELS.get)


def layer_head_picker(
    config: ModelConfig,
    where: Sequence | None = None,
    *,
    all_heads: bool = False,
    disabled: bool = False,
    url: bool = True,
    head_help: str = "",
) -> tuple[int, int | str]:
    """The layer and head selectboxes of every page that looks at one head; returns (layer, head).

    Their keys are the same on every page, so a choice follows the user from page to page (and
    falls back to 0 on a model with fewer layers or heads); with ``url`` the first choice comes
    from the URL parameters ``layer`` and ``head``. ``where``: the two containers to draw them in
    (columns, a form's columns; default: the page). ``all_heads`` adds :data:`ALL_HEADS`, drawn
    as "all (grid)"; ``head_help`` is added to the head's tooltip."""
    layer_at, head_at = where if where is not None else (st, st)
    layers = range(config.n_layers)
    heads = [*range(config.n_heads), *([ALL_HEADS] if all_heads else [])]
    layer = layer_at.selectbox(
        "Layer",
        layers,
        disabled=disabled,
        key=remember(LAYER_KEY, 0, layers, param="layer" if url else None),
        help=f"Layer l, 0..{config.n_layers - 1}",
    )
    grid = ", or a grid of every head of the layer" if all_heads else ""
    head = head_at.selectbox(
        "Head",
        heads,
        disabled=disabled,
        key=remember(HEAD_KEY, 0, heads, param="head" if url else None),
        format_func=lambda h: "all (grid)" if h == ALL_HEADS else head_name(config, h),
        help=f"Head h, 0..{config.n_heads - 1}{grid}{head_help}"
        + (
            f". Grouped-query attention: {config.n_heads // config.kv_heads} query heads share each of "
            f"the {config.kv_heads} key/value heads (kv g)"
            if config.kv_heads < config.n_heads
            else ""
        ),
    )
    return layer, head


def head_name(config: ModelConfig, head: int) -> str:
    """A query head's label in pickers: "3", or "3 (kv 1)" with grouped-query attention."""
    return f"{head} (kv {config.kv_head(head)})" if config.kv_heads < config.n_heads else str(head)


def reproduce_command(card: Card) -> str | None:
    """The command that retrains a zoo model from its preset, as a user can run it anywhere (the
    card's own ``command`` wrote into assets/models/, which exists): trains the recipe and seed
    again and prints the held-out accuracy; ``--out`` with a new folder keeps the weights. None
    when the card names no known preset."""
    from attn_core.presets import PRESETS

    if card.preset not in PRESETS:
        return None
    return f"attn-lab train --preset {card.preset}  # add --out NEW_FOLDER to keep the weights"


def require_task(loaded: LoadedModel, why: str) -> Task:
    """The guard of a page that needs the model's task (its data, its loss): without one the page
    says "<model> has no known task in its card, so <why>." and stops there."""
    if loaded.task is None:
        st.warning(f"{plain(loaded.name)} has no known task in its card, so {why}.")
        st.stop()
    return loaded.task


def _upload_widget() -> None:
    with st.sidebar.expander("Upload a model"):
        folder = st.toggle(
            "Whole folder",
            key="upload_folder",
            help="Pick a model folder (model.safetensors, config.json, card.json) instead of single files.",
        )
        st.file_uploader(
            "Model folder" if folder else "model.safetensors (+ config.json, card.json)",
            type=["safetensors", "json"],
            accept_multiple_files="directory" if folder else True,
            key="upload_files",
            on_change=_on_upload,
            help="Validated like the zoo: only safetensors and JSON are read, never pickles. "
            f"A valid model is kept under {sources.upload_dir()} and appears in the model list.",
        )
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
    except (ValueError, OSError) as e:  # CheckpointError and LimitError included: one message, never a traceback
        st.session_state[_UPLOAD_MSG] = ("error", f"Not loaded: {plain(e)}")
        return
    st.session_state[MODEL_KEY] = label
    st.session_state[_UPLOAD_MSG] = ("success", f"Loaded and selected “{label}”.")


def save_upload(files: dict[str, bytes]) -> str:
    """Validate uploaded files (``{file name: content}``) as the zoo loader does and keep the
    model under ``<data dir>/uploads/<name>-<hash>/``; returns its picker label.

    The folder name is built from a sanitised file stem and a hash of every uploaded byte
    (weights, config and card), never from a path the user sent, so nothing can be written
    outside the data directory. The same upload twice lands in the same folder; an existing
    folder is reused only when it holds the same model and card, and nothing is overwritten."""
    weights = [n for n in files if n.endswith(".safetensors")]
    unknown = sorted(
        n for n in files if not n.endswith(".safetensors") and n not in (checkpoint.CONFIG, checkpoint.CARD)
    )
    if len(weights) != 1:
        raise checkpoint.CheckpointError(
            f"upload exactly one .safetensors file (got {len(weights)}), with its "
            "config.json unless the file carries its config"
        )
    if unknown:
        raise checkpoint.CheckpointError(
            f"unexpected file {unknown[0]!r}: a model is model.safetensors, config.json and card.json"
        )
    data = files[weights[0]]
    if len(data) > checkpoint.MAX_WEIGHTS_BYTES:
        raise checkpoint.CheckpointError(f"{weights[0]} is larger than {checkpoint.MAX_WEIGHTS_BYTES // 2**20} MiB")
    cfg = checkpoint.read_config_bytes(files[checkpoint.CONFIG]) if checkpoint.CONFIG in files else None
    card = checkpoint.read_card_bytes(files[checkpoint.CARD]) if checkpoint.CARD in files else None
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", Path(weights[0]).stem).strip("-")[:40] or "model"
    loaded = checkpoint.load_bytes(data, cfg=cfg, card=card, name=stem)
    if loaded.card.vocab_file is not None:  # an upload is three files: a vocabulary would be read from elsewhere
        raise checkpoint.CheckpointError(
            f"the card names a vocabulary file ({plain(loaded.card.vocab_file, 80)}), which an upload cannot "
            "carry; remove vocab_file from card.json"
        )
    digest = upload_digest(data, files.get(checkpoint.CONFIG), files.get(checkpoint.CARD))
    for attempt in range(100):  # a different model under the same name: the next free name, never overwrite
        folder = sources.upload_dir() / (f"{stem}-{digest}" + (f"-{attempt + 1}" if attempt else ""))
        if folder.exists():
            if _same_upload(folder, loaded):
                return sources.UPLOAD_PREFIX + folder.name
            continue
        try:
            checkpoint.save(loaded.model, folder, card=loaded.card)
        except checkpoint.CheckpointError:
            if folder.exists():  # another session saved it first: compare on the next pass
                continue
            raise
        return sources.UPLOAD_PREFIX + folder.name
    raise checkpoint.CheckpointError(f"too many different uploads named {stem}-{digest}; rename the file")


def upload_digest(*parts: bytes | None) -> str:
    """The name-part of an upload folder: a hash of ALL its bytes (weights, config and card),
    each part length-prefixed so that moving bytes between parts changes the hash."""
    h = hashlib.sha256()
    for part in parts:
        part = part or b""
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()[:12]


def _card_text(card: Card) -> str:
    return json.dumps(card.to_dict(), sort_keys=True, default=str)  # NaN == NaN here, unlike in a dict


def _same_upload(folder: Path, loaded: LoadedModel) -> bool:
    """Whether the upload kept in ``folder`` is ``loaded``: the same config, card and weights."""
    try:
        kept = sources.resolve(sources.UPLOAD_PREFIX + folder.name)
    except (checkpoint.CheckpointError, OSError):
        return False
    if kept.config != loaded.config or _card_text(kept.card) != _card_text(loaded.card):
        return False
    mine, theirs = loaded.model.state_dict(), kept.model.state_dict()
    return mine.keys() == theirs.keys() and all(mine[k].equal(theirs[k]) for k in mine)


# --- figures -----------------------------------------------------------------------------------


def download_table(frame: Any, file_stem: str, key: str, help: str) -> None:
    """A "Table as CSV" button for a table the page shows (made only when clicked)."""
    st.download_button(
        "Table as CSV",
        functools.partial(frame.to_csv, index=False),
        file_name=f"{file_stem}.csv",
        mime=MIME["csv"],
        key=key,
        on_click="ignore",
        help=help,
    )


def show_plot(plot: Plot, key: str, help: str | None = None, downloads: bool = True) -> None:
    """The chart and, under it, a Download menu with one button per format; files are made only
    when clicked. The menu's buttons are drawn only when it is opened, so a rerun that redraws
    the page's charts does not also redraw four buttons per chart."""
    st.plotly_chart(plot.fig, key=f"chart_{key}", config={"displaylogo": False})
    if not downloads:
        return
    menu = st.popover("Download", icon=":material/download:", help=f"{plot.name}: PNG, SVG, HTML or CSV")
    with menu, st.container(horizontal=True, gap="small"):
        for fmt in EXPORT_FORMATS:
            st.download_button(
                fmt.upper(),
                data=functools.partial(_export_or_message, plot, fmt),
                file_name=f"{plot.name}.{fmt}",
                mime=MIME[fmt],
                key=f"dl_{key}_{fmt}",
                on_click="ignore",
                help=help or _FORMAT_HELP[fmt],
            )


_FORMAT_HELP = {
    "png": "This figure as a PNG image",
    "svg": "This figure as an SVG vector image",
    "html": "This figure as an interactive HTML page",
    "csv": "The data drawn in this figure, as CSV",
}


def _export_or_message(plot: Plot, fmt: str) -> bytes:
    try:
        return export_bytes(plot, fmt)
    except ExportError as e:  # no browser: the download carries the reason instead of failing silently
        return f"{e}\n".encode()


def export_all(plots: list[Plot], manifest: dict, key: str) -> None:
    """One zip with every figure of the page in every format and a JSON manifest."""
    st.download_button(
        "Download all figures (zip)",
        data=functools.partial(bundle_zip, plots, manifest),
        file_name=f"{key}.zip",
        mime="application/zip",
        key=f"zip_{key}",
        on_click="ignore",
        icon=":material/download:",
        help="PNG, SVG, HTML and CSV of every figure on this page, plus manifest.json (model, layer/head, "
        "settings). The HTML files share one plotly.min.js in the zip: unpack them together.",
    )


# --- caching -----------------------------------------------------------------------------------
# One rule (docs/architecture.md): a model is cached by its source and its weights file's
# modification time (load_model above); anything computed from a model by its plain inputs, the
# model counting by its weights key, never by object identity (an id() is reused once the
# object is garbage collected).


def _is_model(value: Any) -> bool:
    # Duck-typed: after Streamlit reloads attn_core, models are instances of a new LoadedModel class.
    return hasattr(value, "key") and hasattr(value, "model") and hasattr(value, "config")


def _plain(value: Any) -> Any:
    """What a cached call is keyed by in place of ``value``: a model's weights key."""
    if _is_model(value):
        if not value.key:
            raise TypeError(f"model {value.name!r} has no weights key, so results computed from it cannot be cached")
        return ("model", value.key)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if hasattr(value, "state_dict"):
        raise TypeError(
            f"cache by plain inputs: pass the LoadedModel (keyed by its weights), not a bare {type(value).__name__}"
        )
    return value


# Pages run top to bottom on every rerun, so ``ui.cached(f)`` is called again each time; Streamlit
# reads f's source to name its cache, so the wrappers are made once per function and kept here.
_WRAPPERS: dict[tuple, Callable] = {}


def cached(fn: Callable | None = None, *, resource: bool = False, max_entries: int = 256) -> Callable:
    """Memoise a pure attn_core call by its plain inputs (numbers, strings, tokens, settings; a
    model by its weights key). The result is copied to each caller, or with ``resource=True``
    shared as is (for results that hold models, which do not pickle: nothing may mutate them)."""
    if fn is None:
        return functools.partial(cached, resource=resource, max_entries=max_entries)
    code = fn.__code__
    ident = (fn.__module__, fn.__qualname__, code.co_filename, code.co_code, resource, max_entries)
    current = [fn]  # a page's function is a new object each rerun: the wrapper calls the latest
    if ident in _WRAPPERS:
        _WRAPPERS[ident].current[0] = fn
        return _WRAPPERS[ident]

    def call(inputs, _args, _kwargs):  # keyed by ``inputs`` only: Streamlit skips _-named arguments
        return current[0](*_args, **_kwargs)

    # Streamlit names a cache by the module, qualified name and source of its function: those of fn.
    functools.update_wrapper(call, fn)
    memo = (st.cache_resource if resource else st.cache_data)(show_spinner=False, max_entries=max_entries)(call)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        inputs = (_plain(args), {k: _plain(v) for k, v in sorted(kwargs.items())})
        return memo(inputs=inputs, _args=args, _kwargs=kwargs)  # by name: fn's signature is not call's

    wrapper.clear = memo.clear
    wrapper.current = current
    _WRAPPERS[ident] = wrapper
    return wrapper
