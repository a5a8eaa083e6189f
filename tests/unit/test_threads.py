"""The intra-op threads of a training loop: a pure decision (``device.choose_threads``) over the
step's work, the machine's cores and load, ``OMP_NUM_THREADS`` and the user's ``--threads``, and
the trainer, the one place a loop takes them. A tiny model on many threads lost to one thread
5-15x on a busy 2-core machine (benchmarks/train_threads.py measures it)."""

import pytest
import torch
from typer.testing import CliRunner

from attn_core import device as D
from attn_core.cli import app
from attn_core.tasks import get_task
from attn_core.training.config import JobConfig, TrainConfig
from attn_core.training.trainer import Trainer
from tests.conftest import make_tiny_model

TINY = 1e5  # parameters x sequences x tokens of a toy step
BIG = 10 * D.WORK_PER_THREAD


@pytest.mark.parametrize(
    ("work", "cores", "load", "threads"),
    [
        (TINY, 2, 0.0, 1),  # a tiny model: one thread, even on an idle machine
        (TINY, 64, 0.0, 1),
        (D.WORK_PER_THREAD * 2, 16, 0.0, 2),  # one thread per WORK_PER_THREAD of work
        (BIG, 16, 0.0, 10),
        (BIG, 4, 0.0, 4),  # at most the cores
        (BIG, 16, 12.0, 4),  # at most the cores the load leaves free
        (BIG, 2, 3.4, 1),  # the busy 2-core machine: one thread
        (BIG, 2, 1.4, 1),  # over half a core busy: not free
        (BIG, 2, 1.6, 1),
        (BIG, 2, 0.4, 2),
    ],
)
def test_threads_follow_the_work_and_the_free_cores(work, cores, load, threads):
    assert D.choose_threads(work, cores, load=load) == threads


def test_a_requested_count_then_omp_num_threads_win():
    assert D.choose_threads(TINY, 2, requested=6, env="3", load=9.0) == 6
    assert D.choose_threads(TINY, 2, env="3", load=9.0) == 3
    for env in ("", "0", "-2", "four"):  # not a count: the choice is made as without it
        assert D.choose_threads(TINY, 2, env=env) == 1


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1", "meta"])
def test_off_the_cpu_the_process_setting_is_left(device):
    assert D.choose_threads(BIG, 16, device=torch.device(device)) is None
    assert D.choose_threads(BIG, 16, requested=2, device=device) == 2


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def trainer(**train):
    task = get_task("reverse")
    return Trainer(make_tiny_model(), task, TrainConfig(steps=2, batch_size=4, device="cpu", **train))


def test_the_trainer_takes_one_thread_for_a_tiny_model(threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)  # torch's default on a 2-core machine
    assert trainer().threads == 1 and torch.get_num_threads() == 1


def test_the_trainer_takes_the_requested_threads(threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert trainer(threads=2).threads == 2 and torch.get_num_threads() == 2
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # honoured when nothing is requested
    assert trainer().threads == 2


def test_threads_are_a_checked_setting():
    with pytest.raises(ValueError, match="threads must be an integer in 1..256, got 0"):
        TrainConfig(threads=0)
    cfg = JobConfig(source="reverse-1l", threads=3)
    assert cfg.train_config({}).threads == 3 and "--threads 3" in cfg.command()
    assert "--threads" not in JobConfig(source="reverse-1l").command()


@pytest.mark.parametrize("command", [["train", "--preset", "reverse-1l"], ["retrain", "reverse-1l"]])
def test_the_cli_refuses_a_bad_thread_count_in_one_sentence(command):
    r = CliRunner().invoke(app, [*command, "--steps", "1", "--threads", "0"])
    assert r.exit_code == 2, r.output
    assert "threads must be an integer in 1..256, got 0" in r.output
