"""The recipes of training: :class:`TrainConfig` (one training run, recorded in every card as
``train``) and :class:`JobConfig` (a live retraining run, recorded with the run). Both check every
setting when built, so a bad one fails before anything starts; the CLI reads its option defaults
from them (see docs/architecture.md)."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, fields

from attn_core import regularizers as R
from attn_core.declarations import check_bounds, command_args, in_bounds, setting
from attn_core.device import MAX_THREADS, PRECISIONS, check_precision, check_sync_every, check_threads, select_device
from attn_core.limits import MAX_BLOCK, MAX_SAMPLES, MAX_STEPS, TEXT_LIMIT
from attn_core.training.checkpoint_plan import CheckpointPlan
from attn_core.training.scaling import STRATEGIES, STRATEGY_HELP, check_scaling, check_specs
from attn_core.training.settings import shared, warmup_of
from attn_core.training.text_defaults import DEFAULT_BLOCK, HELD_OUT_FRACTION
from attn_core.validate import MAX_SEED, check, is_int, is_number, shown

TRAIN = ("all", "attn", "qk")  # what learns in a retrain (--train); attn_core.finetune says what each means
TRAIN_HELP = (
    "What learns: all (every parameter), attn (every attention weight), or qk (only W_Q, W_K and their "
    "biases in the layers that carry a regularizer, with optimizer state only for those). With grouped-query "
    "attention a key head's W_K is shared by its group's query heads: training it for one head moves the others."
)
RATES = tuple(round(10 ** (e / 4), 8) for e in range(-20, -3))  # the page's learning rates: 1e-5 .. 1e-1, log scale
LAMBDAS = [round(10 ** (e / 4), 8) for e in range(-20, 5)]  # the page's strengths lambda: 1e-5 .. 10, log scale
ALPHAS = {None: "the model's own", 1.0: "1 (softmax)", 1.25: "1.25", 1.5: "1.5 (entmax15)", 1.75: "1.75"}
ALPHAS[2.0] = "2 (sparsemax)"  # the page's entmax alphas, as it shows them
MAX_PENALTY_ROWS = MAX_BLOCK  # query rows per head of the sampled penalty (the longest block a text run takes)


# the settings of a recipe that its declared bounds check (declarations.check_bounds)
DECLARED_BOUNDS = ("batch_size", "weight_decay", "warmup_steps", "eval_every", "eval_samples")


@dataclass
class TrainConfig:
    """The recipe of one training run (recorded in every card as ``train``)."""

    # steps, batch_size, lr, weight_decay, warmup_steps, the evaluation, seed, device and precision:
    # declared once for every command (training.settings.SHARED)
    steps: int = shared("steps", "train")
    batch_size: int = shared("batch_size", "train")
    lr: float = shared("lr", "train")
    weight_decay: float = shared("weight_decay", "train")
    beta1: float = 0.9
    beta2: float = 0.98
    warmup_steps: int = shared("warmup_steps", "train")
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = shared("eval_every", "train")
    eval_samples: int = shared("eval_samples", "train")
    seed: int = shared("seed", "train")
    device: str = shared("device", "train")
    precision: str = shared("precision", "train")
    sync_every: int | None = None  # None: 1 on CPU, SYNC_EVERY_CUDA on CUDA
    compile: bool = False  # torch.compile the step (CUDA graphs on CUDA), see training.step
    threads: int | None = None  # torch intra-op threads; None: chosen for the run (device.choose_threads)

    def __post_init__(self) -> None:
        def ok(cond: bool, msg: str) -> None:
            check(cond, msg, prefix="invalid training setting: ")

        def count(v, lo: int = 1, hi: int | None = MAX_STEPS) -> bool:
            return is_int(v) and lo <= v and (hi is None or v <= hi)

        ok(count(self.steps, hi=None), f"steps must be a positive integer, got {shown(self.steps)}")
        ok(
            self.steps <= MAX_STEPS,
            f"steps must be at most {MAX_STEPS:,} (the limit of this lab), got {shown(self.steps, 30)}",
        )
        check_bounds(self, DECLARED_BOUNDS, prefix="invalid training setting: ")
        ok(is_number(self.lr) and 0 < self.lr <= 10, f"lr must be in (0, 10], got {shown(self.lr)}")
        ok(
            is_number(self.beta1) and is_number(self.beta2) and 0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
            "betas must be in [0, 1)",
        )
        ok(is_number(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1, "min_lr_ratio must be in [0, 1]")
        ok(is_number(self.grad_clip) and self.grad_clip > 0, "grad_clip must be positive")
        ok(count(self.seed, 0, MAX_SEED), f"seed must be an integer in 0..2^63-1, got {shown(self.seed)}")
        check_precision(self.precision, prefix="invalid training setting: ")
        check_sync_every(self.sync_every, prefix="invalid training setting: ")
        ok(isinstance(self.compile, bool), f"compile must be true or false, got {shown(self.compile)}")
        check_threads(self.threads, prefix="invalid training setting: ")
        select_device(self.device)  # raises on an unknown or unavailable device

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass
class JobConfig:
    """Everything that defines a retraining run (all of it is recorded with the run).

    ``source``: a zoo model name or folder, ``run:<id>`` (fine-tune a previous run) or
    ``scratch:<preset>`` (train the preset's architecture from a fresh seeded init).
    ``regularizers``: specs as :func:`attn_core.regularizers.parse_specs` reads them, e.g.
    ``{"entropy": 0.1, "topk:2": 0.5}`` or ``["vocab_entropy@L1=0.05"]``; ``heads`` the default
    head selection of specs that name none (``"L1"``, ``"L0H1,L1H2"``; None = every head).
    ``entmax_alpha``: None keeps the parent's attention; 1 softmax, 1.5 entmax15, 2 sparsemax.
    ``batch_size``/``weight_decay`` default to the parent's training recipe (else 64 / 0.1);
    ``warmup_steps`` to ``warmup_of(steps)``, min(100, steps // 10). ``precision`` fp32 or bf16 (autocast);
    ``sync_every`` steps between reads of the device (None: the device's default, see
    ``device.sync_interval``; telemetry and spectrum steps are read at once); ``compile``
    compiles the step (``training.step``).
    ``checkpoint_*``: the weights kept across training (``training.checkpoint_plan.CheckpointPlan``:
    every N steps, N log-spaced steps, given steps, ``all`` or ``attn`` tensors, a bound in MiB);
    nothing is kept when none of every/log/steps is set.

    Text (``attn_core.text``): ``text`` a corpus (a .txt file or a folder of them, .jsonl, Parquet)
    that the source's own tokenizer.json tokenizes, ``text_field`` its JSON key / column,
    ``eval_text`` a held-out corpus (default the last 10% of the stream), ``block`` tokens per
    sequence (default min(context, 256)). ``train``: all, attn or qk, what learns; ``kl`` the
    strength of KL(start || model) on the training batch (``attn_core.finetune``).

    ``penalty_rows``: None computes the data-view row penalties (entropy, hoyer, topk, sink) over every
    query row; M (1..:data:`MAX_PENALTY_ROWS`) estimates each head's row mean from M query
    positions drawn per step (``regularizers.build_penalty(rows=M)``, seeded by ``seed``): unbiased
    for the value and its gradient, cheaper in time. M at least the sequence length (less the
    first row, which sees one key under the causal mask) computes every row again, the exact value.
    Vocabulary-view and spectral penalties are always exact.

    ``workers``: None trains in this process; N trains the same run on N Ray Train workers
    (``attn_core.distributed``: the global batch split across them, one run recorded by rank 0),
    each with ``gpus_per_worker`` GPUs (0: CPU workers), with ``strategy`` ddp or fsdp."""

    source: str
    regularizers: object = setting(
        factory=dict,
        widget=dict(  # one per regularizer the page adds: {penalty} and {what} it penalises
            kind="select",
            label="λ of {penalty}",
            help="Strength of λ·R (log scale); R = {what}",
            options=LAMBDAS,
            format="{:.3g}",
            value=0.1,
        ),
    )
    # each setting once: default, CLI flag and help, bounds, reproduce line, page widget
    # (training.settings); the order is the reproduce line's (command())
    heads: str | None = setting(
        None, "--heads", "Heads of every --reg without its own @HEADS (L1, L0H1,L1H2; default every head)."
    )
    steps: int = shared(
        "steps",
        "retrain",
        always=True,
        widget=dict(label="Steps", help="Optimizer updates", min_value=1, max_value=100_000, step=50),
    )
    seed: int = shared(
        "seed",
        "retrain",
        always=True,
        widget=dict(
            label="Seed",
            help="Seed of the training data: the same settings and seed give the same run",
            min_value=0,
            max_value=2**31 - 1,
            step=1,
        ),
    )
    lr: float = shared(
        "lr",
        "retrain",
        always=True,
        widget=dict(
            kind="select",
            label="Learning rate",
            help="Peak AdamW learning rate (log scale; warmup, then cosine decay)",
            options=RATES,
            format="{:.2g}",
        ),
    )
    entmax_alpha: float | None = setting(
        None,
        "--entmax-alpha",
        "Attention: 1 softmax, 1.5 entmax15, 2 sparsemax (default: the parent's).",
        fmt="g",
        widget=dict(
            kind="select",
            label="entmax α",
            help="Attention normalisation: 1 softmax, 1.5 entmax15, 2 sparsemax (exact zeros)",
            options=tuple(ALPHAS),
            labels=ALPHAS,
        ),
    )
    batch_size: int | None = shared("batch_size", "retrain")
    device: str = shared(
        "device",
        "retrain",
        # the page offers the devices present (its options), the last (a GPU where there is one) first
        widget=dict(
            kind="choice", label="Device", help="Where the model trains; CUDA is listed only when a GPU is present"
        ),
    )
    precision: str = shared(
        "precision",
        "retrain",
        widget=dict(
            kind="choice",
            label="Precision",
            help="fp32, or bf16 autocast (forward and loss in bfloat16, weights and AdamW in fp32)",
            options=PRECISIONS,
        ),
    )
    sync_every: int | None = setting(
        None,
        "--sync-every",
        "Steps between two reads of the losses from the device (default: 1 on CPU, 25 on CUDA); the NaN guard "
        "checks them there and keeps the last good weights.",
    )
    compile: bool = setting(
        False,
        "--compile/--no-compile",
        "torch.compile the training step (CUDA graphs on CUDA; compiling takes a while, then each step is "
        "faster). Falls back to the eager step if it cannot compile.",
        widget=dict(
            kind="check",
            label="Compile the training step",
            help="torch.compile of forward, loss and penalties (CUDA graphs on a GPU): compiling takes tens of "
            "seconds before the first step, then each step is faster. Falls back to the plain step if it cannot "
            "compile (the run's message says so).",
        ),
    )
    checkpoint_every: int | None = setting(
        None,
        "--checkpoint-every",
        "Keep the weights every N steps (and at step 0 and the last step) as safetensors in the run's "
        "checkpoints/ folder, listed in its card.",
    )
    checkpoint_log: int | None = setting(
        None,
        "--checkpoint-log",
        "Keep the weights at up to N steps spaced evenly in log(step) from 1 to the end (dense early, where "
        "circuits form; steps that round to the same step count once, so fewer than N early in a short run: "
        "the card's checkpoints.kept says how many); combines with --checkpoint-every.",
        widget=dict(
            label="Checkpoints (log-spaced)",
            help="Keep the weights at this many steps spaced evenly in log(step), plus step 0 and the last, in "
            "the run's folder (listed in its card): scrub them on the Dynamics page. 0 keeps none",
            min_value=0,
            max_value=500,
            step=10,
        ),
    )
    checkpoint_steps: list[int] | None = setting(
        None, "--checkpoint-steps", "Keep the weights at these steps too, comma-separated (0,50,100)."
    )
    checkpoint_params: str = setting(
        "all",
        "--checkpoint-params",
        "all, or attn: only attention and LayerNorm weights (what the QK/OV views need; much smaller for "
        "large models).",
        needs=("checkpoint_every", "checkpoint_log", "checkpoint_steps"),
    )
    checkpoint_max_mb: float | None = setting(
        None,
        "--checkpoint-max-mb",
        "Refuse, before training, checkpoints that would take more than this many MiB (default 1024).",
        fmt="g",
    )
    text: str | None = setting(
        None,
        "--text",
        "Retrain on this text: a .txt file or a folder of them, .jsonl (one JSON object per line) or "
        f"Parquet ({TEXT_LIMIT}), tokenized by the model folder's own tokenizer.json (cached in the run store's text-cache).",
    )
    text_field: str | None = setting(None, "--text-field", "The text's JSON key or Parquet column (default text).")
    eval_text: str | None = setting(
        None, "--eval-text", f"Held-out text (same formats); default the last {HELD_OUT_FRACTION:.0%} of --text."
    )
    block: int | None = setting(
        None, "--block", f"Tokens per training sequence (default min(context, {DEFAULT_BLOCK})).", bounds=(2, MAX_BLOCK)
    )
    train: str = setting("all", "--train", TRAIN_HELP)
    kl: float = setting(
        0.0,
        "--kl",
        "Add LAMBDA * KL(starting model || model) per token on the training batch, to keep behaviour while heads "
        "concentrate (0: off).",
        bounds=(0, 1e6),
        fmt="g",
    )
    penalty_rows: int | None = setting(
        None,
        "--penalty-rows",
        "Estimate the row penalties (entropy, hoyer, topk, sink) from M query rows per head drawn at random each step "
        "instead of every row: unbiased for the value and its gradient, cheaper on long sequences. "
        f"1..{MAX_PENALTY_ROWS:,}; M at least the sequence length computes every row (default: every row).",
        bounds=(1, MAX_PENALTY_ROWS),
        metavar="M",
        widget=dict(
            label="Rows per head for the penalty (0 = all)",
            help="Entropy, Hoyer and top-k penalties from this many query rows per head, drawn at random each "
            "step: an unbiased estimate of the penalty and its gradient, cheaper on long sequences, noisier. "
            "0, or at least the sequence length, uses every row (the exact penalty). Other penalties are exact",
            min_value=0,
            step=1,
        ),
    )
    threads: int | None = setting(
        None,
        "--threads",
        "torch CPU threads while training (default: chosen from the step's size, the free cores and "
        "OMP_NUM_THREADS; a small model trains fastest on one).",
        bounds=(1, MAX_THREADS),
    )
    workers: int | None = setting(
        None,
        "--workers",
        "Train the same run on N Ray Train workers (the batch split across them, gradients averaged; rank 0 "
        "records the one run). Default: in this process, without Ray.",
        metavar="N",
        widget=dict(  # offered where Ray sees more than one GPU or a cluster: {where}, up to its workers
            label="Workers on {where}",
            help="Train the run on this many Ray Train workers, the batch split across them (0: in a worker "
            "process here, as without Ray). Rank 0 records the one run",
            min_value=0,
            step=1,
        ),
    )
    gpus_per_worker: float = setting(
        0,
        "--gpus-per-worker",
        "GPUs of each worker (CUDA, NCCL); 0: CPU workers (gloo).",
        metavar="G",
        fmt="g",
        needs=("workers",),
        # the page offers what the machine or cluster has (workers_offer), the first by default
        widget=dict(kind="choice", label="GPUs per worker", help="0: CPU workers"),
    )
    strategy: str = setting(
        "ddp",
        "--strategy",
        STRATEGY_HELP,
        needs=("workers",),
        widget=dict(kind="choice", label="Strategy", help=STRATEGY_HELP, options=STRATEGIES),
    )
    # settings of the library and the page that the CLI does not take (not in the reproduce line)
    weight_decay: float | None = shared("weight_decay", "retrain")
    warmup_steps: int | None = shared("warmup_steps", "retrain")
    eval_every: int = shared("eval_every", "retrain")
    eval_samples: int = shared("eval_samples", "retrain")
    telemetry_every: int = 20
    spectrum_every: int = 50
    probe_samples: int = 16
    measure_samples: int = 512
    max_loss: float | None = None

    def __post_init__(self) -> None:
        def ok(cond: bool, msg: str) -> None:
            check(cond, msg, prefix="invalid retraining setting: ")

        ok(
            isinstance(self.source, str) and self.source.strip() != "",
            "source must name a model, run:<id> or scratch:<preset>",
        )

        def count(v, lo: int = 1, hi: int | None = MAX_STEPS) -> bool:
            return is_int(v) and lo <= v and (hi is None or v <= hi)

        ok(count(self.steps, hi=None), f"steps must be a positive integer, got {shown(self.steps)}")
        ok(
            in_bounds(self, "steps", self.steps),
            f"steps must be at most {MAX_STEPS:,} (the limit of this lab), got {shown(self.steps, 30)}",
        )
        for name, hi in (
            ("eval_every", MAX_STEPS),
            ("telemetry_every", MAX_STEPS),
            ("spectrum_every", MAX_STEPS),
            ("eval_samples", MAX_SAMPLES),
            ("probe_samples", MAX_SAMPLES),
            ("measure_samples", MAX_SAMPLES),
        ):
            v = getattr(self, name)
            ok(count(v, hi=hi), f"{name} must be an integer in 1..{hi:,}, got {shown(v)}")
        if self.entmax_alpha is not None:
            ok(
                is_number(self.entmax_alpha) and 1.0 <= self.entmax_alpha <= 2.0,
                f"entmax_alpha must be in [1, 2] (1 softmax, 1.5 entmax15, 2 sparsemax), got {shown(self.entmax_alpha)}",
            )
        ok(self.max_loss is None or (is_number(self.max_loss) and self.max_loss > 0), "max_loss must be positive")
        ok(
            is_int(self.seed) and in_bounds(self, "seed", self.seed),
            f"seed must be an integer in 0..2^63-1, got {shown(self.seed)}",
        )
        ok(is_number(self.lr) and 0 < self.lr <= 10, f"lr must be in (0, 10], got {shown(self.lr)}")
        # None: the parent's recipe decides (train_config); a given value is checked like the recipe's
        check_bounds(self, ("batch_size", "warmup_steps", "weight_decay"), prefix="invalid retraining setting: ")
        for name in ("text", "text_field", "eval_text"):
            v = getattr(self, name)
            ok(
                v is None or (isinstance(v, str) and v.strip() != "" and "\x00" not in v),
                f"{name} must be a path or name",
            )
        ok(
            self.text is not None or (self.text_field is None and self.eval_text is None),
            "--text-field and --eval-text need --text",
        )
        ok(
            self.block is None or (is_int(self.block) and in_bounds(self, "block", self.block)),
            f"block must be an integer of at least 2 tokens, got {shown(self.block)}",
        )
        ok(self.block is None or self.text is not None, "--block needs --text (toys have their own sequence length)")
        ok(
            isinstance(self.train, str) and self.train in TRAIN,
            f"train must be one of {', '.join(TRAIN)}, got {shown(self.train)}",
        )
        ok(
            self.heads is None or (isinstance(self.heads, str) and len(self.heads) <= 10_000),
            f"heads must be a head selection such as 'L1' or 'L0H1,L1H2' (a str), got {shown(self.heads)}",
        )
        ok(
            is_number(self.kl) and in_bounds(self, "kl", self.kl),
            f"kl must be a number in 0..1e6, got {shown(self.kl)}",
        )
        ok(
            self.penalty_rows is None
            or (is_int(self.penalty_rows) and in_bounds(self, "penalty_rows", self.penalty_rows)),
            f"penalty_rows must be a whole number of query rows per head in 1..{MAX_PENALTY_ROWS:,} "
            f"(unset: every row), got {shown(self.penalty_rows)}",
        )
        check_scaling(self.workers, self.gpus_per_worker, self.strategy, self.device, "invalid retraining setting: ")
        # parsed once, here: names, lambdas and k are checked now, heads once the model is known; the
        # job hands these down to the penalty, and the record writes them
        self.specs = R.parse_specs(self.regularizers)
        check_specs(self.strategy, self.specs, self.kl, "invalid retraining setting: ")
        self.train_config({})  # lr, batch size, device, precision, sync_every ...
        plan = self.checkpoint_plan()  # every, log, steps, params, bound
        if plan is not None:
            plan.schedule(self.steps)

    def checkpoint_plan(self) -> CheckpointPlan | None:
        """The checkpoints this run keeps (None: none)."""
        return CheckpointPlan.of(
            self.checkpoint_every,
            self.checkpoint_log,
            self.checkpoint_steps or (),
            self.checkpoint_params,
            self.checkpoint_max_mb,
        )

    def train_config(self, parent_train: dict) -> TrainConfig:
        """The TrainConfig of this run, taking what is unset from the parent's recipe."""
        return TrainConfig(
            steps=self.steps,
            lr=float(self.lr),
            seed=int(self.seed),
            device=self.device,
            precision=self.precision,
            sync_every=self.sync_every,
            compile=self.compile,
            threads=self.threads,
            batch_size=self.batch_size if self.batch_size is not None else int(parent_train.get("batch_size", 64)),
            weight_decay=float(
                self.weight_decay if self.weight_decay is not None else parent_train.get("weight_decay", 0.1)
            ),
            warmup_steps=self.warmup_steps if self.warmup_steps is not None else warmup_of(self.steps),
            eval_every=self.eval_every,
            eval_samples=self.eval_samples,
        )

    def to_dict(self) -> dict:
        out = asdict(self)
        out["regularizers"] = [str(s) for s in self.specs]
        return out

    def command(self, shown: dict[str, str] | None = None) -> str:
        """The ``attn-lab retrain`` command that makes this run: the regularizers, then every
        setting declared with a flag that differs from its default (``training.settings``);
        ``shown`` names a source or a text path in the page's words (an upload's own name for the
        path it is kept at)."""
        shown = shown or {}
        parts = ["attn-lab", "retrain", shlex.quote(shown.get(self.source, self.source))]
        for spec in self.to_dict()["regularizers"]:
            parts += ["--reg", shlex.quote(spec)]
        return " ".join(parts + command_args(self, shown))
