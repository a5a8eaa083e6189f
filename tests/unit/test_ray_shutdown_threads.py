"""Ray's driver is shut down safely in a process whose other threads go on (issue 37: the Sweeps
page's server died with "The core worker has already been shutdown ... The process will exit" as a
sweep shut Ray down). While ``ray.shutdown()`` tears the core worker down, a Ray object freed by
another thread (the garbage collection of a Streamlit script thread finding the reference cycles a
Tune fit leaves) reaches the core worker that is gone, and Ray ends the process. Every shutdown of
:mod:`attn_core.cluster` now collects that garbage first and holds automatic collection off until
Ray is down; the dashboard keeps its Ray (``keep``) until the process ends, for the next sweep.
Real Ray with 1 or 2 CPUs; each test shuts down what it started."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # starts a local Ray: one test worker runs these in turn (tests/conftest.py)

from attn_core.cluster import watchdog  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GONE = "The core worker has already been shutdown"

# A sweep's thread ends its Ray session while a page's thread allocates (so its automatic garbage
# collection runs) and drops reference cycles that hold ObjectRefs, as a finished Tune fit leaves
# them. Before the fix the process died in each of 5 runs (exit 1, GONE on stderr).
FREEING_THREAD = textwrap.dedent(
    """
    import threading, time
    import ray
    from attn_core.cluster import ray_session

    stop, freed = threading.Event(), []
    with ray_session(num_cpus=1):
        refs = [ray.put(i) for i in range(20000)]

        def page():
            keep = []
            while not stop.is_set():  # on, whatever the load, until told: the assertion below needs it alive
                if refs:
                    ref = refs.pop()
                    cycle = [ref]
                    cycle.append(cycle)  # a young cycle holding an ObjectRef: garbage once dropped
                    del ref, cycle
                keep.append([[] for _ in range(300)])  # allocations: collections run in this thread
                del keep[:-20]
                freed.append(1)
                time.sleep(0)

        thread = threading.Thread(target=page, daemon=True)
        thread.start()
        time.sleep(0.3)
    assert thread.is_alive() and not ray.is_initialized()  # Ray went down while the thread freed
    stop.set()
    thread.join()
    print("survived", len(freed), flush=True)  # flushed: a crash at exit still shows it survived the shutdown
    """
)


def run_script(script: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def test_a_thread_freeing_ray_objects_while_ray_shuts_down_leaves_the_process_up():
    proc = run_script(FREEING_THREAD)
    said = (proc.returncode, proc.stdout[-500:], proc.stderr[-1500:])
    assert proc.returncode == 0 and "survived" in proc.stdout, said
    assert GONE not in proc.stderr, said


# The dashboard's case: each sweep runs in a thread of its own, which ends with its sweep. Ray
# starts its GCS and raylet with the kernel's parent-death signal, sent when the *thread* that
# started them ends: before the fix the Ray kept for the next sweep was killed as the first
# sweep's thread ended (GCS unreachable, the process ended 60 s later).
KEPT_ACROSS_THREADS = textwrap.dedent(
    """
    import threading, time
    import ray
    from attn_core import cluster

    shutdowns, seen = [], []
    real = ray.shutdown
    ray.shutdown = lambda *a, **k: (shutdowns.append(1), real(*a, **k))[1]

    @ray.remote(num_cpus=1)
    def answer():
        return 42

    def sweep(keep):
        with cluster.ray_session(num_cpus=2, keep=keep) as s:
            assert not cluster.end_ray()  # a user runs: left up
            node = ray.get_runtime_context().get_node_id()
            seen.append((s["started"], s["shared"], node, ray.get(answer.remote(), timeout=60)))

    assert not cluster.end_ray()  # nothing kept: nothing to end
    for keep in (True, False):  # the second sweep does not ask to keep it: still kept after
        thread = threading.Thread(target=sweep, args=(keep,))
        thread.start()
        thread.join(120)
        time.sleep(1.0)  # the thread has ended: its Ray is still up, not shut down
        assert ray.is_initialized() and cluster.ray_users() == 0 and not shutdowns, (seen, shutdowns)
    (started, shared, node, a), (started2, shared2, node2, b) = seen
    assert started and not shared and shared2 and not started2 and node2 == node and a == b == 42, seen
    assert cluster.end_ray() and shutdowns == [1] and not ray.is_initialized()
    assert not cluster.end_ray()
    print("kept", len(seen))
    """
)


def test_a_kept_ray_outlives_the_thread_that_started_it_and_ends_on_request():
    proc = run_script(KEPT_ACROSS_THREADS)
    assert proc.returncode == 0 and "kept 2" in proc.stdout, (proc.returncode, proc.stderr[-2000:])


def test_a_kept_ray_ends_with_its_process():
    script = textwrap.dedent(
        """
        import ray
        from attn_core.cluster import ray_session

        with ray_session(num_cpus=1, keep=True):
            pass
        assert ray.is_initialized()
        node = ray._private.worker._global_node
        print(" ".join(str(p.process.pid) for procs in node.all_processes.values() for p in procs))
        """
    )
    proc = run_script(script)
    assert proc.returncode == 0, proc.stderr[-1500:]
    pids = [int(p) for p in proc.stdout.split()]
    assert pids  # the GCS, the raylet, ...
    deadline = time.monotonic() + 30  # the exit handler ended them (the watchdog would, 2 s later)
    while any(watchdog._start_time(p) is not None for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if watchdog._start_time(p) is not None]
