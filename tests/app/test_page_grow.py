"""AppTest of app_pages/5_Grow_d_k.py: grow a head of a small model from the page, see the spectrum,
predicted vs measured decrease, the three methods and the heatmaps; bad models are refused."""

import io
import json
import zipfile
from pathlib import Path

import pytest
from dashboard_helpers import run_page, widget
from streamlit.testing.v1 import AppTest

from attn_core.figures import bundle_zip
from attn_core.sources import LoadedModel, resolve

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "5_Grow_d_k.py")
FIGURES = 6  # spectrum, decrease, curves, summary, heatmap before, heatmap after


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def models(save_model):
    """A narrow reverse model (its head has d_k 1), a merged one and one without a task."""
    base = dict(n_layers=1, n_heads=1, d_model=12, d_head=1)
    save_model("narrow", **base)
    save_model("merged", qk="merged", **base)
    return save_model("no-task", card={}, **base).parent


def page(model: str) -> AppTest:
    return run_page(PAGE, model)


def test_grow_from_the_page(models):
    at = page("narrow")
    assert not at.exception and not at.error
    assert "press **Grow**" in at.info[0].value
    # before the press (issue 31): the head as it is, its singular values and its attention
    shown = [c.proto.id.rsplit("-chart_", 1)[1] for c in at.get("plotly_chart")]
    assert shown == ["grow_now_spectrum", "grow_now_pattern"]
    widget(at.number_input, "p (dimensions to add)").set_value(3)
    widget(at.number_input, "Batch (sequences)").set_value(8)
    widget(at.number_input, "Fine-tuning steps").set_value(5)
    widget(at.button, "Grow").click()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert [h.value for h in at.header] == [
        "Why these directions",
        "Step size: predicted vs measured",
        "Against random and zero growth",
        "The head before and after",
    ]
    assert len(at.get("plotly_chart")) == FIGURES
    assert len(at.download_button) == 4 * FIGURES + 2  # every format of every figure, the zip, the model
    assert widget(at.metric, "d_k").value == "1 → 4"
    table = at.dataframe[0].value  # the line search
    assert table["eta"].iloc[0] == 0.0 and {"predicted_decrease", "measured_decrease", "armijo"} <= set(table)
    # the heatmap switches are cheap: the growth is cached
    widget(at.radio, "Show").set_value("scores")
    widget(at.radio, "Grown model").set_value("finetuned")
    at.run()
    assert not at.exception and not at.error
    assert len(at.get("plotly_chart")) == FIGURES
    change = next(c.value for c in at.caption if c.value.startswith("Largest change of an attention weight"))
    assert float(change.split(": ")[1].split(" ")[0]) > 0


def test_the_page_figures_bundle_into_one_zip(models):
    """The page's six figures, from the same library calls, have distinct names and all go into
    the zip (AppTest cannot press a download button)."""
    from attn_core import bilinear, grow
    from attn_core.figures import grow as fg

    loaded = resolve(models / "narrow")
    res = grow.grow(loaded.model, loaded.task, grow.GrowConfig(add=2, batch=6, steps=3))
    tokens = bilinear.sample_tokens(loaded, 0)
    after = LoadedModel("grown", res.models["grown"], res.models["grown"].cfg, loaded.card)
    plots = [
        fg.spectrum_plot(res),
        fg.decrease_plot(res),
        fg.curves_plot(res),
        fg.summary_plot(res),
        *fg.heatmap_pair(
            bilinear.sequence_view(loaded, tokens, 0, [0]), bilinear.sequence_view(after, tokens, 0, [0]), 0
        ),
    ]
    assert len({p.name for p in plots}) == len(plots)
    spectrum, decrease, curves, summary = (p.data for p in plots[:4])
    assert spectrum["kept"].sum() == min(res.kept, len(spectrum)) and spectrum["singular_value"].is_monotonic_decreasing
    assert len(decrease) == len(res.line_search) and (decrease["val_decrease"].iloc[0] == 0)
    assert set(curves["method"]) == {"grown", "random", "zero"} and len(summary) == 6
    assert (plots[4].data["score"] == bilinear.sequence_view(loaded, tokens, 0, [0]).frame(0)["score"]).all()
    with zipfile.ZipFile(io.BytesIO(bundle_zip(plots, {"page": "Grow d_k"}, formats=("csv", "html")))) as zf:
        names = set(zf.namelist())
        assert {f"{p.name}.csv" for p in plots} <= names and "manifest.json" in names
        assert json.loads(zf.read("manifest.json"))["figures"] == [p.name for p in plots]


@pytest.mark.parametrize("model, message", [("merged", "merged heads"), ("no-task", "no known task")])
def test_models_that_cannot_grow_are_explained(models, model, message):
    at = page(model)
    assert not at.exception
    assert any(message in w.value for w in at.warning)
    assert not at.get("plotly_chart")


def test_the_formula_is_set_on_lines_the_page_holds(models):
    """The fit's formula is written one statement per line (in one line, 190 characters of TeX,
    it is wider than the page at 1440 px)."""
    at = page("narrow")
    formula = next(x.value for x in at.latex if "arg" in x.value)
    lines = formula.split("\\\\")
    assert len(lines) >= 2 and all(len(line) <= 120 for line in lines), [len(line) for line in lines]


def test_the_inputs_are_growconfigs_declarations(models):
    """Every growth input is GrowConfig's declared setting: its label, help, lower bound and default
    (the page's own: p = 2), the declared upper bound or the page's tighter one (a server's growth is
    short), and the declared choices of the basis, the damping and the learning rate."""
    from attn_core.declarations import declared
    from attn_core.grow import GrowConfig
    from attn_core.validate import default

    at = page("narrow")
    assert not at.exception and not at.error

    def shown(name: str) -> dict:
        return declared(GrowConfig, name)["widget"]

    for name, key, lo, hi, value in (
        ("add", "grow_add", 1, 11, 2),  # d_model 12 (no bias): d_k + p at most 12
        ("batch", "grow_batch", 1, 256, default(GrowConfig, "batch")),
        ("steps", "grow_steps", 1, 2000, default(GrowConfig, "steps")),
        ("seed", "grow_seed", 0, 2**31 - 1, default(GrowConfig, "seed")),
    ):
        box, widget = at.number_input(key=key), shown(name)
        assert (box.label, box.min, box.max, box.value, box.step) == (widget["label"], lo, hi, value, widget["step"])
        assert box.help == widget["help"].format(width=12)
    assert declared(GrowConfig, "batch")["bounds"][0] == 1 and declared(GrowConfig, "steps")["bounds"][0] == 1
    basis = at.radio(key="grow_basis")
    assert (basis.label, basis.help, basis.value) == (shown("basis")["label"], shown("basis")["help"], "whitened")
    assert basis.options == [shown("basis")["labels"][b] for b in shown("basis")["options"]]
    for name, key in (("damping", "grow_damping"), ("lr", "grow_lr")):
        slider, widget = at.select_slider(key=key), shown(name)
        assert (slider.label, slider.help, slider.value) == (widget["label"], widget["help"], default(GrowConfig, name))
        assert slider.options == [f"{v:g}" for v in widget["options"]]
