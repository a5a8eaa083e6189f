"""A ``kill`` (SIGTERM) of a process that started Ray from a thread, as ``retrain --workers`` does
(its job's thread starts Ray): the process's own handler gets it and the process ends with the
status it chose (issue 37, item 12). Ray's core used to install absl's failure-signal handler in
the driver: SIGTERM printed a stack dump ("*** SIGTERM received ...") and the process aborted
(SIGABRT, -6) once the run was saved. One small local Ray (1 CPU, no worker), shut down before
the process exits; the test waits for lines the process prints, never for a time."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # starts a local Ray: one test worker runs these in turn (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import os, signal, sys, threading, time
from attn_core.cluster import ray_session

got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
up, leave = threading.Event(), threading.Event()


def user():  # a job's thread: Ray starts here, as for a retrain on workers
    with ray_session(num_cpus=1):
        up.set()
        leave.wait()


thread = threading.Thread(target=user)
thread.start()
while not up.wait(0.1):
    if not thread.is_alive():
        sys.exit("Ray did not start")
print("ray up", flush=True)
sys.stdin.readline()  # the test has sent SIGTERM (or closed stdin)
while not got:
    time.sleep(0.01)
leave.set()
thread.join()
print("handled", got, flush=True)
sys.exit(143)
"""


@pytest.mark.timeout(300)
def test_sigterm_to_a_driver_that_started_ray_in_a_thread_reaches_its_own_handler():
    tmp = tempfile.mkdtemp(prefix="ats-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": tmp, "RAY_ADDRESS": ""},
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL),
    )
    try:
        line = proc.stdout.readline()
        assert line == "ray up\n", proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate("sent\n", timeout=240)
    finally:
        proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    assert "SIGTERM received" not in err, err[-2000:]
    assert proc.returncode == 143 and out == f"handled [{int(signal.SIGTERM)}]\n", (proc.returncode, out, err[-2000:])
