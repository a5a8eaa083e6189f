"""The Retrain page keeps the same four charts in the same places before a run, while it trains
and after it ends: a chart whose data is still to come is drawn empty with its title and what it
will show (the page used to jump between fewer and more charts as data arrived)."""

import time
from pathlib import Path

from dashboard_helpers import open_page

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "3_Retrain.py")
CHARTS = ["live_curves", "live_entropy", "live_pattern", "live_spectrum"]


def charts(at) -> list[str]:
    return [c.proto.id.rsplit("-chart_", 1)[1] for c in at.get("plotly_chart")]


def test_four_charts_before_during_and_after_a_run():
    at = open_page(PAGE, "reverse-1l")
    assert charts(at) == CHARTS
    at.number_input(key="retrain_steps").set_value(300).run()
    at.button(key="retrain_start").click().run()
    assert not at.exception
    seen, deadline = [charts(at)], time.monotonic() + 120
    job = at.session_state["retrain_job"]
    while not job.snapshot().done:
        assert time.monotonic() < deadline, "the run did not end in time"
        time.sleep(0.2)
        at.run()
        assert not at.exception, at.exception
        seen.append(charts(at))
    at.run()
    seen.append(charts(at))
    assert len(seen) >= 3 and all(s == CHARTS for s in seen), seen
