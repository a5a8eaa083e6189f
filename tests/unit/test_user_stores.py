"""The run stores of a shared server (attn_core.runs.users) and the scope that makes every store
call of a session its person's own (attn_core.runs.names.scope_roots): a login's claims become a
hash, never a path; a crafted id is refused in one sentence; the CLI's store is the machine's."""

import os

import pytest

from attn_core import runs, sources
from attn_core.runs import users
from attn_core.runs.names import machine_root, scope_roots, scoped
from tests.conftest import cli_json

ALICE = {"iss": "https://id.lab.example", "sub": "alice", "email": "alice@lab.example"}


@pytest.fixture(autouse=True)
def _unscoped():
    yield
    scope_roots(None)


def test_a_user_id_is_a_hash_of_issuer_and_subject():
    uid = users.user_id(ALICE)
    assert len(uid) == 32 and set(uid) <= set("0123456789abcdef")
    assert users.user_id(dict(ALICE, email="other@x", name="x")) == uid  # issuer and subject decide
    assert users.user_id(dict(ALICE, iss="https://evil.example")) != uid  # same sub, another provider
    assert users.user_id({"email": "Bob@Lab.example"}) == users.user_id({"email": "bob@lab.example"})
    with pytest.raises(ValueError, match="the login names no user"):
        users.user_id({"name": "nobody"})


@pytest.mark.parametrize(
    "claims", [{"iss": "x", "sub": "../../etc"}, {"email": "/root/.ssh"}, {"sub": "a/b", "iss": "."}]
)
def test_claims_that_look_like_paths_stay_inside_the_users_folder(tmp_path, claims):
    folder = users.open_store(claims, base=tmp_path)
    assert folder.parent == tmp_path / users.USERS and folder.name == users.user_id(claims)


@pytest.mark.parametrize("uid", ["..", "../x", "ABCDEF" * 6, "a" * 31, "", None])
def test_a_crafted_user_id_is_refused(tmp_path, uid):
    with pytest.raises(ValueError, match="user id must be 32 lower-case hex digits"):
        users.store_of(uid, base=tmp_path)


def test_open_store_is_private_and_names_its_owner(tmp_path):
    folder = users.open_store(ALICE, base=tmp_path)
    assert folder.stat().st_mode & 0o077 == 0
    assert users.open_store(ALICE, base=tmp_path) == folder  # the same login, the same store
    (tmp_path / users.USERS / "not-a-user").mkdir()
    os.symlink(folder, tmp_path / users.USERS / ("f" * 32))
    listed = users.list_stores(tmp_path)
    assert [(s["id"], s["label"]) for s in listed] == [(folder.name, "alice@lab.example")]


def test_the_scope_makes_every_store_the_persons_own(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "machine"))
    mine = users.open_store(ALICE)
    assert mine.parent == tmp_path / "machine" / users.USERS
    assert not scoped() and runs.default_root() == machine_root() == tmp_path / "machine"
    scope_roots(lambda: mine)
    assert scoped()
    assert runs.RunStore().root == mine and sources.upload_dir() == mine / "uploads"
    assert machine_root() == tmp_path / "machine"  # the users' stores are kept under the machine's
    assert "own store" in runs.root_origin()
    scope_roots(None)
    assert runs.RunStore().root == tmp_path / "machine"


def test_a_scope_that_refuses_refuses_every_store_call(tmp_path):
    def nobody():
        raise runs.RunStoreError("log in first")

    scope_roots(nobody)
    with pytest.raises(runs.RunStoreError, match="log in first"):
        runs.RunStore()


def test_the_cli_keeps_the_machines_store(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "machine"))
    alice = users.open_store(ALICE)
    runs.RunStore(alice).create("reverse-1l", "reverse", {"steps": 1})  # a run in a user's store
    assert cli_json("runs") == []  # the CLI lists the machine's store, never a user's
    assert not scoped()


def test_the_job_queue_is_the_machines_whoever_acts(tmp_path, monkeypatch):
    from attn_core.training.queue import JobQueue

    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "machine"))
    mine = users.open_store(ALICE)
    scope_roots(lambda: mine)
    assert JobQueue().root == tmp_path / "machine"  # one queue for every user, not one per store
