"""The settings of a merged vs factored comparison: its :class:`Variant` s and the
:class:`CompareConfig` that defines them, the architecture and the recipe (see docs/maths.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from attn_core.declarations import check_bounds, command_args, declared, setting
from attn_core.device import check_precision
from attn_core.limits import MAX_SAMPLES
from attn_core.model import ModelConfig
from attn_core.training.config import TrainConfig
from attn_core.training.settings import shared, warmup_of
from attn_core.validate import MAX_SEED, check, is_int, is_number, shown

PARENT_PREFIX = "compare-qk:"  # runs of a comparison have parent "compare-qk:<task>"
VARIANT_KINDS = ("factored", "merged", "merged + wd", "merged + nuclear")
TRUNCATION_RANKS = (1, 2, 4, 8, 16, 32, 64)  # those <= d_model are used
MAX_SEEDS = 64
PREFIX = "invalid comparison setting: "


@dataclass(frozen=True)
class Variant:
    """One QK parametrisation of the comparison. ``qk_weight_decay`` None means W_Q/W_K/W_QK are
    decayed like every other matrix (the recipe's weight_decay); ``nuclear`` is lambda of
    lambda * mean_h ||B_h||_*."""

    name: str
    qk: str
    d_qk: int | None = None
    qk_weight_decay: float | None = None
    nuclear: float = 0.0

    @property
    def kind(self) -> str:
        if self.qk == "factored":
            return "factored"
        return "merged + nuclear" if self.nuclear > 0 else ("merged + wd" if self.qk_weight_decay else "merged")

    def model_config(self, base: ModelConfig) -> ModelConfig:
        if self.qk == "merged":
            return replace(base, qk="merged", d_qk=None)
        return replace(base, qk="factored", d_qk=[[self.d_qk] * base.n_heads for _ in range(base.n_layers)])

    def regularizers(self) -> list[str]:
        """The penalty as regularizer specs (the run store's ``regularizers``)."""
        return [f"nuclear={self.nuclear:g}"] if self.nuclear > 0 else []


# the settings of a comparison that their declared bounds check (declarations.check_bounds)
BOUNDED = ("steps", "seeds", "first_seed", "d_model", "batch_size", "weight_decay", "qk_weight_decay", "nuclear")
BOUNDED += ("warmup_steps", "eval_every", "eval_samples", "measure_samples", "eval_seed", "threads")


@dataclass
class CompareConfig:
    """Everything that defines a comparison. The architecture (``n_layers`` x ``n_heads``,
    ``d_model``, value/output width ``d_head``, no MLP) and the recipe are shared; the variants
    are factored heads with each of ``d_qks`` and the three merged ones (``merged_kinds``).
    ``weight_decay`` decays every matrix (W_Q and W_K included) except W_QK, which gets 0
    (``merged``), ``qk_weight_decay`` (``merged + wd``) or 0 and the penalty ``nuclear``
    (``merged + nuclear``). Seeds are ``first_seed .. first_seed + seeds - 1``; a seed fixes the
    initialisation and the training batches. Final metrics use ``measure_samples`` held-out
    sequences drawn with ``eval_seed``, the same for every run."""

    # each setting once: default, CLI flag and help, bounds (training.settings; those other commands
    # take too in its SHARED table); compare-qk's options, its checks and the reproduce line (command(),
    # in this order) are built from them
    # the page's inputs (``widget``): the task's choices are the page's (the tasks import torch)
    task: str = setting(
        "induction",
        "--task",
        "Task to train on (see `attn-lab presets` for tasks).",
        always=True,
        widget=dict(
            kind="choice", label="Task", help="Induction needs a content-matching B (26 letters), so its rank matters."
        ),
    )
    steps: int = shared(
        "steps", "compare", always=True, widget=dict(label="Steps", help="Training steps of every run.", step=50)
    )
    seeds: int = setting(
        3,
        "--seeds",
        "Seeds per variant (first-seed, first-seed + 1, ...).",
        bounds=(1, MAX_SEEDS),
        always=True,
        widget=dict(
            label="Seeds", help="Every variant is trained with seeds 0..K-1: mean and spread over them.", step=1
        ),
    )
    first_seed: int = setting(0, "--first-seed", "The first seed.", bounds=(0, MAX_SEED))
    n_layers: int = 2
    n_heads: int = 2
    d_model: int = setting(
        32,
        "--d-model",
        "Residual width (every variant).",
        bounds=(1, 512),
        widget=dict(kind="choice", label="d_model", help="Residual width of every variant.", options=(16, 32, 64)),
    )
    d_head: int = 16
    qk_weight_decay: float = setting(
        3.0,
        "--qk-weight-decay",
        "AdamW weight decay of W_QK in 'merged + wd'.",
        fmt="g",
        bounds=(0.0, 100.0),
        widget=dict(  # {decay}: the recipe's weight_decay
            label="Weight decay on W_QK (merged + wd)",
            help="AdamW's decoupled decay; every other matrix (W_Q, W_K too) gets {decay:g}.",
            step=0.5,
        ),
    )
    nuclear: float = setting(
        0.01,
        "--nuclear",
        "lambda of the penalty lambda * mean ||B||_* in 'merged + nuclear'.",
        fmt="g",
        bounds=(0.0, 100.0),
        widget=dict(
            label="λ of the nuclear norm (merged + nuclear)",
            help="λ of the penalty λ · mean_h ‖B_h‖_* added to the loss of 'merged + nuclear'.",
            step=0.005,
            format="%.4f",
        ),
    )
    weight_decay: float = shared("weight_decay", "compare")
    lr: float = shared("lr", "compare")
    batch_size: int = shared("batch_size", "compare")
    warmup_steps: int | None = shared("warmup_steps", "compare")  # None: warmup_of(steps)
    eval_every: int = shared("eval_every", "compare")
    eval_samples: int = shared("eval_samples", "compare")
    measure_samples: int = setting(512, bounds=(1, MAX_SAMPLES))
    eval_seed: int = setting(0, bounds=(0, MAX_SEED))
    device: str = shared("device", "compare")
    precision: str = shared("precision", "compare")
    # torch intra-op threads while training (0: leave the process's setting). These models are too
    # small for threads to pay, and on a busy machine oversubscribed threads spin: the page's default
    # comparison took 36 s with 1 thread and 418 s with 2 on the shared 2-core machine.
    threads: int = setting(
        1,
        "--threads",
        "torch CPU threads while training (0: torch's default); one is fastest for these small models on a busy "
        "machine.",
        bounds=(0, 256),
    )
    d_qks: tuple = setting(
        (1, 2, 4, 16),
        "--d-qk",
        "Query/key widths of the factored variants (comma-separated, each 1..d_model; empty for none).",
        empty="",  # no factored variant: --d-qk ''
        widget=dict(
            kind="multi",
            label="Factored d_qk",
            help="Query/key width of each factored variant (at most d_model).",
            options=(1, 2, 4, 8, 16, 32, 64),
        ),
    )
    merged_kinds: tuple = setting(
        ("merged", "merged + wd", "merged + nuclear"),
        "--merged",
        "Merged variants, comma-separated: merged, merged + wd, merged + nuclear (or none).",
        empty="none",
        widget=dict(
            kind="multi",
            label="Merged variants",
            help="The merged W_QK variants trained beside the factored ones.",
            options=VARIANT_KINDS[1:],
        ),
    )

    def __post_init__(self) -> None:
        from attn_core.tasks import TASKS  # torch: imported when a config is built, not with the class

        self.d_qks = tuple(self.d_qks)
        self.merged_kinds = tuple(self.merged_kinds)

        def ok(cond: bool, msg: str) -> None:
            check(cond, msg, prefix=PREFIX)

        ok(self.task in TASKS, f"unknown task {shown(self.task)}; known tasks: {', '.join(TASKS)}")
        check_bounds(self, BOUNDED, PREFIX)
        for w in self.d_qks:
            ok(is_int(w) and 1 <= w <= self.d_model, f"d_qk {w!r} is outside 1..{self.d_model} (d_model)")
        ok(len(set(self.d_qks)) == len(self.d_qks), f"d_qks {list(self.d_qks)} repeat a width")
        bad = [k for k in self.merged_kinds if k not in VARIANT_KINDS[1:]]
        ok(not bad, f"merged kind {bad[0] if bad else ''!r} is not one of {', '.join(VARIANT_KINDS[1:])}")
        ok(len(set(self.merged_kinds)) == len(self.merged_kinds), "merged_kinds repeat a kind")
        ok(len(self.d_qks) + len(self.merged_kinds) >= 1, "there is no variant to train")
        ok(is_number(self.lr) and 0 < self.lr <= 10, f"lr must be in (0, 10], got {shown(self.lr)}")
        ok(
            "merged + wd" not in self.merged_kinds or self.qk_weight_decay > 0,
            "qk_weight_decay must be > 0 for 'merged + wd'",
        )
        ok(
            "merged + nuclear" not in self.merged_kinds or self.nuclear > 0,
            "nuclear must be > 0 for 'merged + nuclear'",
        )
        check_precision(self.precision, prefix=PREFIX)
        self.base_model_config()  # n_layers, n_heads, d_head ... (ModelConfig's own checks)
        self.train_config(self.first_seed)  # lr, batch size, device ...

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))

    def base_model_config(self) -> ModelConfig:
        from attn_core.tasks import get_task

        t = get_task(self.task)
        return ModelConfig(
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_model=self.d_model,
            d_head=self.d_head,
            d_vocab=t.d_vocab,
            n_ctx=t.n_ctx,
        )

    def train_config(self, seed: int) -> TrainConfig:
        warmup = self.warmup_steps if self.warmup_steps is not None else warmup_of(self.steps)
        return TrainConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            lr=float(self.lr),
            weight_decay=float(self.weight_decay),
            warmup_steps=warmup,
            eval_every=self.eval_every,
            eval_samples=self.eval_samples,
            seed=seed,
            device=self.device,
            precision=self.precision,
        )

    def variants(self) -> list[Variant]:
        out = [Variant(f"factored d_qk={w}", "factored", d_qk=w) for w in sorted(self.d_qks)]
        make = {
            "merged": Variant("merged", "merged", qk_weight_decay=0.0),
            "merged + wd": Variant("merged + wd", "merged", qk_weight_decay=float(self.qk_weight_decay)),
            "merged + nuclear": Variant("merged + nuclear", "merged", qk_weight_decay=0.0, nuclear=float(self.nuclear)),
        }
        return out + [make[k] for k in VARIANT_KINDS[1:] if k in self.merged_kinds]

    def to_dict(self) -> dict:
        out = asdict(self)
        out["d_qks"], out["merged_kinds"] = list(self.d_qks), list(self.merged_kinds)
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> CompareConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    def command(self) -> str:
        """The ``attn-lab compare-qk`` command that reproduces this comparison: the task, steps and
        seeds, then each declared setting that differs from its default (``training.settings``)."""
        return " ".join(["attn-lab", "compare-qk", *command_args(self)])


MAX_STEPS = declared(CompareConfig, "steps")["bounds"][1]  # steps of one run of a comparison
