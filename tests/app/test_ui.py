"""ui (the package): uploads validated like the zoo and kept only inside the data directory, the picker's
entries (zoo, runs, uploads), remembered widget values and URL parameters that fall back with a
message, and the download callables."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import ui
from attn_core import bilinear, checkpoint, runs, sources, zoo
from attn_core.figures import ExportError, Plot
from attn_core.retraining.job import TrainingJob
from attn_core.sources import resolve
from attn_core.training.config import JobConfig
from ui import plots as ui_plots

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
MODEL = "reverse-1l"


def model_files(name: str = MODEL) -> dict[str, bytes]:
    folder = ROOT / "assets" / "models" / name
    return {f: (folder / f).read_bytes() for f in (checkpoint.WEIGHTS, checkpoint.CONFIG, checkpoint.CARD)}


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


# --- uploads -------------------------------------------------------------------------------------


def test_an_upload_is_validated_and_kept_in_the_data_dir(tmp_path):
    before = files_under(tmp_path)
    label = ui.save_upload(model_files())
    assert label.startswith(sources.UPLOAD_PREFIX + "model-")
    folder = sources.upload_dir() / label.removeprefix(sources.UPLOAD_PREFIX)
    assert folder.parent == tmp_path / "runs" / "uploads"
    assert all(p.is_relative_to(tmp_path / "runs") for p in files_under(tmp_path) - before)
    loaded, original = resolve(folder), resolve(MODEL)
    for k, v in original.model.state_dict().items():
        assert (loaded.model.state_dict()[k] == v).all()
    assert loaded.card.task == "reverse"
    assert ui.save_upload(model_files()) == label  # the same upload twice: one folder
    assert len(list(sources.upload_dir().iterdir())) == 1
    assert ui.picker_name(ui.job_source(label)) == label


def test_a_lone_safetensors_file_carries_its_config(tmp_path):
    loaded = resolve(MODEL)
    data = checkpoint.to_safetensors_bytes(loaded.model, card=loaded.card)
    label = ui.save_upload({"my model.safetensors": data})
    assert label.startswith(sources.UPLOAD_PREFIX + "my-model-")
    assert resolve(sources.upload_dir() / label.removeprefix(sources.UPLOAD_PREFIX)).config == loaded.config


@pytest.mark.parametrize(
    "files, message",
    [
        ({"model.safetensors": b"\x80\x04\x95 pickled"}, "pickle"),
        ({"model.safetensors": b"PK\x03\x04 torch.save zip"}, "pickle"),
        ({"model.safetensors": b"\x10\x00\x00\x00\x00\x00\x00\x00{not json"}, "safetensors"),
        ({"a.safetensors": b"x" * 16, "b.safetensors": b"x" * 16}, "exactly one"),
        ({"config.json": b"{}"}, "exactly one"),
        ({"model.safetensors": b"x" * 16, "notes.json": b"{}"}, "unexpected file"),
        ({"model.safetensors": b"x" * 16, "config.json": b"[1, 2"}, "not valid JSON"),
    ],
)
def test_bad_uploads_are_refused_and_write_nothing(tmp_path, files, message):
    before = files_under(tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match=message):
        ui.save_upload(files)
    assert files_under(tmp_path) == before


def test_a_mismatched_config_is_refused(tmp_path):
    files = model_files()
    files[checkpoint.CONFIG] = model_files("induction-2l")[checkpoint.CONFIG]
    with pytest.raises(checkpoint.CheckpointError, match="missing tensors|shape"):
        ui.save_upload(files)
    assert not sources.upload_dir().exists()


def test_a_path_in_the_file_name_stays_inside_the_data_dir(tmp_path):
    files = model_files()
    files["../../../evil/model.safetensors"] = files.pop(checkpoint.WEIGHTS)
    label = ui.save_upload({Path(n).name if n.endswith(".safetensors") else n: b for n, b in files.items()})
    assert (sources.upload_dir() / label.removeprefix(sources.UPLOAD_PREFIX)).is_dir()
    assert not (tmp_path / "evil").exists()
    odd = ui.save_upload({"..%2F..%2Fx.safetensors": model_files()[checkpoint.WEIGHTS]})
    assert (
        "/" not in odd and ".." not in odd and (sources.upload_dir() / odd.removeprefix(sources.UPLOAD_PREFIX)).is_dir()
    )


def test_upload_widget_selects_the_new_model_and_reports_errors():
    at = AppTest.from_file(APP, default_timeout=90).run()
    uploader = at.sidebar.get("file_uploader")[0]
    uploader.set_value([(n, b, "application/octet-stream") for n, b in model_files().items()]).run()
    assert not at.exception
    choice = at.sidebar.selectbox(key=ui.MODEL_KEY)
    assert choice.value.startswith(sources.UPLOAD_PREFIX) and choice.value in choice.options
    assert "Loaded and selected" in at.sidebar.success[0].value

    at.sidebar.get("file_uploader")[0].set_value(("model.safetensors", b"\x80\x04 pickle", "application/octet-stream"))
    at.run()
    assert "pickle" in at.sidebar.error[0].value
    assert at.sidebar.selectbox(key=ui.MODEL_KEY).value == choice.value  # the good upload stays picked


# --- the picker ------------------------------------------------------------------------------------


def test_picker_lists_zoo_runs_and_uploads_and_follows_the_url():
    cfg = JobConfig(source=MODEL, regularizers={"entropy": 0.1}, steps=2, eval_samples=16, measure_samples=32)
    run_id = TrainingJob.open(cfg).run()["run_id"]
    label = ui.save_upload(model_files())
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["model"] = f"run:{run_id}"
    at.run()
    assert not at.exception
    options = at.sidebar.selectbox(key=ui.MODEL_KEY).options  # a run is shown with its parent, regularizers ...
    assert options == [m["name"] for m in zoo.list_models()] + [runs.run_label(runs.RunStore().get(run_id)), label]
    assert at.sidebar.selectbox(key=ui.MODEL_KEY).value == f"run:{run_id}"
    assert f"Retrained from {MODEL}" in at.sidebar.caption[0].value
    assert "1 saved run" in at.main.caption[-1].value


def test_a_run_without_weights_is_not_offered():
    store = runs.RunStore()
    store.create(MODEL, "reverse", {"steps": 1})  # a run that is still going (or was killed)
    at = AppTest.from_file(APP, default_timeout=90).run()
    assert [o for o in at.sidebar.selectbox(key=ui.MODEL_KEY).options if o.startswith("run:")] == []


# --- remembered values and URL parameters ----------------------------------------------------------------


def _remember_script():
    import streamlit as st

    import ui

    ui.setup("remember", needs_model=False)
    n = st.selectbox("n", range(3), key=ui.remember("n", 0, range(3), param="n"))
    seed = st.number_input("seed", min_value=0, key=ui.remember("seed", 5, param="seed"))
    pick = st.radio("pick", ["a", "b"], key=ui.remember("pick", "a", ["a", "b"], param="pick"))
    ui.to_url(n=n, pick=pick)
    st.write(f"n={n} seed={seed} pick={pick}")


def test_valid_url_parameters_are_used():
    at = AppTest.from_function(_remember_script, default_timeout=30)
    at.query_params.update({"n": "2", "seed": "11", "pick": "b"})
    at.run()
    assert not at.exception and not at.warning
    assert at.markdown[0].value == "n=2 seed=11 pick=b"


def test_invalid_url_parameters_fall_back_with_a_message():
    at = AppTest.from_function(_remember_script, default_timeout=30)
    at.query_params.update({"n": "7", "seed": "many", "pick": "c"})
    at.run()
    assert not at.exception
    text = " ".join(w.value for w in at.warning)
    assert "n='7'" in text and "0..2" in text and "seed='many'" in text and "pick='c'" in text
    assert at.markdown[0].value == "n=0 seed=5 pick=a"
    assert at.query_params["n"] == "0" and at.query_params["pick"] == "a"  # the URL is corrected
    at.run()
    assert not at.warning  # said once


def _shrinking_script():
    import streamlit as st

    import ui

    ui.setup("shrink", needs_model=False)
    heads = range(2) if st.session_state.get("smaller_model") else range(4)
    head = st.selectbox("head", heads, key=ui.remember("head", 0, heads))
    st.write(f"head={head}")


def test_a_remembered_value_that_is_no_longer_valid_goes_back_to_the_default():
    at = AppTest.from_function(_shrinking_script, default_timeout=30).run()
    at.selectbox(key="head").select(3).run()
    assert at.markdown[0].value == "head=3"
    at.session_state["smaller_model"] = True  # e.g. a model with fewer heads was picked
    at.run()
    assert not at.exception and at.markdown[0].value == "head=0"


# --- downloads ---------------------------------------------------------------------------------------


def test_download_callables_make_the_file_or_say_why_not(monkeypatch):
    import pandas as pd
    import plotly.graph_objects as go

    plot = Plot("p", go.Figure(go.Bar(x=[1, 2], y=[3, 4])), pd.DataFrame({"x": [1, 2], "y": [3, 4]}))
    assert ui_plots._export_or_message(plot, "csv") == b"x,y\n1,3\n2,4\n"
    assert ui_plots._export_or_message(plot, "html").lower().startswith(b"<!doctype html>")

    def no_browser(*args, **kwargs):
        raise ExportError("PNG/SVG export needs a Chromium browser")

    monkeypatch.setattr(ui_plots, "export_bytes", no_browser)
    assert b"needs a Chromium browser" in ui_plots._export_or_message(plot, "png")


# --- every zoo model on every model page -----------------------------------------------------------


@pytest.mark.parametrize("name", [m["name"] for m in zoo.list_models()])
def test_every_zoo_model_draws_on_every_page(name):
    """Merged QK, MLPs, attention biases, one or two layers: no page may fail on any of them."""
    for page in ("1_Heatmaps.py", "2_Spectrum.py", "3_Retrain.py"):
        at = AppTest.from_file(str(ROOT / "app_pages" / page), default_timeout=90)
        at.query_params["model"] = name
        at.run()
        assert not at.exception and not at.error, (page, at.exception)
        assert at.sidebar.selectbox(key=ui.MODEL_KEY).value == name
        if page == "1_Heatmaps.py":
            at.selectbox(key="head").select("all").run()
            assert len(at.get("plotly_chart")) == resolve(name).config.n_heads + 2  # grid, vocab, positional
        if page == "2_Spectrum.py" and not at.toggle(key="spectrum_augmented").proto.disabled:
            at.toggle(key="spectrum_augmented").set_value(True).run()  # B' of a head with biases
            assert not at.exception


# --- cached ------------------------------------------------------------------------------------------


def test_cached_makes_one_wrapper_per_function_and_calls_the_latest():
    """Pages call ui.cached on every rerun: the wrapper (and Streamlit's cache behind it) is made
    once per function, and a page's function redefined by the rerun is the one that runs."""

    def page_run(offset):
        def shifted(x: int) -> int:  # the same code each rerun, a new function object
            return x + offset

        return shifted

    first = ui.cached(page_run(1))
    again = ui.cached(page_run(1))
    assert again is first and first(1) == 2
    first.clear()
    assert ui.cached(page_run(10))(1) == 11  # the latest definition runs (once the cache is cleared)
    assert ui.cached(page_run(10), resource=True) is not first  # another kind of cache, another wrapper
    assert ui.cached(bilinear.sequence_view) is ui.cached(bilinear.sequence_view)
