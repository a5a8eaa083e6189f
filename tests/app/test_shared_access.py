"""AppTest of the dashboard's shared mode (ATTN_LAB_SHARED=1, ui/access.py): it refuses to start
without a login provider, serves nothing until someone is logged in (an expired login is none),
and gives each person their own run store: another user's run is not listed, not opened by the
URL's ``?model=run:<id>``, and not read by a typed ``run:<id>`` or path; an admin may open any
user's store; two sessions of one user share one store. AppTest sets ``st.user`` itself; the
real login through an OpenID Connect provider is tests/e2e/test_shared_login_browser.py."""

import time
from pathlib import Path

import pytest
from dashboard_helpers import widget
from streamlit.testing.v1 import AppTest

from attn_core import runs
from attn_core.retraining.job import TrainingJob
from attn_core.runs import users
from attn_core.runs.names import scope_roots
from attn_core.training.config import JobConfig

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
MODEL = "reverse-1l"
AUTH = {
    "redirect_uri": "http://127.0.0.1:8501/oauth2callback",
    "cookie_secret": "a-test-secret-of-enough-length-0123456789",
    "client_id": "attn-lab",
    "client_secret": "s3cret",
    "server_metadata_url": "http://127.0.0.1:9/.well-known/openid-configuration",
}
ISSUER = "http://127.0.0.1:9"
ALICE = {"iss": ISSUER, "sub": "alice", "email": "alice@lab.example", "email_verified": True}
BOB = {"iss": ISSUER, "sub": "bob", "email": "bob@lab.example", "email_verified": True}
BOSS = {"iss": ISSUER, "sub": "boss", "email": "boss@lab.example", "email_verified": True}


@pytest.fixture(autouse=True)
def _shared(monkeypatch):
    monkeypatch.setenv("ATTN_LAB_SHARED", "1")
    monkeypatch.setenv("ATTN_LAB_ADMINS", "Boss@lab.example")
    yield
    scope_roots(None)  # AppTest runs the app in this process: leave no scope to the next test


@pytest.fixture(scope="module")
def machine(tmp_path_factory) -> tuple[Path, str]:
    """A machine store whose user alice has one short run: (the machine store, the run id)."""
    root = tmp_path_factory.mktemp("machine")
    cfg = JobConfig(
        source=MODEL, regularizers={"entropy": 0.5}, steps=2, eval_samples=16, measure_samples=16, checkpoint_every=1
    )
    result = TrainingJob.open(cfg, store=runs.RunStore(users.open_store(ALICE, base=root))).run()
    assert result["status"] == "completed"
    return root, result["run_id"]


def app(user: dict | None, auth: dict | None = AUTH, page: str | None = None, **params) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    if auth is not None:
        at.secrets["auth"] = auth
    at.user = {"is_logged_in": False} if user is None else {"is_logged_in": True, "exp": time.time() + 600, **user}
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    if page is not None:
        at.switch_page(page).run()
    return at


def picker(at: AppTest) -> list[str]:
    """The model picker's entries (a run's entry starts with run:<id>)."""
    return list(widget(at.sidebar.selectbox, "Model").options)


def lists(at: AppTest, run_id: str) -> bool:
    return any(entry.startswith(f"run:{run_id} ") for entry in picker(at))


def text(element) -> str:
    return element.value.replace("\\", "")  # markdown's escapes of the underscores


def test_shared_mode_without_a_provider_refuses_to_start(monkeypatch):
    at = app(ALICE, auth=None)
    assert [e.value for e in at.error] == [
        "Shared mode (ATTN_LAB_SHARED=1) needs a login provider: add an [auth] section in .streamlit/secrets.toml "
        "(docs/dashboard.md, 'Sharing the dashboard')."
    ]
    assert not at.sidebar.selectbox and not at.title and not at.exception  # nothing else is served
    at = app(ALICE, auth={k: v for k, v in AUTH.items() if k != "client_secret"})
    assert len(at.error) == 1 and "lacks client_secret" in at.error[0].value and not at.sidebar.selectbox


def test_a_bad_shared_setting_is_one_sentence(monkeypatch):
    monkeypatch.setenv("ATTN_LAB_SHARED", "maybe")
    at = app(ALICE)
    assert [text(e) for e in at.error] == [
        "ATTN_LAB_SHARED must be 1 (shared mode, with a login) or 0 (one user), got 'maybe'"
    ]
    assert not at.sidebar.selectbox


def test_nobody_logged_in_sees_a_login_and_nothing_else(machine, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(machine[0]))
    at = app(None, page="app_pages/4_Runs.py")
    assert [b.label for b in at.button] == ["Log in"] and not at.sidebar.selectbox and not at.dataframe
    assert "log in" in at.info[0].value and not at.exception


def test_an_expired_login_is_no_login(machine, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(machine[0]))
    at = app(dict(ALICE, exp=time.time() - 1), page="app_pages/4_Runs.py")
    assert [w.value for w in at.warning] == ["Your login has expired: log in again to go on."]
    assert [b.label for b in at.button] == ["Log in"] and not at.sidebar.selectbox and not at.dataframe


def test_each_user_sees_only_their_own_runs(machine, monkeypatch):
    root, run_id = machine
    monkeypatch.setenv("ATTN_LAB_RUNS", str(root))
    alice = app(ALICE, page="app_pages/4_Runs.py")
    assert lists(alice, run_id) and not alice.exception
    assert run_id in alice.dataframe[0].value["id"].tolist()
    # the e-mail is text: a word joiner after "@" keeps the markdown from making it a mailto link
    assert "Logged in as **alice@\u2060lab.example**" in [c.value for c in alice.sidebar.caption]
    assert [b.label for b in alice.sidebar.button] == ["Log out"]
    assert (alice.session_state["attn_lab_user"], alice.session_state["attn_lab_admin"]) == (
        users.user_id(ALICE),
        False,
    )
    bob = app(BOB, page="app_pages/4_Runs.py")
    assert not lists(bob, run_id) and not bob.dataframe and not bob.exception
    assert "No finished runs" in bob.info[0].value and run_id not in str(bob)


def test_another_users_run_is_not_opened_by_the_url(machine, monkeypatch):
    root, run_id = machine
    monkeypatch.setenv("ATTN_LAB_RUNS", str(root))
    bob = app(BOB, model=f"run:{run_id}")
    assert [w.value for w in bob.sidebar.warning] == [
        f"Model 'run:{run_id}' from the URL is unknown; showing '{picker(bob)[0]}' instead."
    ]
    assert widget(bob.sidebar.selectbox, "Model").value != f"run:{run_id}"


def test_another_users_run_is_not_read_by_a_typed_name_or_path(machine, monkeypatch):
    root, run_id = machine
    monkeypatch.setenv("ATTN_LAB_RUNS", str(root))
    alice_run = users.store_of(users.user_id(ALICE), root) / run_id
    crafted = users.store_of(users.user_id(BOB), root) / ".." / alice_run.parent.name / run_id
    for typed in (f"run:{run_id}", str(alice_run), str(crafted)):
        sessions = []
        for who in (ALICE, BOB):
            at = app(who, page="app_pages/11_Dynamics.py")
            widget(at.selectbox, "Run, model or folder with checkpoints").select("(a folder)").run()
            widget(at.text_input, "Folder").input(typed).run()
            assert not at.exception, typed
            sessions.append(at)
        alice, bob = sessions
        if typed.startswith("run:"):
            assert not alice.error, (typed, [e.value for e in alice.error])  # her own run's checkpoints
        assert len(bob.error) == 1, typed  # one sentence, and nothing of hers read
        assert (
            "outside the folders this dashboard reads" in bob.error[0].value
            or "holds no checkpoints" in bob.error[0].value
        )


def test_two_sessions_of_one_user_share_one_store(machine, monkeypatch):
    root, run_id = machine
    monkeypatch.setenv("ATTN_LAB_RUNS", str(root))
    first, second = app(ALICE), app(ALICE)
    assert lists(first, run_id) and picker(first) == picker(second)


def test_an_admin_opens_any_users_store(machine, monkeypatch):
    root, run_id = machine
    monkeypatch.setenv("ATTN_LAB_RUNS", str(root))
    boss = app(BOSS, page="app_pages/4_Runs.py")
    assert not lists(boss, run_id)  # their own store first
    store = widget(boss.sidebar.selectbox, "Run store")
    alice = f"alice@lab.example ({users.user_id(ALICE)[:8]})"
    assert store.options[0] == "My own" and alice in store.options
    store.select_index(store.options.index(alice)).run()
    assert lists(boss, run_id) and run_id in boss.dataframe[0].value["id"].tolist()
    assert "Logged in as **boss@\u2060lab.example** (admin)" in [c.value for c in boss.sidebar.caption]
    bob = app(BOB)
    assert not [s for s in bob.sidebar.selectbox if s.label == "Run store"]  # not an admin


def test_single_user_mode_is_unchanged(machine, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_SHARED", "0")
    monkeypatch.setenv("ATTN_LAB_RUNS", str(machine[0]))
    at = app(None, auth=None)
    assert not at.error and not at.exception and picker(at) and not at.button
    assert runs.RunStore().root == machine[0]
