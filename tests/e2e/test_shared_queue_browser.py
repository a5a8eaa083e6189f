"""Shared mode and the job queue in headless Chromium, with a real OpenID Connect provider on
loopback (tests/e2e/test_shared_login_browser.py has the provider and the server): two users
log in and each starts a retrain on a server that trains one job at a time
(ATTN_LAB_MAX_JOBS=1); neither sees or can stop the other's, the second waits in the queue with
its place shown and trains when the first ends, and each run lands in its owner's store.
Screenshots: tests/artifacts/shared_queue_*.png."""

from __future__ import annotations

import re
import time

import pytest

from benchmarks.dashboard import CHROMIUM, VIEWPORT, launch, new_page, screenshot, settle
from tests.e2e.test_shared_login_browser import ARTIFACTS, log_in, logged_in, provider, shared_dashboard, store_of

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]
pytest.importorskip("oidc_provider_mock")
RUNNING = re.compile(r"running: step [1-9]")


def start_retrain(page, url: str, who: str, steps: int) -> None:
    """Open Retrain on reverse-1l as ``who``, set the steps and press Start."""
    page.goto(f"{url}/Retrain?model=reverse-1l")
    logged_in(page, who)
    box = page.get_by_role("spinbutton", name="Steps")
    box.fill(str(steps))
    box.press("Enter")
    settle(page)
    page.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Start").click()


def queued_users(tmp_path, issuer: str, who: str) -> list[str]:
    """The owners of the queue entries that ``who`` sees: what their page's queue panel lists and
    may cancel (``JobQueue.entries`` of the machine's one queue, as the panel reads it)."""
    from attn_core.training.queue import JobQueue

    uid = store_of(tmp_path, issuer, who).root.name
    return [e["user"] for e in JobQueue(tmp_path / "runs").entries(uid)]


def test_two_users_share_one_queue_and_only_their_own_jobs(tmp_path):
    from playwright.sync_api import sync_playwright

    with provider() as issuer, shared_dashboard(tmp_path, issuer) as url, sync_playwright() as p:
        browser = launch(p)
        pages = {}
        for who in ("alice", "bob"):
            pages[who] = new_page(browser.new_context(viewport=VIEWPORT))
            pages[who].set_default_timeout(180_000)
            log_in(pages[who], url, who)
        alice, bob = pages["alice"], pages["bob"]

        start_retrain(alice, url, "alice", 50_000)  # long: it trains until alice stops it
        alice.get_by_text(RUNNING).wait_for()

        # bob's Retrain page shows nothing of alice's job, and its Stop is not for it
        bob.goto(f"{url}/Retrain?model=reverse-1l")
        logged_in(bob, "bob")
        assert bob.get_by_text(RUNNING).count() == 0
        assert bob.get_by_role("button", name="Stop").is_disabled()
        assert bob.get_by_text("Your jobs in the server's queue").count() == 0

        # bob's retrain waits behind alice's, its place shown; his queue lists his entry alone
        start_retrain(bob, url, "bob", 200)
        # the page's status line (the queue panel's table holds the same words in a hidden cell)
        bob.get_by_text(re.compile(r"queued: 1 job ahead, 1st in line")).filter(visible=True).first.wait_for()
        bob.get_by_text("Your jobs in the server's queue").wait_for()
        bob_id, alice_id = store_of(tmp_path, issuer, "bob").root.name, store_of(tmp_path, issuer, "alice").root.name
        assert queued_users(tmp_path, issuer, "bob") == [bob_id]  # his entry alone: alice's is not his to see or cancel
        screenshot(bob, ARTIFACTS / "shared_queue_bob_waits.png")
        assert alice.get_by_text(RUNNING).count() == 1  # alice's job trains on
        assert queued_users(tmp_path, issuer, "alice") == [alice_id]
        assert alice.get_by_text("queued: ").count() == 0  # bob's waiting job is not shown to alice
        assert store_of(tmp_path, issuer, "bob").list_runs() == []

        # alice stops her run; then bob's trains and ends, each in its owner's store
        alice.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Stop").click()
        alice_store, bob_store = store_of(tmp_path, issuer, "alice"), store_of(tmp_path, issuer, "bob")
        deadline = time.monotonic() + 600
        while not (alice_store.list_runs() and alice_store.list_runs()[0]["status"] != "running"):
            assert time.monotonic() < deadline, "alice's run did not stop"
            time.sleep(0.5)
        while not (bob_store.list_runs() and bob_store.list_runs()[0]["status"] != "running"):
            assert time.monotonic() < deadline, "bob's run did not run after alice's"
            time.sleep(0.5)
        assert [r["status"] for r in alice_store.list_runs()] == ["stopped"]
        assert [r["status"] for r in bob_store.list_runs()] == ["completed"]
        assert bob_store.list_runs()[0]["created"] >= alice_store.list_runs()[0]["finished"]
        bob.get_by_text(re.compile(r"completed")).filter(visible=True).first.wait_for()
        screenshot(bob, ARTIFACTS / "shared_queue_bob_done.png")
        assert bob.get_by_test_id("stException").count() == 0 and alice.get_by_test_id("stException").count() == 0
        browser.close()
