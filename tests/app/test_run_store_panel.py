"""The Runs and Sweeps pages say where the run store is and why, and offer the runs of an older
release's `runs/` folder (the store that followed the current folder): one click copies them in,
the old folder is left as it was."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from attn_core.runs import ENV_RUNS, RunStore
from tests.conftest import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]
RUNS_PAGE = str(ROOT / "app_pages" / "4_Runs.py")
SWEEPS_PAGE = str(ROOT / "app_pages" / "10_Sweeps.py")


@pytest.fixture
def old_store(tmp_path, monkeypatch) -> tuple[Path, str]:
    """A user without $ATTN_LAB_RUNS, started from a folder whose ./runs holds a run of an
    older release; returns (that folder's runs, the run id)."""
    monkeypatch.delenv(ENV_RUNS, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    work = tmp_path / "work"
    old = RunStore(work / "runs")
    run_id = old.add_run(
        "reverse-1l",
        "reverse",
        {"steps": 2, "regularizers": ["entropy=0.1"]},
        "completed",
        model=make_tiny_model("reverse"),
        card={"task": "reverse"},
        summary={"before": {"accuracy": 0.5, "entropy_data": 0.9}, "after": {"accuracy": 0.6, "entropy_data": 0.8}},
    )
    old.close()
    monkeypatch.chdir(work)
    return work / "runs", run_id


def test_runs_page_names_the_store_and_imports_an_old_one(old_store, tmp_path):
    path, run_id = old_store
    at = AppTest.from_file(RUNS_PAGE, default_timeout=90)
    at.query_params["model"] = "reverse-1l"
    at.run()
    assert not at.exception
    where = tmp_path / "xdg" / "attn-lab" / "runs"
    assert any(f"Run store: `{where}`" in c.value and "this user's default" in c.value for c in at.caption)
    offer = [i.value for i in at.info if str(path) in i.value]
    assert offer and offer[0].startswith("1 run(s) in")
    assert any("No finished runs" in i.value for i in at.info)  # nothing here yet
    at.button(key=f"import_store_{path}").click().run()
    assert not at.exception
    assert any("Imported 1 run(s)" in s.value for s in at.success)
    assert [r["id"] for r in RunStore(where).list_runs()] == [run_id]
    assert list(at.dataframe[0].value["id"]) == [run_id]  # the page lists it now
    assert not any(str(path) in i.value for i in at.info)  # and offers nothing more
    assert [r["id"] for r in RunStore(path).list_runs()] == [run_id]  # the old store still has it


def test_sweeps_page_names_the_store(old_store, tmp_path):
    at = AppTest.from_file(SWEEPS_PAGE, default_timeout=90).run()
    assert not at.exception
    where = tmp_path / "xdg" / "attn-lab" / "runs"
    assert any(f"Run store: `{where}`" in c.value for c in at.caption), [c.value for c in at.caption]
