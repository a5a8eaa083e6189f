"""Hostile sweeps (issues 24 and 25): every input a trial would refuse is refused before Ray starts
or anything is written (exit 2, one line, the JSON error with --json); a request the cluster
cannot meet is refused before any trial; a sweep whose every trial failed exits 1 and says why;
Ctrl-C on a real `attn-lab sweep` subprocess (sent to its process group, as a terminal does) at
two moments stops it the same way (exit 130, the state printed, --resume finishes it); after
kill -9 of a sweep no process of its Ray lives on. Ray runs with 2 CPUs and is shut down."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attn_core import checkpoint
from attn_core.cli import app
from attn_core.cluster.watchdog import descendants
from attn_core.runs import RunStore
from tests.conftest import make_tiny_model

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # starts a local Ray: one test worker runs these in turn (tests/conftest.py)
ROOT = Path(__file__).resolve().parents[2]
MODEL = "reverse-1l"


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(args: list[str], message: str, code: int = 2) -> str:
    out = invoke("sweep", *args, "--json")
    assert out.exit_code == code, out.output
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and message in line and "Traceback" not in out.stderr, out.stderr
    assert json.loads(out.stdout)["error"] == line.removeprefix("error: ")
    return line


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    """A pickle and a model without a task, in a folder listed in ATTN_LAB_MODELS."""
    root = tmp_path / "models"
    checkpoint.save(make_tiny_model(), root / "no-task", card={})
    (tmp_path / "weights.safetensors").write_bytes(b"\x80\x04\x95" + b"\x00" * 64)  # a pickle, renamed
    monkeypatch.setenv("ATTN_LAB_MODELS", str(root))
    return tmp_path


BEFORE_ANYTHING = [
    (["nosuch", "--grid", "entropy=0.1"], "no model named 'nosuch'"),
    (["{tmp}" + "/.." * 16 + "/etc", "--grid", "entropy=0.1"], "/../etc has no model.safetensors"),  # /etc
    (["run:../x", "--grid", "entropy=0.1"], "is not a run id"),
    (["scratch:nosuch", "--grid", "entropy=0.1"], "unknown preset 'nosuch'"),
    (["{tmp}/weights.safetensors", "--grid", "entropy=0.1"], "looks like a pickle"),
    (["no-task", "--grid", "entropy=0.1"], "has no known task in its card"),
    ([MODEL, "--grid", "entropy=0.1", "--heads", "L9"], "L9"),
    ([MODEL, "--grid", "entropy@L9=0.1"], "L9"),
    ([MODEL, "--grid", "entropy@;;=0.1"], "head selection item ';;'"),
    (
        [MODEL, "--grid", "entropy=" + ",".join(f"{(i + 1) / 1000:g}" for i in range(5000))],
        "the sweep would have 5,001 trials (seeds x (lambdas + a baseline)); the limit is 1,000",
    ),
    ([MODEL, "--grid", "entropy=0.1", "--seeds", "1000000000"], "--seeds must be at most 1,000"),
    ([MODEL, "--grid", "entropy=0.1", "--seeds", str(2**70)], "--seeds must be at most 1,000"),
    ([MODEL, "--grid", "entropy=0.1", "--cpus-per-trial", "inf"], "--cpus-per-trial must be > 0 (a finite number)"),
    ([MODEL, "--grid", "entropy=0.1", "--cpus-per-trial", "nan"], "--cpus-per-trial must be > 0 (a finite number)"),
    ([MODEL, "--grid", "entropy=0.1", "--gpus-per-trial", "inf"], "--gpus-per-trial must be >= 0 (a finite number)"),
]


@pytest.mark.parametrize("args, message", BEFORE_ANYTHING, ids=[" ".join(a)[:40] for a, _ in BEFORE_ANYTHING])
def test_what_a_trial_would_refuse_is_refused_before_ray_starts(models, args, message):
    refused([a.format(tmp=models) for a in args], message)
    assert RunStore().list_sweeps() == []  # nothing written
    assert not ray.is_initialized()  # Ray never started


# --- on a local Ray (2 CPUs) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.mark.parametrize("user", [None, "1"])
def test_ray_usage_statistics_are_off_unless_the_user_sets_them(local_ray, monkeypatch, user):
    from attn_core.cluster import USAGE_STATS_ENV, ray_session

    if user is None:
        monkeypatch.delenv(USAGE_STATS_ENV, raising=False)
    else:
        monkeypatch.setenv(USAGE_STATS_ENV, user)
    from ray._common.usage.usage_lib import usage_stats_enabled  # Ray's own answer (ray[tune]==2.58.0 pinned)

    with ray_session():  # Ray runs already (the module's): only the setting is made
        assert os.environ[USAGE_STATS_ENV] == (user or "0")
        assert usage_stats_enabled() == (user == "1")


def test_a_request_the_cluster_cannot_meet_is_refused_before_any_trial(local_ray):
    refused(
        [MODEL, "--grid", "entropy=0.1", "--cpus-per-trial", "1000"], "--cpus-per-trial 1000 but the cluster has 2 CPUs"
    )
    refused([MODEL, "--grid", "entropy=0.1", "--gpus-per-trial", "1"], "--gpus-per-trial 1 but the cluster has no GPU")
    assert RunStore().list_sweeps() == []


def test_a_sweep_whose_every_trial_failed_exits_1_and_says_why(local_ray, tmp_path, monkeypatch):
    """The model is in a folder only this process lists (ATTN_LAB_MODELS set after Ray's workers
    were started), as on a cluster whose workers do not see it: validation passes here, every
    trial fails on its worker."""
    root = tmp_path / "mine"
    checkpoint.save(make_tiny_model(), root / "only-here", card={"task": "reverse"})
    monkeypatch.setenv("ATTN_LAB_MODELS", str(root))
    out = invoke("sweep", "only-here", "--grid", "entropy=0.1", "--steps", "2", "--json")
    assert out.exit_code == 1, out.output
    res = json.loads(out.stdout)
    assert res["status"] == "failed" and [t["status"] for t in res["trials"]] == ["failed", "failed"]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: sweep {res['sweep_id']} failed: every trial failed (2);")
    assert "no model named 'only-here'" in line
    assert RunStore().list_sweeps()[0]["status"] == "failed"


# --- Ctrl-C and kill -9 on a real `attn-lab sweep` -------------------------------------------------------


def start_sweep_process(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTN_LAB_RUNS": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "attn_core", "sweep", MODEL, "--grid", "entropy=0.1", *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,  # its own process group: SIGINT to the group is a terminal's Ctrl-C
        # as from a shell: SIGINT at its default (an ignored SIGINT is inherited, and a sweep started
        # with SIGINT ignored, like one under nohup, rightly ignores Ctrl-C)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def names(pids) -> dict[int, str]:
    out = {}
    for pid in pids:
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            pass
    return out


def wait_for(proc: subprocess.Popen, *wanted: str, timeout: float = 240) -> dict[int, str]:
    """The sweep's process tree once a process named with each of ``wanted`` is in it."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        tree = names(descendants(proc.pid))
        if all(any(w in n for n in tree.values()) for w in wanted):
            return tree
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no {wanted} under the sweep within {timeout} s: {proc.communicate()}")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_ctrl_c_while_ray_starts_is_exit_130_with_nothing_recorded(tmp_path):
    proc = start_sweep_process(tmp_path, "--steps", "5")
    wait_for(proc, "gcs_server")  # ray.init is under way
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, (err, out[-2000:])
    assert json.loads(out) == {
        "error": "interrupted by Ctrl-C before the sweep began; nothing was run or recorded",
        "kind": "interrupted",
    }
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: interrupted by Ctrl-C")
    assert RunStore(tmp_path / "runs").list_sweeps() == []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_a_stop_signal_while_trials_run_stops_records_prints_and_resume_finishes(local_ray, tmp_path, monkeypatch):
    """SIGTERM (a scheduler ending the job), then Ctrl-C: the first signal names the stop in every
    record and sets the exit status; the second changes nothing."""
    proc = start_sweep_process(tmp_path, "--steps", "150")
    wait_for(proc, "ray::ImplicitFunc.train")  # a trial trains on a worker
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # then Ctrl-C: the same, not a crash
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, (err, out[-2000:])  # never -11 (SIGSEGV), never 0
    assert "Traceback" not in err and "Ctrl-C" not in out
    res = json.loads(out)
    assert res["status"] == "interrupted" and res["message"].startswith("stopped by SIGTERM")
    assert {t["status"] for t in res["trials"]} <= {"stopped", "pending", "completed"}
    assert any(t["status"] == "stopped" and t["message"].startswith("stopped by SIGTERM") for t in res["trials"])
    assert err.strip().splitlines()[-1].endswith(f"attn-lab sweep {MODEL} --resume {res['sweep_id']} finishes it")
    store = RunStore(tmp_path / "runs")
    assert store.list_sweeps()[0]["status"] == "interrupted"

    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    again = invoke("sweep", MODEL, "--resume", res["sweep_id"], "--json")  # on the module's Ray
    assert again.exit_code == 0, again.output
    done = json.loads(again.stdout)
    assert done["status"] == "completed" and all(t["status"] == "completed" for t in done["trials"])


def test_a_stop_before_the_sweep_began_is_named_by_its_cause(tmp_path):
    from attn_core.sweep import SweepInterrupted, grid_plan, run_sweep

    plan = grid_plan(MODEL, ["entropy=0.1"], steps=5)
    with pytest.raises(SweepInterrupted, match=r"^interrupted by SIGHUP before the sweep began; nothing was run"):
        run_sweep(plan, store=RunStore(tmp_path / "runs"), stop=lambda: True, stopped_by=lambda: "SIGHUP")
    assert RunStore(tmp_path / "runs").list_sweeps() == []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_after_kill_9_no_process_of_the_sweeps_ray_lives_on(tmp_path):
    """Ray's agents outlived a killed driver by about 60-75 s; the watchdog ends them (and the
    rest of its Ray) within seconds. Waited for, up to 30 s."""
    proc = start_sweep_process(tmp_path, "--steps", "300")
    tree = wait_for(proc, "ray::ImplicitFunc", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "raylet")
    proc.kill()
    proc.communicate()
    end = time.monotonic() + 30
    while time.monotonic() < end and any(alive(p) for p in tree):
        time.sleep(0.25)
    assert not [n for p, n in tree.items() if alive(p)], "left running after kill -9"


# a stand-in for Ray's raylet: a script inside "Ray's package folder" with a worker below it
FAKE_RAYLET = "import subprocess, time\nworker = subprocess.Popen(['sleep', '300'])\nprint(worker.pid, flush=True)\ntime.sleep(300)\n"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_the_watchdog_ends_the_sweeps_ray_and_no_other_child_of_the_driver(tmp_path):
    """The driver may be the dashboard's server, whose other children (a live training job's
    worker process, kaleido's browser) must outlive a sweep: the watchdog ends Ray's processes
    (and what runs below them) only. It used to kill every child of the driver as a sweep ended."""
    from attn_core.cluster import watchdog

    ray_dir = tmp_path / "site-packages" / "ray"
    ray_dir.mkdir(parents=True)
    (ray_dir / "raylet.py").write_text(FAKE_RAYLET)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    raylet = subprocess.Popen([sys.executable, str(ray_dir / "raylet.py")], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(raylet.stdout.readline())
        noted = watchdog.ray_processes(os.getpid(), str(ray_dir))
        assert raylet.pid in noted and worker in noted and other.pid not in noted
        guard = watchdog.start(str(ray_dir))
        watchdog.stop(guard)  # the sweep is over: what is left of its Ray goes, nothing else
        assert guard.returncode == 0
        assert raylet.wait(timeout=60) == -signal.SIGTERM and not alive(worker)
        assert other.poll() is None, "a child of the driver that is not Ray's was killed"
    finally:
        for proc in (other, raylet):
            proc.kill()
            proc.wait()
