"""AppTest of app_pages/11_Dynamics.py on damaged checkpoints (each one line, the others shown), the
slider on a step damaged since its metrics were cached, junk in the step list, paths outside the
folders the dashboard reads, and a folder of Hugging Face folders measured on a text of the data
folder, with what was measured stated."""

import os
import shutil
from pathlib import Path

import pytest
from dashboard_helpers import chart, has_chart
from streamlit.testing.v1 import AppTest

from attn_core.hf.export import export_gpt2
from attn_core.sources import resolve
from tests.damaged import BAD_STEP, KINDS, damage, damage_all, model_with_checkpoints

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "11_Dynamics.py")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return model_with_checkpoints(tmp_path_factory.mktemp("pristine") / "tiny-ckpt", steps=len(KINDS) + 1)


@pytest.fixture
def models(pristine, tmp_path, monkeypatch):
    """A folder listed in ATTN_LAB_MODELS holding a copy of the model with checkpoints."""
    root = tmp_path / "models"
    shutil.copytree(pristine, root / "tiny-ckpt")
    monkeypatch.setenv("ATTN_LAB_MODELS", str(root))
    return root


def open_page(samples: int = 16) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.session_state["dyn_samples"] = samples  # small: every checkpoint is measured on these
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def steps_offered(at: AppTest) -> list[str]:
    return list(at.select_slider(key="dyn_step").options)


def test_damaged_checkpoints_are_one_line_each_and_the_others_are_shown(models):
    said = damage_all(models / "tiny-ckpt")
    at = open_page()
    assert at.selectbox(key="dyn_source").value == "tiny-ckpt"
    lines = [w.value.replace("\\", "") for w in at.warning if w.value.startswith("Skipped")]  # markdown escapes
    for step, words in said.items():
        assert any(f"step {step} (" in line and words in line for line in lines), (step, lines)
    last = str(len(KINDS) + 1)
    assert steps_offered(at) == ["0", last]
    assert at.number_input(key="dyn_samples").value == 16  # the box shows what is used
    assert at.caption[0].value.startswith("2 checkpoints, steps 0..8; measured on 16 held-out reverse sequences")
    for step in (0, int(last)):  # every view of the others
        at.select_slider(key="dyn_step").set_value(step).run()
        assert not at.exception and has_chart(at, "dyn_heatmap") and has_chart(at, "dynamics_loss")


def test_the_slider_on_a_step_damaged_since_it_was_measured_is_one_line(models):
    at = open_page()
    every = [str(s) for s in range(len(KINDS) + 2)]
    assert steps_offered(at) == every
    path = models / "tiny-ckpt" / "checkpoints" / f"step-00000000{BAD_STEP}.safetensors"
    st = path.stat()
    damage(models / "tiny-ckpt", "nan")  # the same size; its time set back: the metrics stay cached
    assert path.stat().st_size == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    at.run()
    assert steps_offered(at) == every
    at.select_slider(key="dyn_step").set_value(BAD_STEP).run()
    assert not at.exception
    assert any(
        f"Step {BAD_STEP} cannot be read: tensor blocks.1.attn.W\\_V contains NaN" in w.value for w in at.warning
    )
    assert not has_chart(at, "dyn_heatmap") and has_chart(at, "dynamics_loss")  # the curves are still shown
    at.button(key="dyn_build_animation").click().run()  # the animation leaves the bad step out
    assert not at.exception
    assert [f["name"] for f in chart(at, "dyn_animation")["frames"]] == [s for s in every if s != str(BAD_STEP)]


def test_junk_in_the_step_list_and_paths_outside_the_dashboards_folders_are_one_line(models, tmp_path):
    other = models / "tiny-b"
    shutil.copytree(models / "tiny-ckpt", other, ignore=shutil.ignore_patterns("checkpoints"))
    at = open_page()
    at.radio(key="dyn_kind").set_value("folders").run()
    at.text_area(key="dyn_folders").input(f"{models / 'tiny-ckpt'}\n{other}").run()
    for steps, said in [("1,,2", "whole numbers"), ("99999999999999999999,1", "whole numbers"),
                        ("-1,2", "whole numbers"), ("1", "1 steps given for 2 models"),
                        ("20000000,1", "a step is a whole number 0..10,000,000"), ("5,5", "step 5 is listed twice")]:  # fmt: skip
        at.text_input(key="dyn_steps").input(steps).run()
        assert not at.exception
        lines = [e.value for e in at.error] + [w.value for w in at.warning]
        assert len(lines) == 1 and said in lines[0], (steps, lines)
    (tmp_path / "outside").mkdir()
    (models / "escape").symlink_to(tmp_path / "outside")  # a link inside the model folders leading out
    at.radio(key="dyn_kind").set_value("checkpoints").run()
    at.selectbox(key="dyn_source").set_value("(a folder)").run()
    for where in ("/etc", "../../..", str(models / "escape"), "~"):
        at.text_input(key="dyn_path").input(where).run()
        assert not at.exception
        assert [e.value.replace("\\", "") for e in at.error] == [  # markdown escapes
            f"This series cannot be read: {where} is outside the folders this dashboard reads (the run store, the zoo, "
            "$ATTN_LAB_MODELS and $ATTN_LAB_DATA); put the series in one of them"
        ], where
    at.text_input(key="dyn_path").input(str(models / "tiny-ckpt")).run()  # inside: read
    assert not at.error and steps_offered(at)[-1] == str(len(KINDS) + 1)


def test_a_folder_of_hf_folders_in_the_data_folder_is_measured_on_its_text(tmp_path, monkeypatch):
    data = tmp_path / "data"
    series = data / "exported-series"
    for step in (0, 10, 20):
        loaded = resolve("reverse-1l")
        with __import__("torch").no_grad():
            for p in loaded.model.parameters():
                p.mul_(1 + step / 100)
        export_gpt2(loaded, series / f"step{step}", token_names=list(loaded.task.token_names))
    (data / "digits.txt").write_text(" ".join(str(i * 7 % 10) for i in range(400)))
    monkeypatch.setenv("ATTN_LAB_DATA", str(data))
    at = open_page(samples=16)
    assert at.selectbox(key="dyn_source").value == str(series)  # listed from the data folder
    assert at.selectbox(key="dyn_text").value == "digits.txt"
    assert at.number_input(key="dyn_samples").value == 16
    caption = at.caption[0].value
    assert caption.startswith("3 checkpoints, steps 0..20; measured on 16 windows of 16 text tokens"), caption
    assert steps_offered(at) == ["0", "10", "20"] and chart(at, "dynamics_loss")["data"][0]["y"][0] is not None
    sinks, ranks = chart(at, "dynamics_sinks"), chart(at, "dynamics_ranks")  # every metric, sinks and ranks too
    assert [t["name"] for t in sinks["data"]] == ["sink rate (share of heads)", "sink importance L0H0"]
    assert [t["name"] for t in ranks["data"]] == ["rank of B (90%)", "rank of the scores (90%)",
                                                   "stable rank of the scores"]  # fmt: skip
    assert all(len(t["x"]) == 3 for t in sinks["data"] + ranks["data"])
