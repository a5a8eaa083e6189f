"""AppTest of the Retrain page's workers (attn_core.distributed): offered only when Ray would see
more than one GPU or a cluster is named ($RAY_ADDRESS); a run asked for on workers of a cluster
that cannot be reached is refused in one line, before anything starts; a run on workers shows
each worker's throughput and memory (Snapshot.workers_table)."""

from pathlib import Path

import pytest
import torch
from dashboard_helpers import open_page

from attn_core.declarations import declared
from attn_core.training.config import JobConfig
from attn_core.training.scaling import workers_offer
from attn_core.training.snapshot import Snapshot

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "app_pages" / "3_Retrain.py")
MODEL = "reverse-1l"


def test_no_workers_on_a_machine_with_one_device_or_none(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if torch.cuda.device_count() > 1:  # pragma: no cover - a machine with GPUs offers them
        pytest.skip("this machine has several GPUs")
    assert workers_offer() is None
    page = open_page(PAGE, MODEL)
    assert not any(w.key == "retrain_workers" for w in page.number_input)


def test_a_named_cluster_offers_workers_and_an_unreachable_one_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # nothing listens on port 1
    page = open_page(PAGE, MODEL)
    workers = page.number_input(key="retrain_workers")
    assert "the Ray cluster at 127.0.0.1:1" in workers.label and workers.value == 0
    declared_widget = declared(JobConfig, "workers")["widget"]  # the input is the declared setting
    assert workers.help == declared_widget["help"] and workers.label.startswith(declared_widget["label"][:11])
    workers.set_value(2)
    page.run()
    assert page.selectbox(key="retrain_strategy").options == ["ddp", "fsdp"]
    assert page.selectbox(key="retrain_gpus").options == ["0", "1"]
    for key, name in (("retrain_strategy", "strategy"), ("retrain_gpus", "gpus_per_worker")):  # their declarations
        widget = declared(JobConfig, name)["widget"]
        assert (page.selectbox(key=key).label, page.selectbox(key=key).help) == (widget["label"], widget["help"])
    assert (page.selectbox(key="retrain_strategy").value, page.selectbox(key="retrain_gpus").value) == ("ddp", 0)
    page.button(key="retrain_start").click()
    page.run()
    assert not page.exception
    error = page.error[0].value
    assert error.startswith("The run was not started: cannot reach the Ray cluster at 127.0.0.1:1")
    assert (
        "\n" not in error and page.session_state["retrain_job"] is None if "retrain_job" in page.session_state else True
    )


def test_each_workers_throughput_and_memory_as_a_table():
    workers = (
        {"rank": 0, "host": "a", "pid": 10, "device": "cpu", "steps": 40, "steps_per_s": 5.5, "peak_mib": 480.0},
        {"rank": 1, "host": "a", "pid": 11, "device": "cpu", "steps": 40, "steps_per_s": 5.25, "peak_mib": 470.5},
    )
    snap = Snapshot(
        status="running", message="", step=40, steps=100, run_id="r", elapsed_s=1.0, train_s=1.0, step_s=1.0,
        latest={}, regularized_heads=(), n_layers=1, n_heads=2, before=None, after=None, probe_tokens=(),
        probe_pattern=None, probe_step=0, workers=workers,
    )  # fmt: skip
    table = snap.workers_table()
    assert list(table.columns) == ["rank", "host", "device", "steps", "steps/s", "peak memory (MiB)"]
    assert table["steps/s"].tolist() == [5.5, 5.25] and table["peak memory (MiB)"].tolist() == [480.0, 470.5]
    assert snap.__class__(**{**snap.__dict__, "workers": ()}).workers_table().empty  # a run in one process
