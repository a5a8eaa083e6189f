"""AppTest of app_pages/10_Sweeps.py: an empty store says what to do; a recorded sweep shows its trial
table and Pareto scatter (colour = regularizer, hover = run id) and opens a trial as the model of
every page; the form launches a sweep on a local Ray (2 CPUs) in a background thread and the page
follows it to the end."""

import time
from pathlib import Path

import pytest
from dashboard_helpers import chart
from streamlit.testing.v1 import AppTest

import ui
from attn_core.runs import RunStore
from attn_core.sweep import grid_plan, record_trial, run_trial, start_sweep

pytestmark = pytest.mark.ray  # starts a local Ray: one test worker runs these in turn (tests/conftest.py)

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "10_Sweeps.py")
MODEL = "reverse-1l"


@pytest.fixture(autouse=True)
def end_kept_ray():
    """A sweep launched from the page keeps its Ray for the server's next sweep (run_sweep's
    keep_ray): ended after each test, as the server's exit ends it."""
    yield
    from attn_core import cluster

    cluster.end_ray()


def page(model: str | None = None) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    if model is not None:
        at.query_params["model"] = model
    at.run()
    assert not at.exception, at.exception
    return at


def test_empty_store_says_what_to_do():
    at = page()
    assert any("No sweeps" in i.value for i in at.info)
    assert at.multiselect(key="sweep_regs").value == ["entropy", "hoyer"]


def test_the_steps_per_trial_are_jobconfigs_declaration():
    """A trial's steps are JobConfig's declared setting (a trial is a retrain): its help, step and
    lower bound; the page's own label, quicker default and a server's tighter upper bound."""
    from attn_core.declarations import declared
    from attn_core.training.config import JobConfig

    box, widget = page().number_input(key="sweep_steps"), declared(JobConfig, "steps")["widget"]
    assert (box.label, box.help, box.min, box.step) == ("Steps per trial", widget["help"], widget["min_value"], 50)
    assert widget["step"] == 50 and (box.value, box.max) == (100, 20_000)


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
    points = [tr for tr in fig["data"] if tr.get("legendgroup") == "regularizer"]
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
    at = page(MODEL)
    at.multiselect(key="sweep_regs").set_value(["entropy"])
    at.number_input(key="sweep_nlam").set_value(1)
    at.number_input(key="sweep_lo").set_value(0.1)
    at.number_input(key="sweep_steps").set_value(3)
    at.button(key="sweep_go").click().run()  # the form's submit button
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any(f"of {MODEL} launched: 2 trials" in s.value for s in at.success)
    state = next(iter(at.session_state["sweeps_launched"].values()))
    state["thread"].join(120)
    assert not state["thread"].is_alive() and state["error"] is None, state["error"]
    import ray

    from attn_core import cluster

    assert ray.is_initialized() and cluster.ray_users() == 0  # kept for the server's next sweep
    at.run()
    sweep = RunStore().list_sweeps()[0]
    assert sweep["status"] == "completed" and sweep["counts"] == {"completed": 2}
    assert list(at.dataframe[0].value["status"]) == ["completed", "completed"]


def test_enter_in_a_field_does_not_launch_a_sweep():
    """The setup is a form: Enter in a number field (λ, steps) would submit it and start minutes of
    work on every core. Only the button launches (the browser test presses Enter too)."""
    from streamlit.proto.Block_pb2 import Block

    def forms(node):
        for child in getattr(node, "children", {}).values():
            proto = getattr(child, "proto", None)
            if isinstance(proto, Block) and proto.WhichOneof("type") == "form":
                yield proto.form
            yield from forms(child)

    found = list(forms(page(MODEL)._tree))
    assert [f.form_id for f in found] == ["sweep_setup"] and not found[0].enter_to_submit


def test_a_second_sweep_launched_while_one_runs_waits_in_line(monkeypatch):
    """The launch message says the sweep waits for the one under way (Tune runs one sweep at a
    time in a process), and the progress line of a queued sweep says queued."""
    pytest.importorskip("ray")
    from attn_core.sweep.line import LINE

    ticket = LINE.ticket()  # another sweep of this server holds Tune
    assert LINE.wait(ticket, lambda: False)
    try:
        at = page(MODEL)
        at.multiselect(key="sweep_regs").set_value(["entropy"])
        at.number_input(key="sweep_nlam").set_value(1)
        at.number_input(key="sweep_steps").set_value(2)
        at.button(key="sweep_go").click().run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        assert any("launched" in s.value and "waits in line" in s.value for s in at.success)
        sweep_id = RunStore().list_sweeps()[0]["id"]
        deadline = time.monotonic() + 60
        while not RunStore().get_sweep(sweep_id)["message"].startswith("queued:"):
            assert time.monotonic() < deadline, "the sweep never said it waits"
            time.sleep(0.1)
        at.run()
        assert "queued" in at.get("progress")[0].proto.text
        assert any("queued: 1 sweep of this process ahead" in c.value for c in at.caption)
        state = next(iter(at.session_state["sweeps_launched"].values()))
        assert state["thread"].is_alive()  # waiting, not failed
    finally:
        LINE.release(ticket)
    state["thread"].join(180)
    assert not state["thread"].is_alive() and state["error"] is None, state["error"]
    assert RunStore().get_sweep(sweep_id)["status"] == "completed"


def test_the_model_swept_is_the_model_picked_everywhere():
    """?model= (a link) and a model picked on another page (the shared picker's session value)
    are what the sweep trains; the old page had its own picker that defaulted to the first model."""
    at = page("induction-2l")
    assert at.sidebar.selectbox(key=ui.MODEL_KEY).value == "induction-2l"
    assert at.button(key="sweep_go").label.startswith("Sweep induction-2l on ")
    assert any("fine-tunes **induction-2l**" in m.value for m in at.markdown)
    at.sidebar.selectbox(key=ui.MODEL_KEY).set_value(MODEL).run()  # picked elsewhere: the same session key
    assert at.button(key="sweep_go").label.startswith(f"Sweep {MODEL} on ")


def test_a_model_without_a_task_cannot_be_swept(tiny_gpt2):
    at = page("gpt2-tiny")
    assert any("no known task" in w.value for w in at.warning)
    assert not [b for b in at.button if b.label.startswith("Sweep ")]
