"""AppTest of the Retrain page with the server's job queue: a job waiting behind another says
its place (and the page lists it with a Cancel); Cancel takes it out of the line and it never
trains; an entry a killed server left running is said to be interrupted."""

import os
import time
from pathlib import Path

from dashboard_helpers import open_page
from streamlit.testing.v1 import AppTest

from attn_core import runs
from attn_core.training.queue import JobQueue

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "app_pages" / "3_Retrain.py")
MODEL = "reverse-1l"


def poll(at: AppTest, done, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done(at):
        assert time.monotonic() < deadline, "the page did not get there in time"
        time.sleep(0.3)
        at.run()
        assert not at.exception, at.exception


def test_a_waiting_job_shows_its_place_and_cancel_takes_it_out_of_the_line(monkeypatch):
    monkeypatch.setenv("ATTN_LAB_MAX_JOBS", "1")
    queue = JobQueue()
    other = queue.submit(user="", kind="retrain", device="cpu", spec={}, estimate_s=120.0)
    assert queue.claim(other)  # another session's job trains on the CPU
    page = open_page(PAGE, MODEL)
    page.selectbox(key="retrain_device").set_value("cpu")
    page.number_input(key="retrain_steps").set_value(5).run()
    page.button(key="retrain_start").click().run()
    assert not page.exception and not page.error, [e.value for e in page.error]
    job = page.session_state["retrain_job"]
    assert job.snapshot().status == "queued"
    info = " ".join(i.value for i in page.info)
    assert "queued: 1 job ahead, 1st in line" in info and "estimated wait" in info and "a range" in info
    assert any("Your jobs in the server's queue" in m.value for m in page.markdown)
    entry = job._ticket  # the page's job's entry, listed first (the waiting before the running)
    assert page.selectbox(key="queue_pick_retrain").options == [f"entry {entry}", f"entry {other}"]
    assert queue.get(entry, "")["status"] == "waiting"
    page.selectbox(key="queue_pick_retrain").set_value(entry)
    page.button(key="queue_cancel_retrain").click().run()
    assert not page.exception
    poll(page, lambda at: job.snapshot().done)
    assert job.snapshot().status == "stopped" and "cancelled while queued" in job.snapshot().message
    assert job.snapshot().step == 0 and job.run_id is None
    assert queue.get(entry, "")["status"] == "cancelled"
    assert runs.RunStore().list_runs() == []  # it never trained
    queue.release(other)


def test_an_entry_of_a_killed_server_is_said_to_be_interrupted():
    queue = JobQueue()
    entry = queue.submit(user="", kind="retrain", device="cpu", spec={})
    assert queue.claim(entry)
    dead = 2**22 + 12345
    while True:  # a pid that no process of this host has
        try:
            os.kill(dead, 0)
            dead += 1
        except ProcessLookupError:
            break
        except PermissionError:
            dead += 1
    with queue.index.writer() as con:
        con.execute("UPDATE queue SET pid = ?, target = 'r1' WHERE id = ?", (dead, entry))
    page = open_page(PAGE, MODEL)
    assert not page.exception
    assert any("run `r1` was interrupted" in w.value and "not run again by itself" in w.value for w in page.warning)
    assert queue.get(entry, "")["status"] == "interrupted"
