"""scripts/gpu_check.sh on a machine without CUDA (issue 34): it installs what is missing from
the wheels it is handed, skips the CUDA parts cleanly (each says so), prints its one table,
writes its logs where it is told and exits 0; a module it cannot install fails it (exit 1)."""

import os
import subprocess
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
    for part in ("pytest -m gpu tests/gpu", "job_vs_loop.py --device cuda", "gpu.py"):
        assert any(line.startswith(part) and "skipped" in line and "no CUDA" in line for line in table.splitlines())
    assert (tmp_path / "logs" / "install.log").exists()


def test_a_module_it_cannot_install_fails_the_check(tmp_path):
    r = check(tmp_path, needs=f"json {PROBE}")  # no wheels handed
    assert r.returncode == 1
    assert f"missing: {PROBE}; no wheels given" in r.stdout
