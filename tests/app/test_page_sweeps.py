"""AppTest of pages/10_Sweeps.py: an empty store says what to do; a recorded sweep shows its trial
table and Pareto scatter (colour = regularizer, hover = run id) and opens a trial as the model of
every page; the form launches a sweep on a local Ray (2 CPUs) in a background thread and the page
follows it to the end."""

from pathlib import Path

import pytest
from dashboard_helpers import chart
from streamlit.testing.v1 import AppTest

import ui
from attn_core.runs import RunStore
from attn_core.sweep import grid_plan, record_trial, run_trial, start_sweep

PAGE = str(Path(__file__).resolve().parents[2] / "pages" / "10_Sweeps.py")
MODEL = "reverse-1l"


def page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    return at


def test_empty_store_says_what_to_do():
    at = page()
    assert any("No sweeps" in i.value for i in at.info)
    assert at.multiselect(key="sweep_regs").value == ["entropy", "hoyer"]


def test_recorded_sweep_table_pareto_and_open():
    store = RunStore()
    plan = grid_plan(MODEL, ["entropy=0.5"], steps=3, measure_samples=64)
    sweep_id, _ = start_sweep(plan, store)
    ids = [record_trial(store, sweep_id, run_trial(t.to_dict(), plan.job)) for t in plan.trials]
    at = page()
    assert at.selectbox(key="sweeps_picked").value == sweep_id
    table = at.dataframe[0].value
    assert list(table["run"]) == ids and set(table["status"]) == {"completed"}
    fig = chart(at, "sweep_pareto")
    points = [tr for tr in fig["data"] if tr.get("mode") == "markers"]
    assert {tr["name"] for tr in points} == {"none", "entropy"}
    assert {h for tr in points for h in tr["hovertext"]} == set(ids)
    at.radio(key="sweep_view").set_value("vocab").run()
    assert "vocab" in chart(at, "sweep_pareto")["layout"]["xaxis"]["title"]["text"]
    at.selectbox(key="sweep_open_choice").set_value(ids[1])
    at.button(key="sweep_open").click().run()
    assert at.session_state[ui.MODEL_KEY] == f"run:{ids[1]}"
    assert any(f"run:{ids[1]}" in s.value for s in at.success)


def test_launch_on_local_ray_and_watch():
    pytest.importorskip("ray")
    at = page()
    at.selectbox(key="sweep_source").set_value(MODEL)
    at.multiselect(key="sweep_regs").set_value(["entropy"])
    at.number_input(key="sweep_nlam").set_value(1)
    at.number_input(key="sweep_lo").set_value(0.1)
    at.number_input(key="sweep_steps").set_value(3)
    at.button[0].click().run()  # the form's submit button
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("launched: 2 trials" in s.value for s in at.success)
    state = next(iter(at.session_state["sweeps_launched"].values()))
    state["thread"].join(120)
    assert not state["thread"].is_alive() and state["error"] is None, state["error"]
    at.run()
    sweep = RunStore().list_sweeps()[0]
    assert sweep["status"] == "completed" and sweep["counts"] == {"completed": 2}
    assert list(at.dataframe[0].value["status"]) == ["completed", "completed"]
