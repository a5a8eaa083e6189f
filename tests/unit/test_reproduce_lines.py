"""The reproduce lines of a retrain and of a QK comparison, pinned word for word for the existing
combinations of settings: a run's card and the pages show them, and a user pastes them back, so
the same settings always give the same line (whatever builds it)."""

from __future__ import annotations

import pytest

from attn_core.qk.config import CompareConfig
from attn_core.training.config import JobConfig

RETRAIN = [
    (dict(), "--steps 300 --seed 0 --lr 0.001"),
    (
        dict(heads="L0", entmax_alpha=1.5, steps=50, seed=3, lr=3e-4, batch_size=5, device="cpu", precision="bf16"),
        "--heads L0 --steps 50 --seed 3 --lr 0.0003 --entmax-alpha 1.5 --batch-size 5 --device cpu --precision bf16",
    ),
    (
        dict(sync_every=7, compile=True, checkpoint_log=3, checkpoint_params="attn", checkpoint_steps=[1, 2]),
        "--steps 300 --seed 0 --lr 0.001 --sync-every 7 --compile --checkpoint-log 3 --checkpoint-steps 1,2 "
        "--checkpoint-params attn",
    ),
    (
        dict(checkpoint_every=4, checkpoint_max_mb=12.5, text="my text.txt", text_field="body", eval_text="e.txt"),
        "--steps 300 --seed 0 --lr 0.001 --checkpoint-every 4 --checkpoint-max-mb 12.5 --text 'my text.txt' "
        "--text-field body --eval-text e.txt",
    ),
    (
        dict(text="t.txt", block=64, train="qk", kl=0.5, penalty_rows=4, workers=2, gpus_per_worker=1),
        "--steps 300 --seed 0 --lr 0.001 --text t.txt --block 64 --train qk --kl 0.5 --penalty-rows 4 --workers 2 "
        "--gpus-per-worker 1",
    ),
    (  # settings the CLI does not take are not in the line; a checkpoint kind without checkpoints neither
        dict(
            checkpoint_params="attn",
            threads=2,
            warmup_steps=5,
            weight_decay=0.0,
            eval_every=10,
            device="cpu",
            kl=1e-7,
            lr=1.5,
        ),
        "--steps 300 --seed 0 --lr 1.5 --device cpu --kl 1e-07 --threads 2",
    ),
    (
        dict(workers=3, strategy="fsdp", device="cpu"),
        "--steps 300 --seed 0 --lr 0.001 --device cpu --workers 3 --strategy fsdp",
    ),
]


@pytest.mark.parametrize(("settings", "line"), RETRAIN)
def test_the_retrain_line_is_unchanged(settings, line):
    cfg = JobConfig("induction-2l", ["entropy=0.1"], **settings)
    assert cfg.command() == "attn-lab retrain induction-2l --reg entropy=0.1 " + line


def test_the_retrain_line_of_sources_and_regularizers_is_unchanged():
    scratch = JobConfig("scratch:induction-2l", {"entropy": 0.1, "topk:2": 0.5})
    assert scratch.command() == (
        "attn-lab retrain scratch:induction-2l --reg entropy=0.1 --reg topk:2=0.5 --steps 300 --seed 0 --lr 0.001"
    )
    assert JobConfig("run:abc", []).command() == "attn-lab retrain run:abc --steps 300 --seed 0 --lr 0.001"
    upload = JobConfig("/tmp/up/abc", ["vocab_entropy@L1=0.05", "sink@L0H1=0.2"], text="/tmp/up/t1.txt")
    shown = {"/tmp/up/abc": "my model", "/tmp/up/t1.txt": "corpus.txt"}  # the page's names of uploads
    assert upload.command(shown) == (
        "attn-lab retrain 'my model' --reg vocab_entropy@L1=0.05 --reg sink@L0H1=0.2 --steps 300 --seed 0 "
        "--lr 0.001 --text corpus.txt"
    )


COMPARE = [
    (dict(), ""),
    (
        dict(
            task="induction",
            steps=50,
            seeds=2,
            first_seed=1,
            d_model=16,
            qk_weight_decay=1.0,
            nuclear=0.1,
            weight_decay=0.05,
            lr=1e-3,
            batch_size=8,
            precision="bf16",
            threads=0,
        ),
        "--first-seed 1 --d-model 16 --qk-weight-decay 1 --nuclear 0.1 --weight-decay 0.05 --lr 0.001 "
        "--batch-size 8 --precision bf16 --threads 0",
    ),
    (dict(d_qks=(2, 8), merged_kinds=("merged",)), "--d-qk 2,8 --merged merged"),
]


@pytest.mark.parametrize(("settings", "line"), COMPARE)
def test_the_compare_line_is_unchanged(settings, line):
    steps, seeds = settings.get("steps", 400), settings.get("seeds", 3)
    head = f"attn-lab compare-qk --task induction --steps {steps} --seeds {seeds}"
    assert CompareConfig(**settings).command() == (head + " " + line if line else head)


@pytest.mark.parametrize(
    "settings",
    [dict(d_qks=()), dict(d_qks=(), merged_kinds=("merged + wd",)), dict(d_qks=(4,), merged_kinds=())],
)
def test_a_compare_line_parses_back_to_its_comparison(settings, monkeypatch):
    """The reproduce line of a comparison without factored variants (or with a merged kind that
    holds spaces) is a command compare-qk reads back as the same comparison."""
    import shlex

    from typer.testing import CliRunner

    import attn_core.qk as qk
    from attn_core.cli import app

    seen = []

    def compare(cfg, **kwargs):
        seen.append(cfg)
        raise RuntimeError("parsed")

    monkeypatch.setattr(qk, "compare", compare)
    cfg = CompareConfig(**settings)
    CliRunner().invoke(app, shlex.split(cfg.command())[1:])
    assert seen == [cfg], cfg.command()
