"""Every benchmark and experiment script runs in its --quick mode, so none can rot unnoticed.

The quick modes print the same figures as the full runs on smaller sizes and save nothing; the
full runs (whose numbers docs/results.md quotes) are the same code with larger settings.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "experiments").glob("*.py"))
BROWSER = {"dashboard.py", "dashboard_load.py"}  # drive headless Chromium
TRANSFORMERS = {
    "long_inputs.py",
    "hf_load.py",
    "job_vs_loop.py",
    "penalty_cost.py",
    "text_batch_memory.py",
    "text_retrain.py",
    "sinks.py",
    "two_ranks.py",
    "long_context.py",
}  # use transformers


def _params():
    for path in SCRIPTS:
        # each script is its own process: any worker may run it (the browser one runs with the others)
        marks = [pytest.mark.browser] if path.name in BROWSER else [pytest.mark.xdist_group(f"script:{path.name}")]
        yield pytest.param(path, marks=marks, id=f"{path.parent.name}/{path.name}")


def test_every_script_has_a_quick_mode():
    assert SCRIPTS
    missing = [p.name for p in SCRIPTS if "--quick" not in p.read_text()]
    assert missing == []


@pytest.mark.parametrize("path", _params())
def test_script_runs_in_quick_mode(path, tmp_path):
    if path.name in TRANSFORMERS:
        pytest.importorskip("transformers")
    results = {p: p.stat().st_mtime for p in ROOT.glob("*/results/*") if p.is_file()}
    env = {**os.environ, "ATTN_LAB_RUNS": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, str(path), "--quick"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.strip(), "a quick run prints its figures"
    # a smoke run never overwrites the committed results docs/results.md quotes
    assert {p: p.stat().st_mtime for p in results} == results


def test_no_script_or_test_module_shadows_an_installed_package():
    """Running ``python benchmarks/x.py`` puts ``benchmarks/`` first on ``sys.path``: a module there
    named like an installed package hides it from every library that imports it (transformers 5
    imports ``kernels``, which ``benchmarks/kernels.py`` once shadowed)."""
    import importlib.metadata

    installed = set(importlib.metadata.packages_distributions())
    folders = [ROOT / "benchmarks", ROOT / "experiments", ROOT / "scripts", *sorted((ROOT / "tests").iterdir())]
    shadows = [
        str(p.relative_to(ROOT))
        for folder in folders
        if folder.is_dir()
        for p in folder.iterdir()
        if (p.suffix == ".py" and p.stem in installed)
        or (p.is_dir() and (p / "__init__.py").exists() and p.name in installed)
    ]
    assert not shadows, f"these modules hide installed packages of the same name: {shadows}"
