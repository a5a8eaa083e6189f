"""A retrain on Ray Train workers that could not run is refused in one line, exit 2, before Ray
starts and before anything is recorded (issue 37, items 11, 13 and 20): an address that accepts a
connection and never answers, an HTTP server given as the cluster, a ``ray://`` address without
Ray's client package, a host name no resolver takes, more workers than this machine has cores,
GPU workers on a machine without GPUs. No Ray is started here (each case ends before)."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest
from typer.testing import CliRunner

from attn_core.cli import app
from attn_core.cluster import session
from attn_core.runs import RunStore
from attn_core.training import scaling

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # starts a local Ray: one test worker runs these in turn (tests/conftest.py)


def refused(*args: str) -> str:
    """``retrain reverse-1l --steps 2 ARGS``: exit 2, one line on stderr (returned), nothing
    recorded, no Ray started."""
    out = CliRunner().invoke(app, ["retrain", "reverse-1l", "--steps", "2", *args])
    assert out.exit_code == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert RunStore().list_runs() == [] and not ray.is_initialized()
    return lines[0]


@pytest.fixture
def silent():
    """A port on 127.0.0.1 that accepts connections and never answers; closed at the end."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not done.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    done.set()
    thread.join()
    for s in [*held, server]:
        s.close()


@pytest.fixture
def http_server():
    """Python's http.server on 127.0.0.1 (it answers HTTP/1 to anything)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # no request log on the test's stderr
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.timeout(60)
def test_an_address_that_accepts_and_never_answers_is_refused_within_the_bound(silent, monkeypatch):
    monkeypatch.setenv(session.ANSWER_ENV, "0.5")
    line = refused("--workers", "1", "--address", silent)
    assert line == (
        f"error: {silent} accepted a connection but did not answer as a Ray cluster within 0.5 s "
        "(is it the head node's GCS port, 6379 by default?)"
    )


@pytest.mark.timeout(900)
def test_an_http_server_is_not_a_ray_cluster(http_server, monkeypatch):
    monkeypatch.setenv(session.ANSWER_ENV, "600")  # it answers at once: only a hang reaches this bound
    line = refused("--workers", "1", "--address", http_server)
    assert line.startswith(f"error: {http_server} is not a Ray cluster: it answered as an HTTP server does"), line


def test_a_ray_client_address_without_the_client_package_says_what_to_install(silent, monkeypatch):
    real = session.importlib.util.find_spec
    monkeypatch.setattr(
        session.importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a)
    )
    line = refused("--workers", "1", "--address", f"ray://{silent}")
    assert f"--address ray://{silent} needs Ray's client package" in line and "pip install 'ray[client]'" in line


@pytest.mark.parametrize("host", ["a" * 64, "x" * 300, "a..b"], ids=["long-label", "over-long", "empty-label"])
def test_a_host_name_no_resolver_takes_is_one_line(host):
    line = refused("--workers", "1", "--address", f"{host}:6379")
    assert "is not a host name" in line and "codec" not in line, line


def test_more_workers_than_cores_are_refused_before_ray_starts(monkeypatch):
    monkeypatch.setattr(scaling, "local_cpus", lambda: 2)
    line = refused("--workers", "3", "--batch-size", "6")
    assert line == (
        "error: --workers 3 needs 3 CPUs but this machine has 2 (one worker per core): give --workers 2 or fewer, "
        "or join a cluster with --address (nothing was trained)"
    )


def test_gpu_workers_on_a_machine_without_gpus_are_refused_before_ray_starts(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    line = refused("--workers", "1", "--gpus-per-worker", "1")
    assert "needs 1 GPUs but this machine has 0: give --gpus-per-worker 0 (CPU workers)" in line, line


def test_the_local_capacity_rule():
    scaling.check_local(2, 0, gpus=0, cpus=2)
    scaling.check_local(2, 1, gpus=2, cpus=2)
    with pytest.raises(ValueError, match="needs 3 CPUs but this machine has 2"):
        scaling.check_local(3, 0, gpus=0, cpus=2)
    with pytest.raises(ValueError, match="needs 4 GPUs but this machine has 2"):
        scaling.check_local(2, 2, gpus=2, cpus=2)
    assert scaling.local_cpus() >= 1
