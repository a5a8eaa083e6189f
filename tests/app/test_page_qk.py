"""app_pages/8_Merged_vs_factored_QK.py: the saved comparison on screen, a fresh one on demand (with
its runs in the store), bad settings as st.error, every figure exportable; and the same page in a
real browser."""

import io
import json
import os
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

import ui
from attn_core import qk as Q
from attn_core.figures import bundle_zip, export_bytes
from attn_core.runs import RunStore

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "app_pages" / "8_Merged_vs_factored_QK.py")
FIGURES = [
    "qk_curves_eval_loss",
    "qk_curves_eval_accuracy",
    "qk_final",
    "qk_cost",
    "qk_stable_rank",
    "qk_spectrum",
    "qk_truncation",
]
HEADERS = [
    "Summary",
    "What the numbers say",
    "Learning curves",
    "Final loss and accuracy",
    "Parameters and time per step",
    "Rank of the learned B",
]
SMALL = dict(
    task="induction",
    steps=6,
    seeds=2,
    d_qks=(1,),
    d_model=8,
    d_head=4,
    batch_size=8,
    eval_every=3,
    eval_samples=16,
    measure_samples=16,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These models are tiny: one thread is as fast as two, and far faster on a busy machine
    (oversubscribed intra-op threads spin); restored afterwards for the other test files."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small saved comparison standing in for experiments/results (the page reads any)."""
    return Q.compare(Q.CompareConfig(**SMALL), store=False).save(tmp_path_factory.mktemp("results") / "c.json")


@pytest.fixture
def page_with(monkeypatch):
    def make(path):
        monkeypatch.setattr(Q, "results_path", lambda root=None: Path(path))
        at = AppTest.from_file(PAGE, default_timeout=120)
        at.run()
        return at

    return make


def test_saved_comparison_is_shown_instantly(page_with, saved):
    at = page_with(saved)
    assert not at.exception and not at.error
    assert [h.value for h in at.header] == HEADERS
    assert len(at.get("plotly_chart")) == len(FIGURES)
    assert len(at.download_button) == 4 * len(FIGURES) + 1  # PNG/SVG/HTML/CSV each + the zip
    table = at.dataframe[0].value
    assert list(table["name"]) == ["factored d_qk=1", "merged", "merged + wd", "merged + nuclear"]
    assert list(table["params_qk_per_head"]) == [2 * 8 * 1, 64, 64, 64]
    shown = " ".join(m.value for m in at.markdown)
    assert all(f in shown for f in Q.Comparison.load(saved).findings())
    assert "attn-lab compare-qk --task induction --steps 6 --seeds 2" in at.caption[0].value
    assert len(at.latex) >= 2  # the two parametrisations and the nuclear-norm identity


@pytest.mark.parametrize(
    "content, message",
    [(None, "no saved comparison"), ("{", "not valid JSON"), ('{"config": {}, "runs": 3}', "not a saved comparison")],
)
def test_missing_or_broken_saved_file_is_a_message(page_with, tmp_path, content, message):
    path = tmp_path / "c.json"
    if content is not None:
        path.write_text(content)
    at = page_with(path)
    assert not at.exception and not at.error
    assert message in at.info[0].value and len(at.get("plotly_chart")) == 0


def _fresh(at):
    at.radio(key="qk_source").set_value("fresh").run()
    assert not at.exception and not at.error
    return at


def test_the_fresh_inputs_are_compareconfigs_declarations(page_with, tmp_path):
    """Every input of a fresh comparison is CompareConfig's declared setting: its label, help, lower
    bound and choices; its default, or the page's smaller one (200 steps, one seed, two factored
    widths); the declared upper bound, or the page's tighter one for a server."""
    from attn_core.declarations import declared
    from attn_core.tasks import TASKS
    from attn_core.validate import default

    at = _fresh(page_with(tmp_path / "none.json"))

    def shown(name: str) -> dict:
        return declared(Q.CompareConfig, name)["widget"]

    decay = default(Q.CompareConfig, "weight_decay")
    for name, key, hi, value in (
        ("steps", "qk_steps", 5000, 200),
        ("seeds", "qk_seeds", 10, 1),
        ("qk_weight_decay", "qk_wd", 100.0, default(Q.CompareConfig, "qk_weight_decay")),
        ("nuclear", "qk_nuclear", 100.0, default(Q.CompareConfig, "nuclear")),
    ):
        box, widget = at.number_input(key=key), shown(name)
        lo = declared(Q.CompareConfig, name)["bounds"][0]
        assert (box.label, box.min, box.max, box.value, box.step) == (widget["label"], lo, hi, value, widget["step"])
        assert box.help == widget["help"].format(decay=decay)
    assert "0.1" in at.number_input(key="qk_wd").help  # the recipe's weight decay, filled in
    for name, key, options, value in (
        ("task", "qk_task", list(TASKS), "induction"),
        ("d_model", "qk_d_model", list(shown("d_model")["options"]), 32),
    ):
        box, widget = at.selectbox(key=key), shown(name)
        assert (box.label, box.help, box.options, box.value) == (
            widget["label"],
            widget["help"],
            list(map(str, options)),
            value,
        )
    assert default(Q.CompareConfig, "task") == "induction" and default(Q.CompareConfig, "d_model") == 32
    for name, key, value in (("d_qks", "qk_d_qks", [2, 16]), ("merged_kinds", "qk_kinds", list(Q.VARIANT_KINDS[1:]))):
        box, widget = at.multiselect(key=key), shown(name)
        assert (box.label, box.help, box.value) == (widget["label"], widget["help"], value)
        assert box.options == [str(o) for o in widget["options"]]
    assert list(default(Q.CompareConfig, "merged_kinds")) == list(Q.VARIANT_KINDS[1:])


def test_fresh_comparison_trains_and_saves_runs(page_with, tmp_path):
    at = _fresh(page_with(tmp_path / "none.json"))
    assert "Run comparison" in at.info[0].value
    at.number_input(key="qk_steps").set_value(10)
    at.selectbox(key="qk_d_model").set_value(16)
    at.multiselect(key="qk_d_qks").set_value([2])
    at.multiselect(key="qk_kinds").set_value(["merged", "merged + nuclear"])
    at.button(key="qk_run").click().run()
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert list(table["name"]) == ["factored d_qk=2", "merged", "merged + nuclear"]
    assert list(table["rank_cap"]) == [2, 16, 16]
    assert len(at.get("plotly_chart")) == len(FIGURES)
    runs = RunStore().list_runs()  # $ATTN_LAB_RUNS: a tmp folder (conftest)
    assert len(runs) == 3 and {r["parent"] for r in runs} == {"compare-qk:induction"}
    at.checkbox(key="qk_save").uncheck().run()  # the result stays on screen across reruns
    assert not at.exception and len(at.get("plotly_chart")) == len(FIGURES)


@pytest.mark.parametrize(
    "widget, value, message",
    [
        ("qk_d_qks", [64], r"outside 1..32"),
        ("qk_kinds", [], "no variant"),
    ],
)
def test_bad_fresh_settings_show_an_error(page_with, tmp_path, widget, value, message):
    at = _fresh(page_with(tmp_path / "none.json"))
    if widget == "qk_kinds":
        at.multiselect(key="qk_d_qks").set_value([])
    at.multiselect(key=widget).set_value(value)
    at.button(key="qk_run").click().run()
    assert not at.exception
    assert len(at.error) == 1 and message in at.error[0].value
    assert len(at.get("plotly_chart")) == 0


def test_export_all_gets_every_figure_and_the_settings(page_with, saved, monkeypatch):
    calls = []
    monkeypatch.setattr(ui, "export_all", lambda plots, manifest, key: calls.append((plots, manifest, key)))
    at = page_with(saved)
    assert not at.exception
    ((plots, manifest, key),) = calls
    assert [p.name for p in plots] == FIGURES and key == "merged_vs_factored_qk"
    blob = bundle_zip(plots, manifest, formats=("csv",))
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        saved_manifest = json.loads(zf.read("manifest.json"))
        assert {f"{name}.csv" for name in FIGURES} <= set(zf.namelist())
    assert b"plotly" in export_bytes(plots[0], "html")
    assert saved_manifest["page"] == "Merged vs factored QK" and saved_manifest["source"] == "saved"
    assert saved_manifest["config"]["steps"] == 6 and len(saved_manifest["variants"]) == 4
    assert saved_manifest["skipped"] == []


def test_the_shipped_results_are_a_full_comparison():
    result = Q.Comparison.load(Q.results_path())
    names = [r["name"] for r in result.summary()]
    assert names == [
        "factored d_qk=1",
        "factored d_qk=2",
        "factored d_qk=4",
        "factored d_qk=16",
        "merged",
        "merged + wd",
        "merged + nuclear",
    ]
    assert result.config.seeds >= 3 and all(r["seeds"] == result.config.seeds for r in result.summary())
    assert Q.results_path().with_suffix(".md").read_text() == result.markdown()


# --- in a real browser --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.browser
def test_page_renders_in_chromium(tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("needs Debian's chromium at /usr/bin/chromium")
    port = _free_port()
    env = {**os.environ, "ATTN_LAB_RUNS": str(tmp_path / "runs")}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(ROOT / "app.py"),
            "--server.headless=true",
            f"--server.port={port}",
            "--browser.gatherUsageStats=false",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium")
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for _ in range(120):  # the server needs a few seconds to start
                try:
                    page.goto(f"http://127.0.0.1:{port}/Merged_vs_factored_QK", timeout=5000)
                    break
                except playwright.Error:
                    time.sleep(0.5)
            page.get_by_role("heading", name="Summary").wait_for(timeout=90_000)
            page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
            assert page.locator(".js-plotly-plot").count() == len(FIGURES)
            assert page.get_by_text("What the numbers say").count() >= 1
            assert page.locator("[data-testid='stException']").count() == 0
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
