"""scripts/gpu_check.sh on a machine without CUDA (issue 34): it installs what is missing from
the wheels it is handed, skips the CUDA parts cleanly (each says so), prints its one table,
writes its logs where it is told and exits 0; a module it cannot install fails it (exit 1)."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
PROBE = "attn_gpu_check_probe"  # a module no machine has: the wheel below brings it

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the script's CPU path (no CUDA)")


def write_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel of module PROBE."""
    folder.mkdir()
    info = f"{PROBE}-0.1.dist-info"
    wheel = folder / f"{PROBE}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{PROBE}/__init__.py", "VALUE = 1\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: 0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return folder


def check(tmp_path: Path, *args: str, needs: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_CHECK_OUT": str(tmp_path / "logs"), "GPU_CHECK_NEEDS": needs}
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def test_on_the_cpu_it_installs_from_wheels_and_skips_the_cuda_parts(tmp_path):
    r = check(tmp_path, str(write_wheel(tmp_path / "wheels")), needs=f"json {PROBE}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CUDA: not available" in r.stdout and "the CUDA parts are skipped" in r.stdout
    table = r.stdout[r.stdout.index("GPU check, ") :]
    assert f"installed 1 wheels for: {PROBE}" in table
    for part in (
        "pytest -m gpu tests/gpu",
        "decompositions.py --device cuda",
        "job_vs_loop.py --device cuda",
        "gpu.py",
    ):
        assert any(line.startswith(part) and "skipped" in line and "no CUDA" in line for line in table.splitlines())
    assert (tmp_path / "logs" / "install.log").exists()


def test_a_module_it_cannot_install_fails_the_check(tmp_path):
    r = check(tmp_path, needs=f"json {PROBE}")  # no wheels handed
    assert r.returncode == 1
    assert f"missing: {PROBE}; no wheels given" in r.stdout


def summary(script: str, doc: dict, tmp_path: Path) -> str:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--summary", str(path)], env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_the_benchmarks_summarize_a_saved_result_in_one_line(tmp_path):
    """The table's figures: the command's wall split (job_vs_loop) and the compile time apart (gpu)."""
    phases = {"load": 3.0, "before": 1.0, "steps": 8.3, "telemetry": 0.2, "spectra": 0.1, "after": 1.2, "save": 0.9}
    command = {"process_wall_s": 20.0, **{f"phase_{k}_s": v for k, v in phases.items()}, "phase_rest_s": 5.3}
    run = {"plain": {"steps_per_s": 18.0}, "command": command}
    ratios = {"job_vs_plain": 0.95, "command_wall_over_loop_and_load_s": 8.7}
    line = summary(
        "job_vs_loop.py", {"summary": {"imported eager no penalty": {"median": run, "ratios": ratios}}}, tmp_path
    )
    assert line == (
        "imported eager no penalty: job/plain 0.95; command 20.0 s = load 3.0 + before 1.0 + steps 8.3 + telemetry 0.2 "
        "+ spectra 0.1 + after 1.2 + save 0.9 + rest 5.3; over loop+load 8.7 s"
    )
    rates = {"job": {"median": 226.0}, "bare": {"median": 365.0}}
    result = dict(
        setup="induction-2l", device="cuda", precision="fp32", compiled=True, steps_per_s=rates, job_compile_s=21.5
    )
    doc = {"results": [result], "speedup_job_cuda_vs_cpu": {"induction-2l": {"fp32 compiled": 2.21}}}
    assert summary("gpu.py", doc, tmp_path) == (
        "induction-2l cuda fp32 compiled: job 226.0 (bare 365.0) steps/s, compile 21.5 s | "
        "induction-2l job CUDA/CPU: fp32 compiled 2.21x"
    )
