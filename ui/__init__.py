"""Streamlit glue shared by every page (docs/architecture.md, "The dashboard"): pages call
``ui.<name>``; each name lives in one small module of this package:

- ``page``: ``setup`` (page config, remembered state, title, the model picker);
- ``state``: widget state across pages and URLs (``remember``, ``to_url``, ``follow_input``) and
  the shared widget keys;
- ``models``: the sidebar's model picker, ``load_model`` (the one caching rule for models), the
  run store panel; ``upload``: the sidebar's "Upload a model";
- ``pickers``: the layer/head picker, the scores-or-pattern choice, the "needs a task" guard;
- ``plots``: a chart with its downloads, a table's CSV, one zip of a page's figures;
- ``cache``: ``cached``, the one caching rule for what is computed from a model;
- ``markup``: untrusted text made inert for markdown;
- ``widgets``: number inputs whose bounds are written once (``number``), a declared setting's input
  from its declaration in JobConfig, GrowConfig or CompareConfig (``setting_input``);
- the parts one page uses: ``heatmap_input``, ``heatmap_sections`` (Heatmaps), ``retrain_text``
  (the Retrain page's Text section) and ``retrain_live`` (its live charts).

Everything computational lives in attn_core."""

from ui.cache import cached
from ui.markup import code, plain
from ui.models import (
    data_dir,
    job_source,
    load_model,
    model_names,
    model_picker,
    picker_name,
    run_store_panel,
    saved_runs,
    zoo_models,
)
from ui.page import setup
from ui.pickers import head_name, layer_head_picker, reproduce_command, require_task, value_choice
from ui.plots import MIME, download_table, export_all, show_plot, show_table
from ui.state import ALL_HEADS, HEAD_KEY, LAYER_KEY, MODEL_KEY, follow_input, remember, to_url
from ui.upload import save_upload, upload_digest
from ui.widgets import number, setting_input

__all__ = [
    "ALL_HEADS",
    "HEAD_KEY",
    "LAYER_KEY",
    "MIME",
    "MODEL_KEY",
    "cached",
    "code",
    "data_dir",
    "download_table",
    "export_all",
    "follow_input",
    "head_name",
    "job_source",
    "layer_head_picker",
    "load_model",
    "model_names",
    "model_picker",
    "number",
    "picker_name",
    "plain",
    "remember",
    "reproduce_command",
    "require_task",
    "run_store_panel",
    "save_upload",
    "saved_runs",
    "setting_input",
    "setup",
    "show_plot",
    "show_table",
    "to_url",
    "upload_digest",
    "value_choice",
    "zoo_models",
]
