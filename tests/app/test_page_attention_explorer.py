"""AppTest of app_pages/7_Attention_explorer.py: the toy algebra's cases on screen, bad settings as
st.error, every figure exportable."""

import io
import json
import zipfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import ui
from attn_core.figures import bundle_zip

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "7_Attention_explorer.py")
FIGURES = ["toy_weights", "toy_output", "toy_alpha_a_hist", "toy_heads", "toy_alpha_a_hist_heads"]


def _widget(elements, label):
    return next(w for w in elements if w.label == label)


def _metric(at, prefix):
    return next(m for m in at.metric if m.label.startswith(prefix))


@pytest.fixture
def page():
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    return at


def test_default_page_shows_the_one_head_swing_and_the_two_head_fix(page):
    assert not page.exception and not page.error
    assert [h.value for h in page.header] == [
        "Attention weights",
        "The output c",
        "α_a over the samples",
        "One head vs two",
    ]
    assert len(page.get("plotly_chart")) == len(FIGURES)
    assert len(page.download_button) == 4 * len(FIGURES) + 1  # PNG/SVG/HTML/CSV each + the zip
    assert len(page.latex) >= 5
    table = page.dataframe[0].value
    near = [c for c in table.columns if c.startswith("P(|alpha_a")][0]
    assert table.loc[1, "alpha_a IQR"] > 0.8  # one head: c swings between v_a and v_b
    assert table.loc[2, "alpha_a IQR"] < 0.05 and table.loc[2, near] > 0.8  # two heads average
    assert "tail" in page.caption[0].value


def test_copy_case_reaches_v_a_and_has_one_head(page):
    _widget(page.radio, "Case").set_value("copy")
    _widget(page.number_input, "σ² (its variance along μ_j)").set_value(0.0)
    page.run()
    assert not page.exception and not page.error
    assert _widget(page.radio, "Heads").proto.disabled
    assert "e^β/(e^β+n−1)" in _metric(page, "fixed keys").label
    assert float(_metric(page, "mean α_a").value) > 0.99
    assert float(_metric(page, "median |c − v_a|").value) < 0.01


def test_two_heads_on_screen(page):
    _widget(page.radio, "Heads").set_value(2)
    page.run()
    assert not page.exception and not page.error
    assert "(e^β+1)/(2(e^β+n−1))" in _metric(page, "fixed keys").label
    assert float(_metric(page, "median |c − (v_a+v_b)/2|").value) < 0.01


def test_small_isotropic_noise_keeps_the_average(page):
    _widget(page.number_input, "σ² (its variance along μ_j)").set_value(0.0)
    _widget(page.number_input, "α (variance of every key)").set_value(1e-6)
    _widget(page.slider, "β (query scale)").set_value(20.0)
    page.run()
    assert not page.exception and not page.error
    assert float(_metric(page, "mean α_a").value) == pytest.approx(0.5, abs=0.01)
    assert float(_metric(page, "std of α_a").value) < 0.05


@pytest.mark.parametrize(
    "means_kind, message",
    [
        ("standard basis", "d >= n"),
        ("random orthonormal", "d >= n"),
        ("custom", "non-zero"),  # the starting table eye(n, d) has zero rows when d < n
    ],
)
def test_bad_settings_show_an_error_not_a_crash(page, means_kind, message):
    _widget(page.radio, "Means μ_i").set_value(means_kind)
    _widget(page.number_input, "n (keys)").set_value(6)
    _widget(page.number_input, "d (dimension)").set_value(4)
    page.run()
    assert not page.exception
    assert len(page.error) == 1 and message in page.error[0].value
    assert len(page.get("plotly_chart")) == 0


def test_too_many_samples_for_the_key_array_is_an_error(page):
    _widget(page.number_input, "n (keys)").set_value(32)
    _widget(page.number_input, "d (dimension)").set_value(64)
    _widget(page.number_input, "Key samples").set_value(20_000)
    page.run()
    assert not page.exception
    assert "too large" in page.error[0].value


@pytest.mark.parametrize("means_kind", ["random orthonormal", "custom"])
def test_other_means_run(page, means_kind):
    _widget(page.radio, "Means μ_i").set_value(means_kind)
    page.run()
    assert not page.exception and not page.error and not page.warning
    assert len(page.get("plotly_chart")) == len(FIGURES)
    assert (len(page.data_editor) == 1) == (means_kind == "custom")


def test_export_all_gets_every_figure_and_the_settings(monkeypatch):
    calls = []
    monkeypatch.setattr(ui, "export_all", lambda plots, manifest, key: calls.append((plots, manifest, key)))
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    assert not at.exception
    ((plots, manifest, key),) = calls
    assert [p.name for p in plots] == FIGURES and key == "attention_explorer"
    blob = bundle_zip(plots, manifest, formats=("csv",))
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        saved = json.loads(zf.read("manifest.json"))
        assert {f"{name}.csv" for name in FIGURES} <= set(zf.namelist())
    assert saved["page"] == "Attention explorer"
    assert saved["settings"] | {"n": 4, "d": 8, "beta": 10.0, "big_var": 0.5, "n_heads": 1} == saved["settings"]
    assert len(saved["means"]) == 4 and saved["figures"] == FIGURES


def test_settings_survive_a_visit_to_another_page():
    """The README says choices survive page switches: each of this page's settings is remembered
    (the old page drew them with fixed defaults and lost them on the way back)."""
    at = AppTest.from_file(str(Path(PAGE).parents[1] / "app.py"), default_timeout=60)
    at.switch_page("app_pages/7_Attention_explorer.py").run()
    changed = {
        "n (keys)": 6,
        "d (dimension)": 12,
        "Means μ_i": "random orthonormal",
        "a": 2,
        "b": 4,
        "β (query scale)": 20.0,
        "Heads": 2,
        "α (variance of every key)": 0.001,
        "σ² (its variance along μ_j)": 1.5,
        "Key samples": 500,
        "Seed": 3,
        "Case": "copy",  # last: the copy case disables the Heads choice, which keeps its value
    }
    for label, value in changed.items():
        _widget([*at.slider, *at.number_input, *at.radio], label).set_value(value)
        at.run()
    _widget(at.selectbox, "Key with large variance along its mean").set_value(4)
    at.run()
    at.switch_page("app_pages/0_Home.py").run()
    assert not at.exception
    at.switch_page("app_pages/7_Attention_explorer.py").run()
    assert not at.exception
    for label, value in changed.items():
        assert _widget([*at.slider, *at.number_input, *at.radio], label).value == value, label
    assert _widget(at.selectbox, "Key with large variance along its mean").value == 4
