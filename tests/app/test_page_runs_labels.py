"""The Runs page and the sidebar name runs as a person reads them (parent, regularizers, status,
date, with the id), show the head a run regularized (not L0H0 by default), and judge a run on
text by its held-out perplexity (its curves and the trade-off), a task's run by accuracy."""

from pathlib import Path

import pytest
from dashboard_helpers import chart, has_chart, open_page

from attn_core import runs
from attn_core.retraining.job import TrainingJob
from attn_core.training.config import JobConfig
from tests.conftest import write_tiny_hf
from tests.text_corpus import make_text, write_word_tokenizer

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "4_Runs.py")
HEATMAPS = str(Path(__file__).resolve().parents[2] / "app_pages" / "1_Heatmaps.py")


@pytest.fixture(scope="module")
def store_root(tmp_path_factory) -> Path:
    """A run of reverse-1l that regularized L0H1 only, and a run of a tiny Llama on text."""
    root = tmp_path_factory.mktemp("runs")
    store = runs.RunStore(root)
    small = dict(steps=3, eval_samples=16, measure_samples=32, telemetry_every=1, spectrum_every=1)
    cfg = JobConfig(source="reverse-1l", regularizers={"entropy": 0.5}, heads="L0H1", **small)
    assert TrainingJob.open(cfg, store=store).run()["status"] == "completed"
    models = tmp_path_factory.mktemp("models")
    write_tiny_hf(models / "tiny-llama", "llama", num_key_value_heads=2)
    write_word_tokenizer(models / "tiny-llama")
    text = models / "story.txt"
    text.write_text(make_text(0, 200))
    on_text = JobConfig(
        source=str(models / "tiny-llama"),
        text=str(text),
        block=16,
        regularizers={"entropy": 0.1},
        heads="L1H0",
        **small,
    )
    assert TrainingJob.open(on_text, store=store).run()["status"] == "completed"
    return root


def test_runs_are_named_readably_the_regularized_head_is_shown_and_text_is_judged_by_perplexity(
    store_root, monkeypatch
):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(store_root))
    listed = runs.RunStore(store_root).list_runs()
    text_run, task_run = listed  # newest first
    at = open_page(PAGE, "reverse-1l")
    options = at.sidebar.selectbox(key="model_choice").options
    label = next(o for o in options if o.startswith(f"run:{task_run['id']}"))
    assert label == runs.run_label(task_run)
    assert "reverse-1l" in label and "entropy" in label and "completed" in label and task_run["created"][:10] in label
    assert all(o.startswith(f"run:{r['id']} · ") for r, o in zip(listed, [x for x in options if x.startswith("run:")]))
    assert at.multiselect(key="runs_selected").options == [runs.run_label(r) for r in listed]

    # the text run is first: its curves come with its perplexity, and it is plotted by perplexity
    assert has_chart(at, "perplexity_0") and not has_chart(at, "perplexity_1")
    trade = chart(at, "tradeoff_perplexity")
    assert trade["layout"]["yaxis"]["title"]["text"] == "held-out perplexity"
    assert chart(at, "tradeoff")["layout"]["yaxis"]["title"]["text"] == "held-out accuracy"  # the task's run

    # the heatmaps show the first chosen run's regularized head (the text run's L1H0) ...
    at.multiselect(key="runs_selected").set_value([task_run["id"]]).run()
    assert not at.exception
    # ... and the task run alone: its L0H1, not L0H0
    assert (at.selectbox(key="layer").value, at.selectbox(key="head").value) == (0, 1)
    at.selectbox(key="head").select(0).run()  # the user's choice then stays
    assert at.selectbox(key="head").value == 0


def test_a_text_run_is_drawn_on_its_held_out_text_before_and_after(store_root, monkeypatch):
    """The Heatmaps page of a run on text opens on a held-out block of that text (not random
    tokens), and its before/after heatmaps draw the parent and the run on it."""
    monkeypatch.setenv("ATTN_LAB_RUNS", str(store_root))
    text_run = runs.RunStore(store_root).list_runs()[0]
    at = open_page(HEATMAPS, f"run:{text_run['id']}")
    assert at.radio(key="input").value == "text"
    words = [label.split(":", 1)[1] for label in at.select_slider(key="query").options]  # position:token
    story = Path(text_run["config"]["text"]).read_text().split()
    held_out = story[int(0.85 * len(story)) :]  # the last 10% of the stream, with room for the block's edges
    assert any(held_out[i : i + len(words)] == words for i in range(len(held_out))), words
    at.toggle(key="before_after").set_value(True).run()
    assert not at.exception and not at.error
    before, after = chart(at, "before"), chart(at, "after")
    assert before["layout"]["title"]["text"].startswith("before (") and after["layout"]["title"]["text"].startswith(
        "after ("
    )
    assert before["data"][0]["x"] == after["data"][0]["x"]  # the same held-out tokens on both sides
