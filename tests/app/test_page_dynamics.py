"""AppTest of app_pages/11_Dynamics.py on a run trained with checkpoints: the step slider scrubs every
view to that checkpoint's weights (checked against the checkpoint loaded here), the curves mark
the step, play advances it, the animation has one frame per step, and bad series are one line."""

from pathlib import Path

import pytest
import torch
from dashboard_helpers import chart, has_chart, z_matrix
from streamlit.testing.v1 import AppTest

from attn_core import bilinear, checkpoint
from attn_core import dynamics as D
from attn_core.retraining.job import TrainingJob
from attn_core.training.config import JobConfig
from tests.conftest import make_tiny_model

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "11_Dynamics.py")


@pytest.fixture
def run(tmp_path):
    src = checkpoint.save(
        make_tiny_model(n_layers=2), tmp_path / "tiny", {"task": "reverse", "train": {"batch_size": 8}}
    )
    cfg = JobConfig(str(src), steps=8, device="cpu", telemetry_every=4, spectrum_every=4, eval_every=4,
                    eval_samples=8, probe_samples=4, measure_samples=16, checkpoint_every=4)  # fmt: skip
    return f"run:{TrainingJob.open(cfg).run()['run_id']}"


def open_dynamics() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    return at


def test_the_slider_scrubs_every_view_to_that_checkpoint(run):
    at = open_dynamics()
    slider = at.select_slider(key="dyn_step")
    assert list(slider.options) == ["0", "4", "8"] and slider.value == 8
    for key in ("dyn_heatmap", "dyn_heatmap_other", "dyn_spectrum", "dyn_composition", "dyn_detectors"):
        assert has_chart(at, key), key
    series = D.series([run])
    at.selectbox(key="layer").select(1).run()
    for step in (0, 4):
        at.select_slider(key="dyn_step").set_value(step).run()
        assert not at.exception
        loaded = series.load(step)
        tokens = bilinear.sample_tokens(loaded, 0)
        want = bilinear.sequence_view(loaded, tokens, 1).scores[0]
        got = z_matrix(chart(at, "dyn_heatmap"))
        assert torch.allclose(
            got,
            want.masked_fill(~torch.tril(torch.ones_like(want, dtype=torch.bool)), float("nan")),
            atol=1e-5,
            equal_nan=True,
        )
        curve = chart(at, "dynamics_loss")
        assert [s["x0"] for s in curve["layout"]["shapes"] if s.get("type") == "line"] == [step]


def test_curves_show_the_metrics_of_every_checkpoint(run):
    at = open_dynamics()
    dyn = D.dynamics(D.series([run]), D.default_inputs(D.series([run]), samples=256))
    loss = chart(at, "dynamics_loss")
    assert [t["name"] for t in loss["data"]] == ["loss", "ICL score (late − early)"]
    assert list(loss["data"][0]["x"]) == [0, 4, 8]
    assert loss["data"][0]["y"] == pytest.approx(dyn.metrics["loss"], rel=1e-6)
    names = {t["name"] for t in chart(at, "dynamics_heads")["data"]}
    assert "prefix matching L1H0" in names and "previous token L0H1" in names
    empty = chart(at, "dynamics_kcomp")
    assert "no earlier layer" in empty["layout"]["title"]["text"]  # L0H0 reads nothing
    assert empty["layout"]["xaxis"]["range"] == [0, 8]  # its empty axes still span the steps, not -1..4
    at.selectbox(key="layer").select(1).run()
    kcomp = chart(at, "dynamics_kcomp")
    assert [t["name"] for t in kcomp["data"]] == ["L0H0 → L1H0", "L0H1 → L1H0"]
    assert kcomp["data"][1]["y"] == pytest.approx(dyn.k_from("L0H1", "L1H0"), rel=1e-6)
    assert any("σ₁(B)" == t["name"] for t in chart(at, "dynamics_spectrum_entropy")["data"])


def test_play_steps_through_the_checkpoints(run):
    at = open_dynamics()
    at.select_slider(key="dyn_step").set_value(0).run()
    at.toggle(key="dyn_play").set_value(True).run()
    assert at.select_slider(key="dyn_step").value == 4
    at.run()
    assert at.select_slider(key="dyn_step").value == 8
    at.run()
    assert at.select_slider(key="dyn_step").value == 0  # round again
    at.toggle(key="dyn_play").set_value(False).run()
    assert at.select_slider(key="dyn_step").value == 0


def test_the_animation_has_one_frame_per_step(run):
    at = open_dynamics()
    at.button(key="dyn_build_animation").click().run()
    assert not at.exception
    fig = chart(at, "dyn_animation")
    assert [f["name"] for f in fig["frames"]] == ["0", "4", "8"]
    assert [s["label"] for s in fig["layout"]["sliders"][0]["steps"]] == ["0", "4", "8"]


def test_no_series_and_bad_folders_are_one_message(tmp_path):
    at = open_dynamics()
    assert any("No run or model with checkpoints yet" in i.value for i in at.info)
    at.radio(key="dyn_kind").set_value("folders").run()
    at.text_area(key="dyn_folders").input(f"{tmp_path / 'nothing'}\n{tmp_path / 'step3'}").run()
    assert not at.exception and any("cannot be read" in e.value for e in at.error)
    at.text_input(key="dyn_steps").input("1,x").run()
    assert not at.exception and any("whole numbers" in e.value for e in at.error)


def test_a_broken_checkpoint_folder_among_the_models_is_left_out_in_one_line(run, tmp_path, monkeypatch):
    root = tmp_path / "models"
    folder = checkpoint.save(make_tiny_model(), root / "broken", {"task": "reverse"})
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "index.json").write_text("[")
    monkeypatch.setenv("ATTN_LAB_MODELS", str(root))
    at = open_dynamics()  # no traceback: the run is listed, the broken folder said to be left out
    assert at.selectbox(key="dyn_source").value == run
    assert any("Left out of the list: skipped the checkpoints of broken" in c.value for c in at.caption)


def test_the_retrain_page_keeps_checkpoints_for_this_page():
    import time

    from attn_core.runs import RunStore

    retrain = AppTest.from_file(str(Path(PAGE).with_name("3_Retrain.py")), default_timeout=120)
    retrain.query_params["model"] = "reverse-1l"
    retrain.run()
    retrain.number_input(key="retrain_steps").set_value(10)
    retrain.number_input(key="retrain_checkpoints").set_value(4)
    retrain.run()
    retrain.button(key="retrain_start").click().run()
    assert not retrain.exception and not retrain.error
    job = retrain.session_state["retrain_job"]
    assert job.join(120)
    run_id = job.snapshot().run_id
    card = RunStore().get(run_id)["card"]
    assert card["checkpoints"]["steps"] == [0, 1, 2, 5, 10]
    deadline = time.monotonic() + 30
    while not D.available() and time.monotonic() < deadline:  # the run's folder is written as it ends
        time.sleep(0.1)
    at = open_dynamics()
    assert at.selectbox(key="dyn_source").value == f"run:{run_id}"
    assert list(at.select_slider(key="dyn_step").options) == ["0", "1", "2", "5", "10"]
