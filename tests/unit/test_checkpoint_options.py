"""The checkpoint options of ``attn-lab train`` and ``retrain`` as a user types them: a bad value
ends with one line that names the flag typed, exit code 2 and no traceback; ``--checkpoint-log K``
keeps up to K log-spaced steps and the card says how many were kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attn_core.cli import main
from attn_core.training.checkpoint_plan import log_steps

ROOT = Path(__file__).resolve().parents[2]

BAD = [
    ("--checkpoint-every", "0"),
    ("--checkpoint-every", "-3"),
    ("--checkpoint-every", "abc"),
    ("--checkpoint-log", "0"),
    ("--checkpoint-log", "20000"),
    ("--checkpoint-log", "2.5"),
    ("--checkpoint-steps", "1,x"),
    ("--checkpoint-steps", "-5"),
    ("--checkpoint-steps", "3,,4"),
    ("--checkpoint-params", "mlp"),
    ("--checkpoint-max-mb", "0"),
    ("--checkpoint-max-mb", "-1"),
    ("--checkpoint-max-mb", "nan"),
    ("--checkpoint-max-mb", "inf"),
    ("--checkpoint-max-mb", "lots"),
]


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs"


@pytest.mark.parametrize("command", ["train", "retrain"])
@pytest.mark.parametrize("flag, value", BAD)
def test_a_bad_checkpoint_value_names_its_flag(capsys, tmp_path, runs, command, flag, value):
    head = ["train", "--preset", "induction-2l", "--out", str(tmp_path / "m")] if command == "train" else ["retrain"]
    head += [] if command == "train" else ["induction-2l"]
    extra = (
        [] if flag in ("--checkpoint-every", "--checkpoint-log", "--checkpoint-steps") else ["--checkpoint-every", "2"]
    )
    code, out, err = run_cli(capsys, *head, "--steps", "5", *extra, f"{flag}={value}")
    lines = err.strip().splitlines()
    assert code == 2, err
    assert lines[-1].startswith("error: ") and flag in lines[-1], err
    assert "Traceback" not in err and len(lines) == 1, err
    assert not (tmp_path / "m").exists()  # nothing written


def test_too_many_checkpoints_and_a_small_bound_name_their_flags(capsys, tmp_path, runs):
    code, _, err = run_cli(capsys, "retrain", "induction-2l", "--steps", "20000", "--checkpoint-every", "1")
    assert code == 2 and "--checkpoint-every" in err and "10,000" in err and "Traceback" not in err
    args = ["train", "--preset", "induction-2l", "--out", str(tmp_path / "m"), "--steps", "5"]
    code, _, err = run_cli(capsys, *args, "--checkpoint-every", "1", "--checkpoint-max-mb", "0.01")
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: ") and "--checkpoint-max-mb" in err
    assert not (tmp_path / "m").exists()


def test_the_flag_is_named_in_a_real_subprocess_too(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "attn_core", "retrain", "induction-2l", "--steps", "5", "--checkpoint-log", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "ATTN_LAB_RUNS": str(tmp_path / "runs")},
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: invalid checkpoint setting: --checkpoint-log must be 1..10,000 checkpoints, got 0"
    ]


def test_checkpoint_log_keeps_up_to_k_and_the_card_says_how_many(capsys, tmp_path):
    K, steps = 20, 30
    assert len(log_steps(steps, K)) < K  # early steps round to the same whole step
    out = tmp_path / "m"
    code, stdout, err = run_cli(
        capsys,
        "train",
        "--preset",
        "induction-2l",
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--checkpoint-log",
        str(K),
        "--json",
    )
    assert code == 0, err
    listed = json.loads(stdout)["checkpoints"]
    distinct = len(log_steps(steps, K))
    assert listed["kept"] == len(listed["steps"]) == len(listed["files"]) == distinct + 1  # + step 0
    assert listed["scheduled"] == listed["kept"] and listed["plan"]["log"] == K
    assert f"--checkpoint-log {K} gives {distinct} distinct steps" in err  # said before training
    card = json.loads((out / "card.json").read_text())
    found = card.get("checkpoints") or card["details"]["checkpoints"]
    assert found["kept"] == distinct + 1 and len(list((out / "checkpoints").glob("step-*.safetensors"))) == distinct + 1


def test_the_help_says_up_to(capsys):
    code, out, _ = run_cli(capsys, "train", "--help")
    assert code == 0 and "up to N steps" in " ".join(out.split())
