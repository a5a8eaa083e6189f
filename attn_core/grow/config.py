"""The settings of a growth comparison: :class:`GrowConfig`, checked when built. A
config, so it imports no torch (the CLI reads its option defaults from it)."""

from __future__ import annotations

from dataclasses import dataclass

from attn_core.device import check_precision, select_device
from attn_core.training.config import TrainConfig
from attn_core.training.settings import setting, shared
from attn_core.validate import check, check_int, is_int, is_number

BASES = ("whitened", "raw")
DAMPING = 1e-4  # Levenberg-Marquardt damping of the fit used by grow()


@dataclass
class GrowConfig:
    """Settings of :func:`grow`. ``batch`` sequences of the task's training split (seed
    ``seed`` + FIT_SEED_OFFSET) are fitted; the line search tries ``grid`` step sizes; every
    method is then fine-tuned ``steps`` steps (AdamW, constant ``lr``, no weight decay, batches of
    ``finetune_batch`` drawn with ``seed``) and evaluated on ``eval_samples`` held-out sequences
    every ``eval_every`` steps. CPU defaults keep a zoo model under a minute."""

    # each setting once: default, CLI flag and help (training.settings; steps, seed, lr, device and
    # precision, which other commands take too, in its SHARED table); grow's options are built from them
    layer: int = setting(0, "--layer", "Layer of the head to grow.")
    head: int = setting(0, "--head", "Head to grow.")
    add: int = setting(1, "--add", "p: query/key dimensions to add (1..d_model - d_k).")
    batch: int = setting(32, "--batch", "Task sequences fitted (and as many more for the line search).")
    seed: int = shared("seed", "grow")
    basis: str = setting(
        "whitened",
        "--basis",
        "Truncate in the 'whitened' basis of the batch (the score metric) or the 'raw' basis of Z (the seed's recipe).",
    )
    grid: int = setting(19, "--grid", "Step sizes tried by the line search (powers of 2).")
    steps: int = shared("steps", "grow")
    lr: float = shared("lr", "grow")
    finetune_batch: int = 32
    eval_samples: int = shared("eval_samples", "grow")
    eval_every: int = shared("eval_every", "grow")
    random_std: float = 0.02
    damping: float = setting(DAMPING, "--damping", "Levenberg-Marquardt damping of the least-squares fit (0: exact).")
    device: str = shared("device", "grow")
    # of the fine-tuning (autocast bf16 or fp32); the fit and the line search are fp32
    precision: str = shared("precision", "grow")

    def __post_init__(self) -> None:
        for name, top in (
            ("batch", 4096),
            ("grid", 64),
            ("steps", 100_000),
            ("finetune_batch", 4096),
            ("eval_samples", 65536),
            ("eval_every", 100_000),
        ):
            check_int(name, getattr(self, name), 1, top)
        check(is_int(self.add), f"add must be an integer (1..d_model - d_k), got {self.add!r}")
        check_int("seed", self.seed, 0)
        check(self.basis in BASES, f"basis must be one of {BASES}, got {self.basis!r}")
        check(is_number(self.lr) and 0 < self.lr <= 1, f"lr must be in (0, 1], got {self.lr!r}")
        check(
            is_number(self.random_std) and 0 <= self.random_std <= 10,
            f"random_std must be in [0, 10], got {self.random_std!r}",
        )
        check(is_number(self.damping) and 0 <= self.damping <= 1, f"damping must be in [0, 1], got {self.damping!r}")
        check_precision(self.precision)
        select_device(self.device)  # raises on an unknown or unavailable device

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            steps=self.steps,
            batch_size=self.finetune_batch,
            lr=self.lr,
            weight_decay=0.0,
            warmup_steps=0,
            min_lr_ratio=1.0,
            eval_every=self.eval_every,
            eval_samples=self.eval_samples,
            seed=self.seed,
            device=self.device,
            precision=self.precision,
        )
