"""The dashboard's shared mode in headless Chromium, logged in through a real OpenID Connect
provider on loopback (oidc-provider-mock: its authorize page takes the user's ``sub``), with a
real ``streamlit run app.py`` and a temporary secrets.toml (``--secrets.files``; nothing is
written into the repository). Two users log in and see only their own runs; a forged identity
cookie is no login; two tabs of one user share one store; a user who closes the tab of a running
retrain finds it running when they come back, and its run lands in their store alone.
Screenshots: tests/artifacts/shared_*.png."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from attn_core import runs
from attn_core.runs import users
from benchmarks.dashboard import CHROMIUM, VIEWPORT, free_port, launch, new_page, screenshot, settle

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
COOKIE_SECRET = "a-test-cookie-secret-0123456789abcdef"
COOKIE = "_streamlit_user"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]
oidc_provider_mock = pytest.importorskip("oidc_provider_mock")


@contextmanager
def provider() -> Iterator[str]:
    """oidc-provider-mock on 127.0.0.1 and a free port, in a thread; yields its issuer URL.
    alice and bob are offered on its authorize page with a verified e-mail address each."""
    people = [
        oidc_provider_mock.User(sub=name, claims={"email": f"{name}@lab.example", "email_verified": True})
        for name in ("alice", "bob")
    ]
    with oidc_provider_mock.run_server_in_thread(port=free_port(), user_claims=people) as server:
        yield f"http://localhost:{server.server_port}"


@contextmanager
def shared_dashboard(tmp: Path, issuer: str) -> Iterator[str]:
    """``streamlit run app.py`` in shared mode on 127.0.0.1, its login at ``issuer``, its data
    in ``tmp/runs``; yields its URL. The server's output is in tmp/server.log."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    secrets = tmp / "secrets.toml"
    secrets.write_text(
        "[auth]\n"
        f'redirect_uri = "{url}/oauth2callback"\n'
        f'cookie_secret = "{COOKIE_SECRET}"\n'
        'client_id = "attn-lab"\n'
        'client_secret = "attn-lab-secret"\n'
        f'server_metadata_url = "{issuer}/.well-known/openid-configuration"\n'
    )
    env = dict(os.environ, ATTN_LAB_RUNS=str(tmp / "runs"), ATTN_LAB_SHARED="1", PYTHONPATH=str(ROOT))
    env.update(PYTHONUNBUFFERED="1", ATTN_LAB_MAX_JOBS="1")
    env.pop("ATTN_LAB_MODELS", None)
    env.pop("ATTN_LAB_ADMINS", None)
    cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.headless", "true"]
    cmd += ["--server.address", "127.0.0.1", "--server.port", str(port), "--server.fileWatcherType", "none"]
    cmd += ["--browser.gatherUsageStats", "false", "--secrets.files", str(secrets)]
    with open(tmp / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not _healthy(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"streamlit did not start:\n{(tmp / 'server.log').read_text()[-3000:]}")
                time.sleep(0.3)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
            return r.read().strip() == b"ok"
    except OSError:
        return False


def log_in(page, url: str, who: str, path: str = "") -> None:
    """Open the dashboard, press "Log in", pick ``who`` on the provider's page and wait until the
    dashboard says who is logged in."""
    page.goto(f"{url}/{path}")
    settle(page)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"/oauth2/authorize"))
    page.locator("input[name=sub]").fill(who)
    page.get_by_role("button", name="Authorize").click()
    logged_in(page, who)


def logged_in(page, who: str) -> None:
    """Wait until the sidebar says who is logged in: their e-mail as text (a word joiner after
    its "@"), never a mailto link."""
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_text(re.compile(rf"Logged in as {who}@\u2060?lab\.example")).wait_for()
    settle(page)
    assert sidebar.locator("a[href^='mailto:']").count() == 0


def picker_entries(page) -> list[str]:
    """The sidebar model picker's entries (opened, read, closed)."""
    page.get_by_role("combobox", name="Model", exact=True).click()
    page.get_by_role("option").first.wait_for()
    entries = page.get_by_role("option").all_inner_texts()
    page.keyboard.press("Escape")
    return entries


def store_of(tmp: Path, issuer: str, who: str) -> runs.RunStore:
    return runs.RunStore(users.store_of(users.user_id({"iss": issuer, "sub": who}), tmp / "runs"))


def test_logins_forged_cookies_and_own_stores(tmp_path):
    from playwright.sync_api import sync_playwright
    from streamlit.web.server.starlette.starlette_app_utils import create_signed_value

    with provider() as issuer, shared_dashboard(tmp_path, issuer) as url, sync_playwright() as p:
        browser = launch(p)
        # nobody logged in: a login and nothing else, whatever page the URL names
        stranger = new_page(browser.new_context(viewport=VIEWPORT))
        stranger.set_default_timeout(120_000)
        stranger.goto(f"{url}/Runs")
        settle(stranger)
        stranger.get_by_role("button", name="Log in").wait_for()
        assert stranger.get_by_role("combobox", name="Model").count() == 0
        assert "Compare runs" not in stranger.inner_text("body")
        screenshot(stranger, ARTIFACTS / "shared_login.png")

        # a forged identity cookie (signed with another secret; then one with a changed payload) is no login
        forged = json.dumps({"origin": url, "is_logged_in": True, "iss": issuer, "sub": "alice"})
        for value in (create_signed_value("not-the-secret", COOKIE, forged).decode(), forged):
            stranger.context.clear_cookies()
            stranger.context.add_cookies([{"name": COOKIE, "value": value, "url": url}])
            stranger.goto(url)
            settle(stranger)
            stranger.get_by_role("button", name="Log in").wait_for()
            assert "Logged in as" not in stranger.inner_text("body")

        # alice logs in (the provider's page), and a run of hers is made in her store
        alice = new_page(browser.new_context(viewport=VIEWPORT))
        alice.set_default_timeout(120_000)
        log_in(alice, url, "alice")
        screenshot(alice, ARTIFACTS / "shared_alice.png")
        mine = store_of(tmp_path, issuer, "alice")
        assert mine.root.is_dir() and not any(e.startswith("run:") for e in picker_entries(alice))

        # a tampered copy of alice's own cookie is no login either
        real = next(c for c in alice.context.cookies() if c["name"] == COOKIE)
        tampered = real["value"][:-4] + ("AAAA" if not real["value"].endswith("AAAA") else "BBBB")
        stranger.context.clear_cookies()
        stranger.context.add_cookies([{"name": COOKIE, "value": tampered, "url": url}])
        stranger.goto(url)
        settle(stranger)
        stranger.get_by_role("button", name="Log in").wait_for()

        # alice starts a retrain, closes its tab mid-job, and finds it running in a new tab
        tab = new_page(alice.context)
        tab.set_default_timeout(120_000)
        tab.goto(f"{url}/Retrain?model=reverse-1l")
        logged_in(tab, "alice")
        steps = tab.get_by_role("spinbutton", name="Steps")
        steps.fill("1500")
        steps.press("Enter")
        settle(tab)
        tab.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Start").click()
        tab.get_by_text(re.compile(r"running: step [1-9]")).wait_for()
        tab.close()  # the session is dropped mid-job
        back = new_page(alice.context)
        back.set_default_timeout(120_000)
        back.goto(f"{url}/Retrain")
        back.get_by_text(re.compile(r"running: step [1-9]|completed")).filter(visible=True).first.wait_for()
        screenshot(back, ARTIFACTS / "shared_back.png")

        # the run ends in alice's store
        deadline = time.monotonic() + 300
        while not [r for r in mine.list_runs() if r["status"] != "running"]:
            assert time.monotonic() < deadline, "alice's run did not end"
            time.sleep(0.5)
        run_id = mine.list_runs()[0]["id"]
        alice.reload()
        logged_in(alice, "alice")
        assert any(e.startswith(f"run:{run_id}") for e in picker_entries(alice))
        # two tabs of one user: the same store
        second = new_page(alice.context)
        second.set_default_timeout(120_000)
        second.goto(f"{url}/Runs")
        logged_in(second, "alice")
        # the Runs page's table lists it (a data grid: its cells are drawn, their text kept in hidden cells)
        second.get_by_text(run_id).first.wait_for(state="attached")

        # bob logs in: alice's run is not his, by the picker, the Runs page or the URL
        bob = new_page(browser.new_context(viewport=VIEWPORT))
        bob.set_default_timeout(120_000)
        log_in(bob, url, "bob")
        assert not any(e.startswith("run:") for e in picker_entries(bob))
        bob.goto(f"{url}/Runs")
        logged_in(bob, "bob")
        bob.get_by_text("No finished runs").wait_for()
        assert run_id not in bob.inner_text("body")
        bob.goto(f"{url}/Heatmaps?model=run:{run_id}")
        logged_in(bob, "bob")
        bob.get_by_text(f"Model 'run:{run_id}' from the URL is unknown").wait_for()
        screenshot(bob, ARTIFACTS / "shared_bob.png")
        assert store_of(tmp_path, issuer, "bob").list_runs() == []

        # logging out ends the login
        alice.get_by_test_id("stSidebar").get_by_role("button", name="Log out").click()
        alice.wait_for_url(re.compile(r"/oauth2/end_session"))  # Streamlit ends the provider's session too
        alice.get_by_role("button", name="End session").click()
        alice.wait_for_url(re.compile(re.escape(url)))
        alice.goto(url)
        settle(alice)
        alice.get_by_role("button", name="Log in").wait_for()
        assert page_errors(alice) == []
        browser.close()


def page_errors(page) -> list[str]:
    return page.get_by_test_id("stException").all_inner_texts()
