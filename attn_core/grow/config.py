"""The settings of a growth comparison: :class:`GrowConfig`, checked when built. A
config, so it imports no torch (the CLI reads its option defaults from it)."""

from __future__ import annotations

from dataclasses import dataclass

from attn_core.declarations import check_bounds, setting
from attn_core.device import check_precision, select_device
from attn_core.training.config import TrainConfig
from attn_core.training.settings import shared
from attn_core.validate import check, is_int, is_number, shown

BASES = ("whitened", "raw")
DAMPING = 1e-4  # Levenberg-Marquardt damping of the fit used by grow()
PREFIX = "invalid growth setting: "


@dataclass
class GrowConfig:
    """Settings of :func:`grow`. ``batch`` sequences of the task's training split (seed
    ``seed`` + FIT_SEED_OFFSET) are fitted; the line search tries ``grid`` step sizes; every
    method is then fine-tuned ``steps`` steps (AdamW, constant ``lr``, no weight decay or warmup,
    batches of ``batch_size`` drawn with ``seed``) and evaluated on ``eval_samples`` held-out sequences
    every ``eval_every`` steps. CPU defaults keep a zoo model under a minute."""

    # each setting once: default, CLI flag and help, bounds (training.settings; steps, seed, lr, the
    # fine-tuning's batch_size, weight_decay and warmup_steps, the evaluation, device and precision, which
    # other commands take too, in its SHARED table); grow's options and checks are built from them
    layer: int = setting(0, "--layer", "Layer of the head to grow.")
    head: int = setting(0, "--head", "Head to grow.")
    add: int = setting(
        1,
        "--add",
        "p: query/key dimensions to add (1..d_model - d_k).",
        # the page gives the upper bound, the model's input width less one: {width} in the help
        widget=dict(
            label="p (dimensions to add)", help="d_k + p must stay at most the input width {width}", min_value=1, step=1
        ),
    )
    batch: int = setting(
        32,
        "--batch",
        "Task sequences fitted (and as many more for the line search).",
        bounds=(1, 4096),
        widget=dict(label="Batch (sequences)", help="Task sequences fitted; as many more choose the step size", step=8),
    )
    seed: int = shared(
        "seed",
        "grow",
        widget=dict(
            label="Seed",
            help="Seed of the fitting batch, the fine-tuning data and the random baseline",
            min_value=0,
            max_value=2**31 - 1,  # a browser's number input holds no more
            step=1,
        ),
    )
    steps: int = shared(
        "steps",
        "grow",
        widget=dict(label="Fine-tuning steps", help="The same for the three methods, on the same data", step=10),
    )
    lr: float = shared(
        "lr",
        "grow",
        widget=dict(
            kind="select",
            label="Fine-tuning learning rate",
            help="AdamW, constant, no weight decay",
            options=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
            format="{:g}",
        ),
    )
    basis: str = setting(
        "whitened",
        "--basis",
        "Truncate in the 'whitened' basis of the batch (the score metric) or the 'raw' basis of Z (the seed's recipe).",
        widget=dict(
            kind="radio",
            label="Truncate in the basis",
            help="Whitened: Eckart–Young in the metric of the scores on the batch (default). "
            "Raw: Eckart–Young on the matrix Z itself, as the original recipe writes it.",
            options=BASES,
            labels={"whitened": "whitened (the batch's score metric)", "raw": "raw Z (the original recipe)"},
        ),
    )
    grid: int = setting(19, "--grid", "Step sizes tried by the line search (powers of 2).", bounds=(1, 64))
    batch_size: int = shared("batch_size", "grow")
    weight_decay: float = shared("weight_decay", "grow")
    warmup_steps: int = shared("warmup_steps", "grow")
    damping: float = setting(
        DAMPING,
        "--damping",
        "Levenberg-Marquardt damping of the least-squares fit (0: exact).",
        bounds=(0.0, 1.0),
        widget=dict(
            kind="select",
            label="Damping δ",
            help="Levenberg–Marquardt ridge on the fitted correction; 0 is the exact "
            "least squares (it overfits directions the batch barely reaches)",
            options=(0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1),
            format="{:g}",
        ),
    )
    eval_samples: int = shared("eval_samples", "grow")
    eval_every: int = shared("eval_every", "grow")
    random_std: float = setting(0.02, bounds=(0.0, 10.0))  # of the random baseline's new columns
    device: str = shared("device", "grow")
    # of the fine-tuning (autocast bf16 or fp32); the fit and the line search are fp32
    precision: str = shared("precision", "grow")

    def __post_init__(self) -> None:
        bounded = ("batch", "grid", "steps", "batch_size", "weight_decay", "warmup_steps", "eval_samples")
        check_bounds(self, (*bounded, "eval_every", "seed", "random_std", "damping"), PREFIX)
        check(is_int(self.add), f"add must be an integer (1..d_model - d_k), got {shown(self.add)}", PREFIX)
        check(self.basis in BASES, f"basis must be one of {BASES}, got {shown(self.basis)}", PREFIX)
        check(is_number(self.lr) and 0 < self.lr <= 1, f"lr must be in (0, 1], got {shown(self.lr)}", PREFIX)
        check_precision(self.precision, prefix=PREFIX)
        select_device(self.device)  # raises on an unknown or unavailable device

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            lr=self.lr,
            weight_decay=self.weight_decay,
            warmup_steps=self.warmup_steps,
            min_lr_ratio=1.0,
            eval_every=self.eval_every,
            eval_samples=self.eval_samples,
            seed=self.seed,
            device=self.device,
            precision=self.precision,
        )
