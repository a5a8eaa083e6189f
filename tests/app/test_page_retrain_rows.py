"""AppTest of the Retrain page's "Rows per head for the penalty" setting: 0 (the default) trains
with the exact row penalties; M > 0 reaches the job (``JobConfig.penalty_rows``), whose stored
run says its row penalties were sampled; the widget's bounds are the model's context."""

import time
from pathlib import Path

import pytest
from dashboard_helpers import open_page
from streamlit.testing.v1 import AppTest

from attn_core import runs
from attn_core.retraining.job import TrainingJob

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "app_pages" / "3_Retrain.py")
MODEL = "reverse-1l"  # 1 layer x 2 heads, 16 positions
ROWS = "retrain_penalty_rows"


def finish(at: AppTest, timeout: float = 120.0) -> TrainingJob:
    """Rerun the page (as its fragments' timers would) until the run has ended and says so."""
    deadline = time.monotonic() + timeout
    while True:
        job = at.session_state["retrain_job"]
        if job.snapshot().done and at.success:
            return job
        assert time.monotonic() < deadline, "the run did not end in time"
        time.sleep(0.3)
        at.run()
        assert not at.exception, at.exception


@pytest.fixture
def page() -> AppTest:
    at = open_page(PAGE, MODEL)
    at.number_input(key="retrain_steps").set_value(3).run()
    return at


def test_the_widget_and_its_bounds(page):
    rows = page.number_input(key=ROWS)
    assert rows.value == 0 and rows.label == "Rows per head for the penalty (0 = all)"
    assert rows.min == 0 and rows.max == 16  # the model's context: more rows than positions are all rows
    assert "unbiased" in rows.help and "every row" in rows.help


def test_sampled_rows_reach_the_run(page):
    page.number_input(key=ROWS).set_value(4).run()
    page.button(key="retrain_start").click().run()
    assert not page.exception and not page.error
    job = finish(page)
    snap = job.snapshot()
    assert snap.status == "completed" and job.cfg.penalty_rows == 4
    assert job.cfg.command().endswith("--penalty-rows 4")
    stored = runs.RunStore().get(snap.run_id)
    assert stored["config"]["penalty_rows"] == 4
    card = runs.RunStore().load_model(snap.run_id).card
    assert card.details["penalty"] == {"rows": 4, "positions": 16, "estimate": "sampled"}


def test_zero_is_every_row(page):
    page.button(key="retrain_start").click().run()
    job = finish(page)
    assert job.snapshot().status == "completed" and job.cfg.penalty_rows is None
    card = runs.RunStore().load_model(job.snapshot().run_id).card
    assert card.details["penalty"]["estimate"] == "exact" and "--penalty-rows" not in card.command
