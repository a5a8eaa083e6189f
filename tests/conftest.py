"""Shared fixtures. Tests never write into the repository: runs and exports go to tmp paths."""
import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _isolated_data_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("ATTN_LAB_MODELS", raising=False)
