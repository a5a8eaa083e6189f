"""Two ranks train the same run as one process (attn_core.distributed.parallel and rank), without
Ray: two processes spawned here join a gloo process group and run ``rank.run_rank``, the function
every Ray Train worker runs; rank 0 records the run in a run store. The Ray side (workers started
by Ray Train, the channel, a worker killed) is tests/unit/test_ray_train.py.

Tolerances (float32, summation orders differ between one batch and two shards): after 12 steps the
weights agree to 1e-5 and every logged loss, term and accuracy to 1e-5; the gradient norm (which
clipping reads) to 1e-4 relative. Measured: 1.7e-7 on the weights, 1e-7 on the losses. The run
that diverges (lr 50 times the default) keeps weights within 1e-3 of the one-process run's."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from attn_core.retraining.job import TrainingJob
from attn_core.runs import RunStore
from attn_core.training.config import JobConfig

transformers = pytest.importorskip("transformers")

W_TOL, LOSS_TOL, GRAD_REL = 1e-5, 1e-5, 1e-4
DIVERGING_TOL = 1e-3  # a run driven past the guard at 50 x the usual lr (measured 9e-5)
SMALL = dict(steps=12, eval_every=6, telemetry_every=4, spectrum_every=6, measure_samples=64, eval_samples=64)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, cases: list, store: str, out: str) -> None:
    """One rank: run every case (one JobConfig each) through run_rank; rank 1 saves what it ended with."""
    from attn_core.distributed.parallel import DataParallel
    from attn_core.distributed.rank import run_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ended = {}
    try:
        for name, cfg in cases:
            dp = DataParallel(rank, world, cfg.strategy, torch.device("cpu"))
            job = run_rank(TrainingJob, cfg, dp, store if rank == 0 else None)
            if rank == 0:
                ended[name] = job.run_id
            else:  # a follower: the step it stopped at and the weights it holds
                t = job.trainer
                state = {n: p.detach().clone() for n, p in t.model.named_parameters()}
                ended[name] = {"step": t.step_index, "weights": state if cfg.strategy == "ddp" else None}
    finally:
        dist.destroy_process_group()
    torch.save(ended, f"{out}.{rank}")


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    """An imported Llama folder with grouped-query attention (4 query heads, 2 key heads), a
    word-level tokenizer and text in its words."""
    from tests.conftest import write_tiny_hf
    from tests.text_corpus import make_text, write_word_tokenizer

    root = tmp_path_factory.mktemp("gqa")
    folder = root / "llama-gqa"
    folder.mkdir()
    write_tiny_hf(folder, "llama", num_key_value_heads=2)
    write_word_tokenizer(folder)
    (root / "text.txt").write_text(make_text(0, lines=150))
    return str(folder), str(root / "text.txt")


def _cases(gqa) -> dict[str, dict]:
    folder, text = gqa
    zoo = dict(source="induction-2l", regularizers={"entropy": 0.1}, batch_size=13, **SMALL)  # 7 + 6 rows
    on_text = dict(source=folder, text=text, block=16, regularizers={"entropy": 0.05}, batch_size=6, **SMALL)
    return {
        "zoo-ddp": dict(zoo, strategy="ddp"),
        "zoo-fsdp": dict(zoo, strategy="fsdp"),
        "gqa-text-ddp": dict(on_text, strategy="ddp", train="attn"),
        "gqa-text-fsdp": dict(on_text, strategy="fsdp"),
        # a high lr drives the task loss past the guard's bound at step 5: every rank stops there
        "zoo-diverges": dict(zoo, strategy="ddp", lr=0.05, warmup_steps=10, max_loss=2.0),
    }


@pytest.fixture(scope="module")
def two_ranks(gqa, tmp_path_factory):
    """Every case trained by two spawned ranks (rank 0 recording into a store) and by one process."""
    root = tmp_path_factory.mktemp("ranks")
    store = RunStore(root / "runs")
    os.environ["ATTN_LAB_RUNS"] = str(store.root)  # the ranks' text cache
    cases = _cases(gqa)
    spread = [(name, JobConfig(**kw, workers=2)) for name, kw in cases.items()]
    out = str(root / "ended")
    mp.spawn(_rank_main, args=(2, _free_port(), spread, str(store.root), out), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    alone = {}
    for name, kw in cases.items():
        kw = {k: v for k, v in kw.items() if k != "strategy"}
        job = TrainingJob.open(JobConfig(**kw), store=store)
        job.run()
        alone[name] = job.run_id
    return store, ranks, alone


def _log(store: RunStore, run_id: str) -> dict:
    m = store.metrics(run_id)
    return {(int(s), n): v for s, n, v in zip(m["step"], m["name"], m["value"])}


@pytest.mark.parametrize("case", ["zoo-ddp", "zoo-fsdp", "gqa-text-ddp", "gqa-text-fsdp"])
def test_two_ranks_train_the_run_one_process_trains(two_ranks, case):
    store, ranks, alone = two_ranks
    spread_id, alone_id = ranks[0][case], alone[case]
    spread, single = store.get(spread_id), store.get(alone_id)
    assert spread["status"] == single["status"] == "completed", (spread["message"], single["message"])
    assert spread["card"]["distributed"]["workers"] == 2
    assert spread["card"]["distributed"]["strategy"] == case.rsplit("-", 1)[1]
    a, b = store.load_model(spread_id).model.state_dict(), store.load_model(alone_id).model.state_dict()
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= W_TOL
    la, lb = _log(store, spread_id), _log(store, alone_id)
    assert la.keys() == lb.keys()  # the same rows: telemetry, spectra, evaluations at the same steps
    for key, v in lb.items():
        tol = GRAD_REL * abs(v) + 1e-7 if key[1] == "grad_norm" else LOSS_TOL
        assert abs(la[key] - v) <= tol, (key, la[key], v)
    assert ranks[1][case]["step"] == SMALL["steps"]  # the follower ran every step


def test_the_guard_stops_every_rank_at_the_same_step_with_the_same_weights(two_ranks):
    store, ranks, alone = two_ranks
    spread, single = store.get(ranks[0]["zoo-diverges"]), store.get(alone["zoo-diverges"])
    assert spread["status"] == single["status"] == "diverged"
    assert spread["message"] == single["message"]  # the same step, the same reason, the same kept step
    kept = store.load_model(spread["id"]).model.state_dict()
    follower = ranks[1]["zoo-diverges"]["weights"]  # rank 1 put the last good weights back too
    assert max(float((kept[k] - follower[k]).abs().max()) for k in kept) <= W_TOL
    reference = store.load_model(single["id"]).model.state_dict()  # a blowing-up run grows rounding apart
    assert max(float((kept[k] - reference[k]).abs().max()) for k in kept) <= DIVERGING_TOL


def test_a_batch_splits_into_contiguous_shards_that_differ_by_at_most_one_row():
    from attn_core.distributed.parallel import bounds

    for rows in range(1, 40):
        for world in range(1, min(rows, 9) + 1):
            parts = [bounds(rows, world, r) for r in range(world)]
            assert parts[0][0] == 0 and parts[-1][1] == rows
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
            sizes = [hi - lo for lo, hi in parts]
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_settings_a_run_on_workers_refuses_in_one_sentence():
    for bad, says in [
        (dict(workers=0), "workers must be a whole number"),
        (dict(workers=2, strategy="zero"), "strategy must be one of ddp, fsdp"),
        (dict(gpus_per_worker=1), "need --workers"),
        (dict(workers=2, gpus_per_worker=0.5), "gpus_per_worker must be a whole number"),
        (dict(workers=2, gpus_per_worker=1, device="cpu"), "does not fit GPU workers"),
        (dict(workers=2, strategy="fsdp", regularizers={"spectral": 0.1}), "use --strategy ddp"),
        (dict(workers=2, strategy="fsdp", kl=0.1), "--strategy fsdp cannot train --kl"),
    ]:
        with pytest.raises(ValueError, match=says) as e:
            JobConfig(source="induction-2l", **bad)
        assert "\n" not in str(e.value)
    assert JobConfig(source="x", workers=2, strategy="fsdp").command().endswith("--workers 2 --strategy fsdp")


@pytest.mark.parametrize(
    "args, says",
    [
        (["--address", "auto"], "error: --address needs --workers"),
        (["--workers", "2", "--batch-size", "1"], "error: a batch of 1 sequences cannot be split over 2 workers"),
        (["--workers", "2", "--strategy", "fsdp", "--reg", "vocab_entropy=0.1"], "use --strategy ddp"),
        (["--workers", "2", "--address", "127.0.0.1:1"], "error: cannot reach the Ray cluster at 127.0.0.1:1"),
    ],
)
def test_the_cli_refuses_a_run_on_workers_in_one_line_before_anything_starts(args, says):
    from typer.testing import CliRunner

    from attn_core.cli import app

    out = CliRunner().invoke(app, ["retrain", "reverse-1l", "--steps", "2", *args])
    assert out.exit_code == 2, out.stdout + out.stderr
    assert says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert RunStore().list_runs() == []  # nothing was recorded
