"""Shared fixtures. Tests never write into the repository: runs and exports go to tmp paths."""
import os

# The toy models are tiny: one intra-op thread is faster than two, and subprocesses (CLI tests,
# the dashboard server) inherit the setting through the environment.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_data_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("ATTN_LAB_MODELS", raising=False)
