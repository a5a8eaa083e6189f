"""The dashboard shell: the router's navigation (labels, URLs, files), the one layer/head picker,
the one "needs a task" guard and the one caching rule (models by source and weights mtime,
computed results by plain inputs)."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import streamlit
import torch
from streamlit.testing.v1 import AppTest

import navigation
import ui
from attn_core import checkpoint, sources

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
LABELS = [
    "Home",
    "Heatmaps",
    "Spectrum",
    "Retrain",
    "Runs",
    "Grow d_k",
    "Kernelized attention",
    "Attention explorer",
    "Merged vs factored QK",
    "Circuits",
    "Sweeps",
    "Dynamics",
    "Edit and compare",
]
URLS = [
    "",
    "Heatmaps",
    "Spectrum",
    "Retrain",
    "Runs",
    "Grow_d_k",
    "Kernelized_attention",
    "Attention_explorer",
    "Merged_vs_factored_QK",
    "Circuits",
    "Sweeps",
    "Dynamics",
    "Edit_and_compare",
]  # the URLs the legacy pages/ discovery gave: old links keep working


# --- navigation ------------------------------------------------------------------------------------


def test_the_router_reads_home_to_merged_vs_factored_qk(monkeypatch):
    shown = []
    real = streamlit.navigation

    def recording(pages, **kwargs):
        shown.append(pages)
        return real(pages, **kwargs)

    monkeypatch.setattr(streamlit, "navigation", recording)
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    pages = shown[-1]
    assert [p.title for p in pages] == LABELS
    assert [p.url_path for p in pages] == URLS  # "": the default page, at the root URL
    assert at.title[0].value == "attn-lab"  # the home page's own content, through the router


def test_the_page_table_names_existing_files_once():
    assert [p.title for p in navigation.PAGES] == LABELS
    files = [p.file for p in navigation.PAGES]
    assert len(set(files)) == len(files) and all((ROOT / f).is_file() for f in files)
    assert sorted(files) == sorted(f"app_pages/{p.name}" for p in (ROOT / "app_pages").glob("*.py"))  # none left out
    assert navigation.page("Grow d_k").url_path == "Grow_d_k"
    with pytest.raises(KeyError, match="Grow d_k"):
        navigation.page("Grow d k")


def test_the_home_page_links_every_other_page():
    at = AppTest.from_file(APP, default_timeout=60).run()
    links = at.get("page_link")
    assert sorted(link.proto.label for link in links) == sorted(p.blurb for p in navigation.PAGES[1:])  # 3 columns


def test_every_page_is_reached_through_the_router():
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["model"] = "reverse-1l"
    at.run()
    at.switch_page("app_pages/7_Attention_explorer.py").run()
    assert not at.exception and at.title[0].value == "Attention explorer"
    at.switch_page("app_pages/0_Home.py").run()
    assert not at.exception and at.title[0].value == "attn-lab"


# --- the layer/head picker -----------------------------------------------------------------------------


def _picker_script():
    import streamlit as st

    import ui
    from attn_core.model import ModelConfig

    ui.setup("picker", needs_model=False)
    heads = st.session_state.get("n_heads", 4)
    cfg = ModelConfig(n_layers=2, n_heads=heads)
    left, right = st.columns(2)
    layer, head = ui.layer_head_picker(
        cfg,
        (left, right),
        all_heads=st.session_state.get("all_heads", False),
        url=st.session_state.get("url", True),
        head_help=": a note",
    )
    st.write(f"layer={layer} head={head}")


def picker(params=None, **state) -> AppTest:
    at = AppTest.from_function(_picker_script, default_timeout=30)
    for k, v in state.items():
        at.session_state[k] = v
    at.query_params.update(params or {})
    return at.run()


def test_the_picker_offers_the_models_layers_and_heads():
    at = picker()
    assert not at.exception
    assert at.selectbox(key=ui.LAYER_KEY).options == ["0", "1"]
    assert at.selectbox(key=ui.HEAD_KEY).options == ["0", "1", "2", "3"]
    assert at.selectbox(key=ui.HEAD_KEY).help == "Head h, 0..3: a note"
    assert at.markdown[0].value == "layer=0 head=0"
    at.selectbox(key=ui.HEAD_KEY).select(3).run()
    assert at.markdown[0].value == "layer=0 head=3"
    at.session_state["n_heads"] = 2  # a model with fewer heads: back to head 0
    at.run()
    assert at.markdown[0].value == "layer=0 head=0"


def test_the_picker_can_offer_every_head_at_once():
    at = picker(all_heads=True)
    head = at.selectbox(key=ui.HEAD_KEY)
    assert head.options == ["0", "1", "2", "3", "all (grid)"]
    head.select(ui.ALL_HEADS).run()
    assert at.markdown[0].value == "layer=0 head=all"


def test_the_picker_follows_the_url_unless_told_not_to():
    assert picker({"layer": "1", "head": "2"}).markdown[0].value == "layer=1 head=2"
    at = picker({"layer": "1", "head": "9"})
    assert at.markdown[0].value == "layer=1 head=0" and "head='9'" in at.warning[0].value
    assert picker({"layer": "1", "head": "2"}, url=False).markdown[0].value == "layer=0 head=0"


# --- the task guard ----------------------------------------------------------------------------------

TASK_PAGES = {
    "3_Retrain.py": "there is nothing to retrain it on (an imported model needs its tokenizer.json)",
    "5_Grow_d_k.py": "there is no loss to grow it on",
    "6_Kernelized_attention.py": "there are no input sequences to run its heads on",
}


@pytest.mark.parametrize("page, why", TASK_PAGES.items())
def test_a_model_without_a_task_is_stopped_by_the_guard(save_model, page, why):
    save_model("no-task", card={})
    at = AppTest.from_file(str(ROOT / "app_pages" / page), default_timeout=60)
    at.query_params["model"] = "no-task"
    at.run()
    assert not at.exception and not at.error
    assert [w.value for w in at.warning] == [f"no-task has no known task in its card, so {why}."]
    assert not at.get("plotly_chart") and not at.button


def _guard_script():
    import streamlit as st

    import ui

    loaded = ui.load_model("gpt2-tiny")
    ui.require_task(loaded, "there is nothing to do")
    st.write("past the guard")


def test_a_gpt2_folder_has_no_task_and_meets_the_guard(tiny_gpt2):
    at = AppTest.from_function(_guard_script, default_timeout=60).run()
    assert not at.exception
    assert at.warning[0].value == "gpt2-tiny has no known task in its card, so there is nothing to do."
    assert not at.markdown


def test_a_model_with_a_task_passes_the_guard():
    loaded = ui.load_model("reverse-1l")
    assert ui.require_task(loaded, "unused").name == "reverse"


# --- caching -------------------------------------------------------------------------------------------


def test_a_model_is_read_again_when_its_weights_file_changes(save_model, tiny_model):
    folder = save_model("mine", seed=0)
    first = ui.load_model("mine")
    assert ui.load_model("mine") is first  # cached
    weights = sources.weights_path("mine")
    checkpoint.save(tiny_model(seed=1), folder, card={"task": "reverse"}, overwrite=True)
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a coarse clock: make the change visible
    again = ui.load_model("mine")
    assert again is not first and again.key != first.key
    old, new = first.model.state_dict(), again.model.state_dict()
    assert any(not torch.equal(old[k], new[k]) for k in old)  # the new weights, not the cached ones


def test_results_are_cached_by_plain_inputs_not_identity():
    calls = []

    def compute(m, layer: int, tokens: list):
        calls.append((m.key, layer))
        return [m.key, layer, len(tokens)]

    memo = ui.cached(compute)
    a = ui.load_model("reverse-1l")
    twin = SimpleNamespace(name="copy", model=a.model, config=a.config, key=a.key)  # same weights, another object
    assert memo(a, 0, [1, 2]) == memo(twin, 0, [1, 2]) == [a.key, 0, 2]
    assert len(calls) == 1
    memo(a, 1, [1, 2])
    memo(a, 0, [1, 2, 3])
    assert len(calls) == 3
    with pytest.raises(TypeError, match="LoadedModel"):
        memo(a.model, 0, [1])  # a bare Transformer has no key but its id(): refused
    memo.clear()


def test_two_cached_functions_keep_two_caches():
    def first(x):
        return ("first", x)

    def second(x):
        return ("second", x)

    assert ui.cached(first)(1) == ("first", 1) and ui.cached(second)(1) == ("second", 1)
