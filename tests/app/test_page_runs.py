"""AppTest of app_pages/4_Runs.py: saved runs side by side with their parent: curves from the run
store, spectra before/after from the cards, heatmaps of each model's own scores; an empty store
says what to do."""

from pathlib import Path

import pytest
import torch
from dashboard_helpers import chart, has_chart, open_page, values, z_matrix
from streamlit.testing.v1 import AppTest

from attn_core import bilinear, runs
from attn_core.hooks import act_name
from attn_core.retraining.job import TrainingJob
from attn_core.sources import resolve
from attn_core.training.config import JobConfig

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "4_Runs.py")
MODEL = "reverse-1l"


@pytest.fixture(scope="module")
def store_root(tmp_path_factory) -> Path:
    """Two short runs of the smallest zoo model (made once for the module)."""
    root = tmp_path_factory.mktemp("runs")
    store = runs.RunStore(root)
    for regs in ({"entropy": 0.5}, {"spectral": 0.1}):
        cfg = JobConfig(
            source=MODEL,
            regularizers=regs,
            steps=4,
            eval_samples=32,
            measure_samples=64,
            telemetry_every=2,
            spectrum_every=2,
        )
        assert TrainingJob.open(cfg, store=store).run()["status"] == "completed"
    return root


@pytest.fixture
def page(store_root, monkeypatch) -> AppTest:
    monkeypatch.setenv("ATTN_LAB_RUNS", str(store_root))
    return open_page(PAGE, MODEL)


def test_empty_store_says_what_to_do():
    at = AppTest.from_file(PAGE, default_timeout=90).run()
    assert not at.exception
    assert "No finished runs" in at.info[0].value and not at.get("plotly_chart")


def test_runs_side_by_side_with_the_parent(page, store_root):
    listed = runs.RunStore(store_root).list_runs()
    ids = [r["id"] for r in listed]
    assert list(page.dataframe[0].value["id"]) == ids
    assert page.multiselect(key="runs_selected").value == ids  # the two newest
    for i, run_id in enumerate(ids):
        curves = chart(page, f"curves_{i}")
        assert curves["layout"]["title"]["text"].startswith(run_id)
        task_loss = [t for t in curves["data"] if t["name"] == "task loss"][0]
        logged = runs.RunStore(store_root).metrics(run_id, ["task_loss"])
        assert values(task_loss["x"]).tolist() == logged["step"].tolist() == [1, 2, 3, 4]
        torch.testing.assert_close(values(task_loss["y"]), torch.tensor(logged["value"].tolist()))
        spectra = chart(page, f"spectra_{i}")
        assert {t["name"] for t in spectra["data"]} == {"before", "after"}
    trade = chart(page, "tradeoff")
    assert {t["name"] for t in trade["data"] if t.get("legendgroup") != "key"} == set(ids)
    # each run goes from its open before-marker to its filled after-marker, with an arrow, both axes 0..1
    assert all(t["marker"]["symbol"] == ["circle-open", "circle"] for t in trade["data"] if t["name"] in ids)
    assert len(trade["layout"]["annotations"]) == len(ids)
    assert trade["layout"]["yaxis"]["range"] == trade["layout"]["xaxis"]["range"] == [-0.02, 1.02]
    # the axes are titled in words, not by the measures' column names ("entropy_data")
    assert trade["layout"]["xaxis"]["title"]["text"] == "mean normalized entropy on data (H / log n)"
    assert trade["layout"]["yaxis"]["title"]["text"] == "held-out accuracy"
    # heatmaps: the parent, then each run, every one the model's own pattern on the same sample
    assert [c.value for c in page.main.caption if c.value.startswith("**")][-3:] == [
        f"**{MODEL}** (parent)",
        f"**run:{ids[0]}**",
        f"**run:{ids[1]}**",
    ]
    tokens = bilinear.sample_tokens(resolve(MODEL), 0)
    for i, name in enumerate([MODEL] + [f"run:{r}" for r in ids]):
        model = resolve(MODEL).model if i == 0 else runs.RunStore(store_root).load_model(name).model
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.tensor([tokens]))
        A = cache[act_name("pattern", 0)][0, 0]
        z = z_matrix(chart(page, f"heat_{i}"))
        causal = torch.tril(torch.ones_like(A, dtype=torch.bool))
        torch.testing.assert_close(z[causal], A[causal], atol=1e-6, rtol=1e-4)
    first, parent = (z_matrix(chart(page, f"heat_{i}")).nan_to_num() for i in (1, 0))
    assert not torch.allclose(first, parent)  # retraining moved the pattern


def test_head_choice_and_without_parent(page):
    page.selectbox(key="head").select(1)
    page.toggle(key="runs_with_parent").set_value(False)
    page.radio(key="runs_value").set_value("scores")
    page.run()
    assert not page.exception
    titles = [chart(page, f"heat_{i}")["layout"]["title"]["text"] for i in range(2)]
    assert all("scores" in t and "head 1" in t for t in titles)
    assert not has_chart(page, "heat_2")


def test_a_run_picked_in_the_sidebar_is_compared_by_default(store_root, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(store_root))
    older = runs.RunStore(store_root).list_runs()[-1]["id"]
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params["model"] = f"run:{older}"
    at.run()
    assert not at.exception
    assert at.multiselect(key="runs_selected").value == [older]
    assert at.sidebar.selectbox(key="model_choice").value == f"run:{older}"


def test_a_corrupt_store_is_said_once_and_the_other_pages_still_work(tmp_path, monkeypatch):
    root = tmp_path / "broken"
    root.mkdir()
    (root / "index.sqlite").write_bytes(bytes(range(256)) * 16)  # garbage bytes as the index
    monkeypatch.setenv("ATTN_LAB_RUNS", str(root))
    at = AppTest.from_file(PAGE, default_timeout=90).run()
    assert not at.exception
    said = [e.value for e in at.error if "is not a SQLite database" in e.value]
    assert len(said) == 1 and str(root) in said[0] and "\n" not in said[0]
    # a page with the model picker still lists the zoo, and says why no runs are listed
    heat = AppTest.from_file(str(Path(PAGE).with_name("1_Heatmaps.py")), default_timeout=90)
    heat.query_params["model"] = MODEL
    heat.run()
    assert not heat.exception and not heat.error
    assert MODEL in heat.sidebar.selectbox(key="model_choice").options
    assert any("could not be read" in w.value for w in heat.sidebar.warning)
    # the Sweeps page says it in one line too, and stays up
    sweeps = AppTest.from_file(str(Path(PAGE).with_name("10_Sweeps.py")), default_timeout=90).run()
    assert not sweeps.exception
    [line] = [e.value for e in sweeps.error if "is not a SQLite database" in e.value]
    assert said[0].startswith(line)


def test_a_damaged_card_is_said_and_the_other_run_still_drawn(store_root, tmp_path, monkeypatch):
    """A run whose card.json was edited into a bad type (task as a list) gets one warning; the
    page goes on and draws the other run's spectra."""
    import json
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(store_root, root)
    store = runs.RunStore(root)
    bad, good = [r["id"] for r in store.list_runs()]
    card_path = store.path(bad) / "card.json"
    card = json.loads(card_path.read_text())
    card["task"] = ["not", "a", "task"]
    card_path.write_text(json.dumps(card))
    monkeypatch.setenv("ATTN_LAB_RUNS", str(root))
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params["model"] = MODEL
    at.run()
    assert not at.exception
    assert any(bad in w.value and "card cannot be read" in w.value for w in at.warning)
    assert has_chart(at, "spectra_1") or has_chart(at, "spectra_0")
