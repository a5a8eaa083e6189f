"""AppTest of app_pages/3_Retrain.py: a short retraining runs to completion by polling and is stored
(and listed in the sidebar); Stop stops it; a diverged run says so; a model without a task cannot
be retrained; the live charts show the job's own log."""

import os
import time
from pathlib import Path

import pytest
import torch
from dashboard_helpers import chart, open_page
from streamlit.testing.v1 import AppTest

from attn_core import checkpoint, runs
from attn_core.device import PRECISIONS, available_devices
from attn_core.retraining.job import TrainingJob
from attn_core.sources import resolve

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "app_pages" / "3_Retrain.py")
MODEL = "reverse-1l"  # the smallest zoo model: 1 layer x 2 heads


def poll(at: AppTest, done, timeout: float = 60.0) -> None:
    """Rerun the page (as the fragment's timer would) until ``done(at)``."""
    deadline = time.monotonic() + timeout
    while not done(at):
        assert time.monotonic() < deadline, "the run did not get there in time"
        time.sleep(0.3)
        at.run()
        assert not at.exception, at.exception


def job(at: AppTest) -> TrainingJob:
    return at.session_state["retrain_job"]


@pytest.fixture
def page() -> AppTest:
    return open_page(PAGE, MODEL)


def test_settings_before_any_run(page):
    assert page.button(key="retrain_start").proto.disabled is False
    assert page.button(key="retrain_stop").proto.disabled is True
    assert page.selectbox(key="retrain_device").options == available_devices()
    assert ("cuda" in page.selectbox(key="retrain_device").options) == torch.cuda.is_available()
    assert page.multiselect(key="reg_names").value == ["entropy"]
    assert page.select_slider(key="reg_lambda_entropy").value == pytest.approx(0.1)
    assert "No run yet" in page.info[0].value


def test_the_top_k_input_is_its_declaration(page):
    """top-k's k is RegSpec's declared setting: its label, help and lower bound, and the model's context above."""
    from attn_core.declarations import declared
    from attn_core.regularizers import RegSpec

    page.multiselect(key="reg_names").set_value(["topk"])
    page.run()
    k, widget = page.number_input(key="reg_k_topk"), declared(RegSpec, "k")["widget"]
    assert (k.label, k.help, k.min, k.value) == (widget["label"], widget["help"], 1, 1)
    assert k.max == resolve(MODEL).config.n_ctx


def test_short_retraining_completes_and_is_stored(page):
    page.multiselect(key="reg_names").set_value(["entropy", "topk"])
    page.run()
    page.select_slider(key="reg_lambda_topk").set_value(0.31622777)
    page.number_input(key="reg_k_topk").set_value(2)
    page.radio(key="reg_scope").set_value("layer")
    page.number_input(key="retrain_steps").set_value(12)
    page.run()
    page.button(key="retrain_start").click().run()
    assert not page.exception and not page.error
    poll(page, lambda at: job(at).snapshot().done and at.success)
    page.run()  # the page reran itself once the run ended (st.rerun); a later rerun shows the same

    snap = job(page).snapshot()
    assert snap.status == "completed" and snap.step == 12
    # it trained in a worker process of its own, not in the server's (watching costs it little)
    worker = job(page).remote.process
    assert worker is not None and worker.pid != os.getpid() and worker.wait(timeout=60) == 0
    assert not job(page).built  # the server builds no model of a worker's job
    assert f"run:{snap.run_id}" in page.success[0].value
    stored = runs.RunStore().get(snap.run_id)
    assert stored["status"] == "completed" and stored["has_weights"]
    assert stored["config"]["source"] == MODEL and stored["config"]["heads"] == "L0"
    assert stored["config"]["regularizers"] == ["entropy=0.1", "topk:2=0.316228"]
    assert stored["config"]["steps"] == 12
    # the new run is in the shared picker at once, and loads as a model
    assert any(o.startswith(f"run:{snap.run_id} · ") for o in page.sidebar.selectbox(key="model_choice").options)
    assert resolve(runs.RunStore().path(snap.run_id)).config.n_heads == 2

    curves = chart(page, "live_curves")
    names = {t["name"] for t in curves["data"]}
    assert {"task loss", "entropy", "topk:2"} <= names
    assert {"λ·R entropy", "λ·R topk:2"} <= {m.label for m in page.metric}  # each term lambda * R
    assert "entropy" in {m.label for m in page.metric}  # short: "entropy (regularized heads)" was cut off
    assert "L0H0" in chart(page, "live_pattern")["layout"]["title"]["text"]
    assert "L0H0" in chart(page, "live_spectrum")["layout"]["title"]["text"]
    assert len(page.download_button) == 4 * 4 + 1  # downloads only once the run has ended
    assert not page.button(key="retrain_start").proto.disabled


def test_stop_ends_a_long_run_and_keeps_it(page):
    page.number_input(key="retrain_steps").set_value(5000).run()
    page.button(key="retrain_start").click().run()
    poll(page, lambda at: job(at).snapshot().step > 0)
    assert page.button(key="retrain_stop").proto.disabled is False
    assert page.button(key="retrain_start").proto.disabled is True
    assert not page.download_button  # while it trains the charts have no downloads
    page.button(key="retrain_stop").click().run()
    poll(page, lambda at: job(at).snapshot().done and at.success)
    snap = job(page).snapshot()
    assert snap.status == "stopped" and 0 < snap.step < 5000
    assert runs.RunStore().get(snap.run_id)["status"] == "stopped"

    # another model picked afterwards: its heads do not exist in the run's model
    page.sidebar.selectbox(key="model_choice").select("induction-2l").run()
    page.selectbox(key="layer").select(1).run()
    assert not page.exception
    assert "no head L1H0" in page.info[0].value


def test_a_new_tab_shows_the_running_job_with_its_curves(page):
    """A run started in one session is shown, with its curves, to a session that opens the page
    while it trains (it said "No run yet"); that session may start its own run (which waits in
    line), and only the session that started a run stops it."""
    page.number_input(key="retrain_steps").set_value(5000).run()
    page.button(key="retrain_start").click().run()
    poll(page, lambda at: job(at).snapshot().step > 0)
    try:
        other = open_page(PAGE, MODEL)
        poll(other, lambda at: any(t.get("x") is not None and len(t["x"]) for t in chart(at, "live_curves")["data"]))
        assert other.session_state["retrain_watched_job"] is job(page) and not job(page).snapshot().done
        assert not any("No run yet" in i.value for i in other.info)
        assert "running: step" in other.get("progress")[0].proto.text
        assert "task loss" in {t["name"] for t in chart(other, "live_curves")["data"]}
        assert other.button(key="retrain_start").proto.disabled is False
        assert other.button(key="retrain_stop").proto.disabled is True
    finally:
        job(page).stop()
        poll(page, lambda at: job(at).snapshot().done)
    assert job(page).snapshot().status == "stopped"


def test_a_diverged_run_says_so(tmp_path, monkeypatch):
    """A random model whose unembedding is 10^3 times too large: its task loss is far beyond a
    uniform guess's, so the guard ends the run at step 1 (in the job's worker process: nothing
    here can reach into it) and keeps the weights it started from."""
    from tests.conftest import make_tiny_model

    model = make_tiny_model("reverse", std=0.3)
    with torch.no_grad():
        model.unembed.W_U.mul_(1e3)
    checkpoint.save(model, tmp_path / "models" / "loud", card={"task": "reverse"})
    monkeypatch.setenv("ATTN_LAB_MODELS", str(tmp_path / "models"))
    page = open_page(PAGE, "loud")
    page.number_input(key="retrain_steps").set_value(50).run()
    page.button(key="retrain_start").click().run()
    poll(page, lambda at: job(at).snapshot().done and at.error)
    message = page.error[0].value
    assert "diverged at step 1: task loss" in message and "kept weights of step 0" in message
    assert runs.RunStore().list_runs()[0]["status"] == "diverged"


def test_a_model_without_a_task_cannot_be_retrained(tmp_path, monkeypatch):
    loaded = resolve(MODEL)
    checkpoint.save(loaded.model, tmp_path / "models" / "no-task", card={"description": "no task"})
    monkeypatch.setenv("ATTN_LAB_MODELS", str(tmp_path / "models"))
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params["model"] = "no-task"
    at.run()
    assert not at.exception
    assert "no known task" in at.warning[0].value and not at.button


def test_before_start_the_model_is_shown_as_it_is(page):
    """No empty form: before Start the per-head entropy, the attention and the watched head's
    spectrum of the model as it is are drawn, with telemetry's numbers (what a job logs at step 0),
    and a run's charts continue from those values."""
    from dashboard_helpers import values

    from attn_core import regularizers as R
    from attn_core.training import telemetry
    from attn_core.training.config import JobConfig

    model = resolve(MODEL).model
    probe = TrainingJob.open(JobConfig(MODEL, device="cpu"), store=False).probe.tokens  # the job's probe batch
    row = telemetry.telemetry_row(model, probe, [(0, 0)])  # default scope: the watched head L0H0
    sigma = telemetry.spectra_row(R.head_spectra(model))
    assert "No run yet" in page.info[0].value and any("Step 0" in c.value for c in page.caption)

    entropy = chart(page, "live_entropy")
    by_name = {t["name"]: t for t in entropy["data"]}
    for h in ("L0H0", "L0H1"):
        assert values(by_name[h]["x"]).tolist() == [0]
        assert values(by_name[h]["y"]).tolist() == pytest.approx([row[f"entropy_data:{h}"]], rel=1e-6)
    assert values(by_name["mean (regularized heads)"]["y"]).tolist() == pytest.approx([row["entropy_data"]], rel=1e-6)
    spectrum = chart(page, "live_spectrum")
    fan = [values(t["y"]).tolist() for t in spectrum["data"] if t.get("legendgroup") == "sigma"]  # σ1, σ2, ...
    n = sum(1 for k in sigma if k.startswith("sigma:L0H0:"))
    assert [fan[i][0] for i in range(n)] == pytest.approx([sigma[f"sigma:L0H0:{i}"] for i in range(n)], rel=1e-6)
    stable = [t for t in spectrum["data"] if t["name"].startswith("stable rank")]
    assert values(stable[0]["y"]).tolist() == pytest.approx([sigma["stable_rank:L0H0"]], rel=1e-6)
    assert "step 0" in chart(page, "live_pattern")["layout"]["title"]["text"]
    assert not page.download_button  # downloads come with a finished run

    # a run starts where the preview stands: its step 0 is the parent model
    page.number_input(key="retrain_steps").set_value(5)
    page.selectbox(key="retrain_device").set_value("cpu")
    page.run()
    page.button(key="retrain_start").click().run()
    poll(page, lambda at: job(at).snapshot().done and at.success)
    log = job(page).snapshot().metrics()
    at0 = log[log["step"] == 0].set_index("name")["value"]
    assert at0["entropy_data:L0H0"] == pytest.approx(row["entropy_data:L0H0"], rel=1e-6)
    assert at0["sigma:L0H0:0"] == pytest.approx(sigma["sigma:L0H0:0"], rel=1e-6)
    assert values(chart(page, "live_entropy")["data"][0]["x"]).tolist()[0] == 0


def test_precision_picker(page):
    assert page.selectbox(key="retrain_precision").value == "fp32"
    assert page.selectbox(key="retrain_precision").options == list(PRECISIONS)


def test_the_training_inputs_are_the_declared_settings(page):
    from attn_core.declarations import declared
    from attn_core.training.config import JobConfig

    shown = {
        "lr": page.select_slider(key="retrain_lr"),
        "precision": page.selectbox(key="retrain_precision"),
        "compile": page.checkbox(key="retrain_compile"),
        "steps": page.number_input(key="retrain_steps"),
    }
    for name, widget in shown.items():
        declared_widget = declared(JobConfig, name)["widget"]
        assert (widget.label, widget.help) == (declared_widget["label"], declared_widget["help"]), name
        assert widget.value == getattr(JobConfig("x"), name), name


def test_alpha_device_and_lambda_are_the_declared_settings(page):
    """The entmax alpha, device and lambda inputs are built from JobConfig's declarations: label,
    help, choices; the page gives the devices present and a regularizer's name and what it penalises."""
    from attn_core import regularizers as R
    from attn_core.declarations import declared
    from attn_core.training.config import JobConfig

    alpha, device = page.select_slider(key="entmax_alpha"), page.selectbox(key="retrain_device")
    lam = page.select_slider(key="reg_lambda_entropy")
    for name, widget, words in (
        ("entmax_alpha", alpha, {}),
        ("device", device, {}),
        ("regularizers", lam, {"penalty": "entropy", "what": R.REGULARIZERS["entropy"][1]}),
    ):
        declared_widget = declared(JobConfig, name)["widget"]
        want = (declared_widget["label"].format(**words), declared_widget["help"].format(**words))
        assert (widget.label, widget.help) == want, name
    assert alpha.options == [declared(JobConfig, "entmax_alpha")["widget"]["labels"][a] for a in alpha_options()]
    assert alpha.value is None and device.value == available_devices()[-1]
    assert lam.value == declared(JobConfig, "regularizers")["widget"]["value"]


def alpha_options() -> tuple:
    from attn_core.declarations import declared
    from attn_core.training.config import JobConfig

    return declared(JobConfig, "entmax_alpha")["widget"]["options"]


def test_a_second_session_waits_in_line_and_says_so(monkeypatch):
    """One job trains at a time per server (ATTN_LAB_MAX_JOBS=1): a second browser session's run
    is queued, says how many jobs are ahead, and trains once the first ends."""
    monkeypatch.setenv("ATTN_LAB_MAX_JOBS", "1")
    first, second = open_page(PAGE, MODEL), open_page(PAGE, MODEL)
    first.number_input(key="retrain_steps").set_value(100_000).run()
    first.button(key="retrain_start").click().run()
    try:
        poll(first, lambda at: job(at).snapshot().step > 0)
        second.number_input(key="retrain_steps").set_value(5).run()
        second.button(key="retrain_start").click().run()
        assert not second.exception and not second.error
        assert job(second).snapshot().status == "queued"
        assert any("queued: 1 job ahead" in i.value for i in second.info)
        assert second.button(key="retrain_stop").proto.disabled is False  # it can leave the line
        assert job(second).snapshot().step == 0
    finally:
        first.button(key="retrain_stop").click().run()
    poll(first, lambda at: job(at).snapshot().done)
    poll(second, lambda at: job(at).snapshot().done and at.success)
    assert job(second).snapshot().status == "completed" and job(second).snapshot().step == 5
    assert runs.RunStore().get(job(second).snapshot().run_id)["status"] == "completed"


def test_a_mis_set_job_limit_is_said_and_nothing_starts(page, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_MAX_JOBS", "many")
    page.button(key="retrain_start").click().run()
    assert "ATTN_LAB_MAX_JOBS must be a whole number" in page.error[0].value
    assert "retrain_job" not in page.session_state and runs.RunStore().list_runs() == []


def test_a_broken_run_store_is_said_before_anything_trains(page, monkeypatch, tmp_path):
    root = tmp_path / "broken"
    root.mkdir()
    (root / "index.sqlite").write_bytes(b"not a database at all" * 100)
    monkeypatch.setenv("ATTN_LAB_RUNS", str(root))
    page.button(key="retrain_start").click().run()
    assert not page.exception
    assert any("is not a SQLite database" in e.value and "not started" in e.value for e in page.error)
    assert "retrain_job" not in page.session_state
