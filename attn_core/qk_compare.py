"""Merged vs factored QK (seed 004): does a head need two d_model x d_qk factors W_Q, W_K, or can
one d_model x d_model matrix W_QK do?

Per head, with X the attention input (row vectors, shared/DESIGN.md):

    factored   S = (X W_Q)(X W_K)^T / sqrt(d_qk)    B = W_Q W_K^T / sqrt(d_qk)    rank(B) <= d_qk
               parameters 2 d_model d_qk  (+ 2 d_qk with query/key biases)
    merged     S = X W_QK X^T                       B = W_QK                      rank(B) <= d_model
               parameters d_model^2

Without biases the two compute the same scores when W_QK = W_Q W_K^T / sqrt(d_qk)
(:func:`merged_from_factored`); conversely a merged B of rank r is a factored head with d_qk = r
(:func:`factored_from_merged`). What differs is what training finds. For any M = U diag(s) V^T,

    min over W_Q W_K^T = M of (||W_Q||_F^2 + ||W_K||_F^2) / 2  =  ||M||_*  (nuclear norm, sum s)

attained by the balanced factors W_Q = U diag(s)^{1/2}, W_K = V diag(s)^{1/2}
(:func:`balanced_factors`; >= by ||M||_* = tr(U^T W_Q W_K^T V) <= ||W_Q U||_F ||W_K V||_F <= the
mean of the squares). So an L2 penalty (lambda/2)(||W_Q||_F^2 + ||W_K||_F^2) on the factors costs,
at the best balance, lambda sqrt(d_qk) ||B||_*: weight decay on both factors penalises the nuclear
norm of B (a convex surrogate of rank), whereas weight decay on W_QK penalises ||B||_F^2, which
does not favour low rank. AdamW decays decoupled from the gradient, so for it the equivalence
holds for the decay term's fixed points, not step by step.

:func:`compare` trains one architecture on one task and the same seeds (same data, same
recipe) with

- factored heads for several d_qk (``ModelConfig.d_qk``: only the query/key width changes, values
  and outputs keep d_head, so the rank cap of B is the only architectural difference),
- merged heads without decay on W_QK (no bias towards low rank at all),
- merged heads with AdamW weight decay ``qk_weight_decay`` on W_QK,
- merged heads with the penalty ``nuclear * mean_h ||B_h||_*`` (regularizers' ``nuclear``),

every other matrix decayed by the recipe's ``weight_decay`` (W_Q and W_K included). Each run is
measured on one fixed held-out set, its B's spectrum is taken per head, and its B is truncated to
rank r (Eckart-Young, :func:`truncated`) to see how much of the rank the model uses. Runs are saved
in the run store (parent ``compare-qk:<task>``).
"""
from __future__ import annotations

import json
import math
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import pandas as pd
import torch

from attn_core.bilinear import QKForm
from attn_core.model import ModelConfig, Transformer
from attn_core.tasks import TASKS, Task, get_task
from attn_core.train import (MEASURE_KEYS, Diverged, TrainConfig, Trainer, evaluate, init_model, lr_factor,
                             measure)

PARENT_PREFIX = "compare-qk:"  # runs of a comparison have parent "compare-qk:<task>"
VARIANT_KINDS = ("factored", "merged", "merged + wd", "merged + nuclear")
TRUNCATION_RANKS = (1, 2, 4, 8, 16, 32, 64)  # those <= d_model are used
MAX_STEPS = 100_000
MAX_SEEDS = 64
# (fraction of the work done, what is running) -> None; the page passes an st.progress updater.
Progress = Callable[[float, str], None]


# --- parameter counts --------------------------------------------------------------------------------

def qk_params_per_head(d_model: int, qk: str, d_qk: Optional[int] = None, bias: bool = False) -> int:
    """Query/key parameters of one head: factored 2 d_model d_qk (+ 2 d_qk biases), merged d_model^2
    (a merged head has no query/key bias)."""
    if qk == "merged":
        return d_model * d_model
    if qk != "factored" or d_qk is None:
        raise ValueError(f"qk must be 'factored' (with d_qk) or 'merged', got {qk!r} with d_qk={d_qk!r}")
    return 2 * d_model * d_qk + (2 * d_qk if bias else 0)


def n_params_formula(cfg: ModelConfig) -> int:
    """The parameter count of a model, from its config alone (checked against
    ``Transformer.n_params`` in the tests). With d, V, T, h, d_head, d_mlp as in the config:

        embeddings   V d (+ T d learned positions);  unembedding  d V + V;  final LayerNorm 2d
        per layer    ln1 2d + h qk_params_per_head + h 2 d d_head (W_V, W_O) (+ h d_head + d biases)
                     (+ ln2 2d + 2 d d_mlp + d_mlp + d with an MLP)

    LayerNorms count 0 with ``normalization = "none"``. Factored layers store W_Q/W_K at the layer's
    widest d_qk (narrower heads are zero-padded), so that width is what is counted."""
    d, h = cfg.d_model, cfg.n_heads
    ln = 2 * d if cfg.normalization == "layernorm" else 0
    total = cfg.d_vocab * d + (cfg.n_ctx * d if cfg.positional == "learned" else 0) + d * cfg.d_vocab + cfg.d_vocab + ln
    for layer in range(cfg.n_layers):
        width = cfg.qk_width(layer) if cfg.qk == "factored" else None
        total += ln + h * qk_params_per_head(d, cfg.qk, width, cfg.attn_bias) + 2 * h * d * cfg.d_head
        if cfg.attn_bias:
            total += h * cfg.d_head + d
        if cfg.d_mlp > 0:
            total += ln + 2 * d * cfg.d_mlp + cfg.d_mlp + d
    return total


# --- the two parametrisations, exactly --------------------------------------------------------------

def balanced_factors(M: torch.Tensor, width: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q = U_r diag(s_r)^{1/2}, W_K = V_r diag(s_r)^{1/2} from the SVD M = U diag(s) V^T, batched
    over leading dims, keeping the ``width`` largest singular values (default all, min(m, n)).
    W_Q W_K^T is the best rank-``width`` approximation of M, and (||W_Q||^2 + ||W_K||^2)/2 equals
    its nuclear norm, the least over every factorization of it."""
    U, s, Vh = torch.linalg.svd(M, full_matrices=False)
    r = s.shape[-1] if width is None else width
    if not 1 <= r <= s.shape[-1]:
        raise ValueError(f"width {width!r} is outside 1..{s.shape[-1]} (the rank cap of a "
                         f"{M.shape[-2]} x {M.shape[-1]} matrix)")
    root = s[..., :r].sqrt().unsqueeze(-2)  # [..., 1, r]
    return U[..., :r] * root, Vh[..., :r, :].transpose(-1, -2) * root


def _like(model: Transformer, cfg: ModelConfig) -> Transformer:
    """A new model of ``cfg`` on the device and in the dtype of ``model``."""
    p = next(model.parameters())
    return Transformer(cfg).to(device=p.device, dtype=p.dtype).train(model.training)


def _copy_except_qk(src: Transformer, dst: Transformer) -> None:
    own = dict(dst.named_parameters())
    for name, p in src.named_parameters():
        if name.rsplit(".", 1)[-1] not in ("W_Q", "W_K", "W_QK", "b_Q", "b_K"):
            own[name].data.copy_(p.data)


def _check_no_qk_bias(model: Transformer) -> None:
    if model.cfg.attn_bias and model.cfg.qk == "factored":
        # S = X B X^T + 1 (b_Q W_K^T X^T) / sqrt(d_qk) + terms constant along a row: the key-bias
        # term depends on the key and no W_QK reproduces it.
        raise ValueError("this model has query/key biases, which a merged head (S = X W_QK X^T) cannot "
                         "represent; merge only models with attn_bias = false")


@torch.no_grad()
def merged_from_factored(model: Transformer) -> Transformer:
    """The merged model with W_QK = W_Q W_K^T / sqrt(d_qk) per head and every other weight
    copied: it computes the same scores, patterns and logits."""
    if model.cfg.qk != "factored":
        raise ValueError("the model is already merged")
    _check_no_qk_bias(model)
    out = _like(model, replace(model.cfg, qk="merged", d_qk=None))
    _copy_except_qk(model, out)
    for l, block in enumerate(model.blocks):
        out.blocks[l].attn.W_QK.copy_(QKForm.from_layer(model, l).dense)
    return out


@torch.no_grad()
def factored_from_merged(model: Transformer, d_qk: int) -> Transformer:
    """A factored model with query/key width ``d_qk`` whose B is the best rank-d_qk approximation
    of each merged head's W_QK (balanced factors, scaled by d_qk^{1/4} each so that
    W_Q W_K^T / sqrt(d_qk) is that approximation). Exact when every rank(W_QK) <= d_qk."""
    if model.cfg.qk != "merged":
        raise ValueError("the model is not merged")
    d = model.cfg.d_model
    if not isinstance(d_qk, int) or not 1 <= d_qk <= d:
        raise ValueError(f"d_qk={d_qk!r} is outside 1..{d} (d_model)")
    cfg = replace(model.cfg, qk="factored", d_qk=[[d_qk] * model.cfg.n_heads for _ in range(model.cfg.n_layers)])
    out = _like(model, cfg)
    _copy_except_qk(model, out)
    for l, block in enumerate(model.blocks):
        W_Q, W_K = balanced_factors(block.attn.W_QK, d_qk)
        out.blocks[l].attn.W_Q.copy_(W_Q * d_qk ** 0.25)
        out.blocks[l].attn.W_K.copy_(W_K * d_qk ** 0.25)
    return out


@torch.no_grad()
def truncated(model: Transformer, rank: int) -> Transformer:
    """A merged copy of ``model`` whose every B is replaced by its best rank-``rank`` approximation
    (Eckart-Young: the ``rank`` largest singular triplets). ``rank >= rank(B)`` changes nothing."""
    d = model.cfg.d_model
    if not isinstance(rank, int) or not 1 <= rank <= d:
        raise ValueError(f"rank {rank!r} is outside 1..{d} (d_model)")
    merged = merged_from_factored(model) if model.cfg.qk == "factored" else _clone(model)
    for block in merged.blocks:
        W_Q, W_K = balanced_factors(block.attn.W_QK, rank)
        block.attn.W_QK.copy_(W_Q @ W_K.transpose(-1, -2))
    return merged


def _clone(model: Transformer) -> Transformer:
    out = _like(model, model.cfg)
    out.load_state_dict(model.state_dict())
    return out


# --- variants and settings ------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """One QK parametrisation of the comparison. ``qk_weight_decay`` None means W_Q/W_K/W_QK are
    decayed like every other matrix (the recipe's weight_decay); ``nuclear`` is lambda of
    lambda * mean_h ||B_h||_*."""

    name: str
    qk: str
    d_qk: Optional[int] = None
    qk_weight_decay: Optional[float] = None
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

    task: str = "induction"
    steps: int = 400
    seeds: int = 3
    first_seed: int = 0
    d_qks: tuple = (1, 2, 4, 16)
    merged_kinds: tuple = ("merged", "merged + wd", "merged + nuclear")
    n_layers: int = 2
    n_heads: int = 2
    d_model: int = 32
    d_head: int = 16
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.1
    qk_weight_decay: float = 3.0
    nuclear: float = 0.01
    warmup_steps: Optional[int] = None  # default min(100, steps // 10)
    eval_every: int = 25
    eval_samples: int = 256
    measure_samples: int = 512
    eval_seed: int = 0
    device: str = "cpu"
    # torch intra-op threads while training (0: leave the process's setting). These models are too
    # small for threads to pay, and on a busy machine oversubscribed threads spin: the page's default
    # comparison took 36 s with 1 thread and 418 s with 2 on the shared 2-core machine.
    threads: int = 1

    def __post_init__(self) -> None:
        self.d_qks = tuple(self.d_qks)
        self.merged_kinds = tuple(self.merged_kinds)

        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"invalid comparison setting: {msg}")

        def is_int(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        check(self.task in TASKS, f"unknown task {self.task!r}; known tasks: {', '.join(TASKS)}")
        check(is_int(self.steps) and 1 <= self.steps <= MAX_STEPS, f"steps must be 1..{MAX_STEPS}, got {self.steps!r}")
        check(is_int(self.seeds) and 1 <= self.seeds <= MAX_SEEDS, f"seeds must be 1..{MAX_SEEDS}, got {self.seeds!r}")
        check(is_int(self.first_seed) and self.first_seed >= 0, f"first_seed must be >= 0, got {self.first_seed!r}")
        check(is_int(self.d_model) and 1 <= self.d_model <= 512, f"d_model must be 1..512, got {self.d_model!r}")
        for w in self.d_qks:
            check(is_int(w) and 1 <= w <= self.d_model, f"d_qk {w!r} is outside 1..{self.d_model} (d_model)")
        check(len(set(self.d_qks)) == len(self.d_qks), f"d_qks {list(self.d_qks)} repeat a width")
        bad = [k for k in self.merged_kinds if k not in VARIANT_KINDS[1:]]
        check(not bad, f"merged kind {bad[0] if bad else ''!r} is not one of {', '.join(VARIANT_KINDS[1:])}")
        check(len(set(self.merged_kinds)) == len(self.merged_kinds), "merged_kinds repeat a kind")
        check(len(self.d_qks) + len(self.merged_kinds) >= 1, "there is no variant to train")
        for name in ("weight_decay", "qk_weight_decay", "nuclear"):
            v = getattr(self, name)
            check(isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v <= 100, f"{name} must be in [0, 100], got {v!r}")
        check("merged + wd" not in self.merged_kinds or self.qk_weight_decay > 0, "qk_weight_decay must be > 0 for 'merged + wd'")
        check("merged + nuclear" not in self.merged_kinds or self.nuclear > 0, "nuclear must be > 0 for 'merged + nuclear'")
        for name in ("eval_every", "eval_samples", "measure_samples"):
            v = getattr(self, name)
            check(is_int(v) and v > 0, f"{name} must be a positive integer, got {v!r}")
        check(is_int(self.eval_seed) and self.eval_seed >= 0, "eval_seed must be >= 0")
        check(is_int(self.threads) and 0 <= self.threads <= 256, f"threads must be 0..256, got {self.threads!r}")
        self.base_model_config()  # n_layers, n_heads, d_head ... (ModelConfig's own checks)
        self.train_config(self.first_seed)  # lr, batch size, device ...

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))

    def base_model_config(self) -> ModelConfig:
        t = get_task(self.task)
        return ModelConfig(n_layers=self.n_layers, n_heads=self.n_heads, d_model=self.d_model, d_head=self.d_head,
                           d_vocab=t.d_vocab, n_ctx=t.n_ctx)

    def train_config(self, seed: int) -> TrainConfig:
        warmup = self.warmup_steps if self.warmup_steps is not None else min(100, self.steps // 10)
        return TrainConfig(steps=self.steps, batch_size=self.batch_size, lr=float(self.lr),
                           weight_decay=float(self.weight_decay), warmup_steps=warmup, eval_every=self.eval_every,
                           eval_samples=self.eval_samples, seed=seed, device=self.device)

    def variants(self) -> list[Variant]:
        out = [Variant(f"factored d_qk={w}", "factored", d_qk=w) for w in sorted(self.d_qks)]
        make = {"merged": Variant("merged", "merged", qk_weight_decay=0.0),
                "merged + wd": Variant("merged + wd", "merged", qk_weight_decay=float(self.qk_weight_decay)),
                "merged + nuclear": Variant("merged + nuclear", "merged", qk_weight_decay=0.0,
                                            nuclear=float(self.nuclear))}
        return out + [make[k] for k in VARIANT_KINDS[1:] if k in self.merged_kinds]

    def to_dict(self) -> dict:
        out = asdict(self)
        out["d_qks"], out["merged_kinds"] = list(self.d_qks), list(self.merged_kinds)
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> "CompareConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    def command(self) -> str:
        """The ``attn-lab compare-qk`` command that reproduces this comparison."""
        default = CompareConfig()
        parts = ["attn-lab", "compare-qk", "--task", self.task, "--steps", str(self.steps), "--seeds", str(self.seeds)]
        for name, flag in (("first_seed", "--first-seed"), ("d_model", "--d-model"), ("qk_weight_decay", "--qk-weight-decay"),
                           ("nuclear", "--nuclear"), ("weight_decay", "--weight-decay"), ("lr", "--lr"),
                           ("batch_size", "--batch-size"), ("device", "--device"), ("threads", "--threads")):
            if getattr(self, name) != getattr(default, name):
                parts += [flag, f"{getattr(self, name):g}" if isinstance(getattr(self, name), float) else str(getattr(self, name))]
        if self.d_qks != default.d_qks:
            parts += ["--d-qk", ",".join(str(w) for w in self.d_qks)]
        if self.merged_kinds != default.merged_kinds:
            parts += ["--merged", ",".join(self.merged_kinds) or "none"]
        return " ".join(parts)


# --- one run ----------------------------------------------------------------------------------------

def _qk_names(model: Transformer) -> set[str]:
    return {n for n, _ in model.named_parameters() if n.rsplit(".", 1)[-1] in ("W_Q", "W_K", "W_QK")}


def set_qk_weight_decay(trainer: Trainer, qk_weight_decay: float) -> None:
    """Give W_Q/W_K/W_QK their own AdamW weight decay, the rest of the recipe unchanged: the
    trainer's optimizer and schedule are rebuilt (before any step, so no state is lost) with
    three groups, other matrices (cfg.weight_decay), query/key matrices, vectors (none)."""
    if trainer.step_index != 0:
        raise ValueError("the weight decay of W_QK can only be set before the first step")
    cfg, qk = trainer.cfg, _qk_names(trainer.model)
    groups = {"decay": [], "qk": [], "none": []}
    for name, p in trainer.model.named_parameters():
        groups["qk" if name in qk else ("decay" if p.dim() >= 2 else "none")].append(p)
    trainer.optimizer = torch.optim.AdamW(
        [{"params": groups["decay"], "weight_decay": cfg.weight_decay},
         {"params": groups["qk"], "weight_decay": float(qk_weight_decay)},
         {"params": groups["none"], "weight_decay": 0.0}], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda s: lr_factor(s, cfg))


def _pick(m: Optional[dict]) -> Optional[dict]:
    return None if m is None else {k: m[k] for k in MEASURE_KEYS if k in m}


def truncation_table(model: Transformer, task: Task, ranks: Sequence[int], samples: int, seed: int) -> list[dict]:
    """Held-out loss and accuracy with every head's B cut to rank r, for each r in ``ranks``."""
    out = []
    for r in ranks:
        ev = evaluate(truncated(model, r), task, samples, seed)
        out.append({"rank": r, "loss": ev["loss"], "accuracy": ev["accuracy"]})
    return out


def train_variant(variant: Variant, cfg: CompareConfig, seed: int, store=None,
                  progress: Optional[Callable[[int], None]] = None) -> dict:
    """Train one variant with one seed; returns its record (final metrics, spectrum, curves,
    step times, truncation table, run id). ``progress(step)`` is called after every step."""
    from attn_core import regularizers as R
    from attn_core.bilinear import spectrum

    task = get_task(cfg.task)
    model_cfg = variant.model_config(cfg.base_model_config())
    train_cfg = cfg.train_config(seed)
    model = init_model(model_cfg, seed)
    penalty = R.build_penalty({"nuclear": variant.nuclear}, model) if variant.nuclear > 0 else None
    trainer = Trainer(model, task, train_cfg, penalty=penalty)
    qk_decay = cfg.weight_decay if variant.qk_weight_decay is None else variant.qk_weight_decay
    if qk_decay != cfg.weight_decay:
        set_qk_weight_decay(trainer, qk_decay)
    model = trainer.model
    config = {"variant": variant.name, "kind": variant.kind, "qk": variant.qk, "d_qk": variant.d_qk,
              "qk_weight_decay": qk_decay, "regularizers": variant.regularizers(), "steps": cfg.steps, "seed": seed,
              "comparison": cfg.to_dict(), "model": model_cfg.to_dict(), "train": train_cfg.to_dict()}
    parent = PARENT_PREFIX + cfg.task
    run_id = store.create(parent, task.name, config) if store is not None else None
    before = measure(model, task, None, cfg.measure_samples, cfg.eval_seed)
    log: list[tuple[int, str, float]] = []
    step_s: list[float] = []
    curves: list[dict] = []
    window: dict[str, list[float]] = {"loss": [], "accuracy": []}
    status, message = "completed", f"completed {cfg.steps} steps"
    start = time.perf_counter()
    while trainer.step_index < cfg.steps:
        t0 = time.perf_counter()
        try:
            m = trainer.step()
        except Diverged as d:
            kept = trainer.restore_good()
            status, message = "diverged", f"{d}; kept weights of step {kept}"
            break
        dt = time.perf_counter() - t0
        step = m.pop("step")
        if "eval_loss" not in m:  # held-out evaluations are not part of a training step's cost
            step_s.append(dt)
        log += [(step, (f"term:{k}" if penalty is not None and k in penalty.heads else k), float(v)) for k, v in m.items()]
        window["loss"].append(m["task_loss"])
        window["accuracy"].append(m["accuracy"])
        if "eval_loss" in m:
            curves.append({"step": step, "loss": statistics.fmean(window["loss"]),
                           "accuracy": statistics.fmean(window["accuracy"]),
                           "eval_loss": m["eval_loss"], "eval_accuracy": m["eval_accuracy"]})
            window = {"loss": [], "accuracy": []}
        if progress is not None:
            progress(step)
    wall = time.perf_counter() - start
    model.eval()
    after = measure(model, task, None, cfg.measure_samples, cfg.eval_seed)
    spec = spectrum(model)
    for rec in spec:
        lab = R.head_label(rec["layer"], rec["head"])
        log.append((trainer.step_index, f"stable_rank:{lab}", rec["stable_rank"]))
        log += [(trainer.step_index, f"sigma:{lab}:{i}", s) for i, s in enumerate(rec["singular_values"])]
    ranks = [r for r in TRUNCATION_RANKS if r <= cfg.d_model]
    trunc = truncation_table(model, task, ranks, cfg.measure_samples, cfg.eval_seed)
    ms = 1000 * statistics.median(step_s) if step_s else math.nan
    record = {
        "variant": variant.name, "kind": variant.kind, "qk": variant.qk, "d_qk": variant.d_qk, "seed": seed,
        "status": status, "message": message, "steps": trainer.step_index, "params": model.n_params(),
        "final_loss": after["loss"], "accuracy": after["accuracy"], "stable_rank": after["stable_rank"],
        "effective_rank": statistics.fmean(r["effective_rank"] for r in spec),
        "nuclear_norm": statistics.fmean(r["nuclear_norm"] for r in spec),
        "frobenius_norm": statistics.fmean(r["frobenius_norm"] for r in spec),
        "ln1_gain": ln1_gain(model), "ms_per_step": ms, "step_ms": [round(1000 * s, 4) for s in step_s], "wall_s": wall,
        "spectrum": [{"layer": r["layer"], "head": r["head"], "rank_cap": r["rank_cap"], "stable_rank": r["stable_rank"],
                      "effective_rank": r["effective_rank"], "singular_values": r["singular_values"]} for r in spec],
        "curves": curves, "truncation": trunc, "run_id": run_id,
    }
    if store is not None:
        store.log_metrics(run_id, log)
        card = {"name": f"run:{run_id}", "task": task.name, "parent": parent,
                "description": f"{variant.name} QK on {task.name} (seed 004 comparison), seed {seed}",
                "variant": variant.name, "regularizers": variant.regularizers(),
                "metrics": {**_pick(after), "eval_samples": cfg.measure_samples, "split": "test"},
                "before": _pick(before), "after": _pick(after), "truncation": trunc,
                "per_head": {"before": before["per_head"], "after": after["per_head"]},
                "seed": seed, "steps": trainer.step_index, "train": train_cfg.to_dict(), "comparison": cfg.to_dict(),
                "status": status, "message": message, "wall_time_s": round(wall, 2), "ms_per_step": ms,
                "device": str(trainer.device), "machine": _machine(), "params": model.n_params(),
                "command": cfg.command(), "created": time.strftime("%Y-%m-%d %H:%M:%S")}
        store.finish(run_id, status, model.cpu(), card, message=message,
                     summary={"before": _pick(before), "after": _pick(after)})
    return record


def ln1_gain(model: Transformer) -> float:
    """Mean |w| of the attention LayerNorms' gains. S = X B X^T with X = w * x_hat (+ b): scaling w
    by c and B by 1/c^2 leaves the scores unchanged when b = 0, so a penalty on the size of B (weight
    decay, nuclear norm) can be paid for by a larger, undecayed gain; this shows whether it was."""
    gains = [b.ln1.w.detach().abs().mean().item() for b in model.blocks if hasattr(b.ln1, "w")]
    return statistics.fmean(gains) if gains else math.nan


def _machine() -> str:
    return f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


# --- the comparison ---------------------------------------------------------------------------------

@dataclass
class Comparison:
    """The result of :func:`compare`: its settings and one record per (variant, seed) run (see
    :func:`train_variant`). Tables are derived from the records; ``to_dict``/``from_dict`` round-trip
    through JSON, so a saved comparison is shown exactly as it was measured."""

    config: CompareConfig
    runs: list[dict]
    machine: str = field(default_factory=_machine)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))
    wall_time_s: float = 0.0

    # tables ----------------------------------------------------------------------------------------
    def variant_names(self) -> list[str]:
        return list(dict.fromkeys(r["variant"] for r in self.runs))

    def per_seed(self) -> pd.DataFrame:
        """One row per run: variant, seed, status, params, final_loss, accuracy, ranks, ms_per_step."""
        cols = ["variant", "kind", "seed", "status", "params", "final_loss", "accuracy", "stable_rank",
                "effective_rank", "nuclear_norm", "frobenius_norm", "ln1_gain", "ms_per_step", "wall_s", "run_id"]
        return pd.DataFrame([{c: r.get(c) for c in cols} for r in self.runs], columns=cols)

    def summary(self, tolerance: float = 0.01) -> list[dict]:
        """One row per variant, means and (sample) standard deviations over seeds:
        name, qk, d_head (the query/key width d_qk; None for merged heads), rank_cap, params,
        params_qk_per_head, final_loss_mean/std, accuracy_mean/std, stable_rank_mean/std,
        effective_rank_mean, stable_rank_by_layer, rank_needed (the least tested rank r whose
        truncation keeps the mean accuracy within ``tolerance``), steps_to_bar (the first evaluation
        step at which the mean held-out accuracy over seeds reaches the task's accuracy bar; None if
        never), ln1_gain_mean, ms_per_step (median over the training steps of every seed), seeds,
        diverged (how many seeds did not complete), run_ids."""
        d = self.config.d_model
        bar = get_task(self.config.task).accuracy_bar
        trunc = self.truncation()
        curves = self.curves()
        out = []
        for name in self.variant_names():
            rs = [r for r in self.runs if r["variant"] == name]
            first = rs[0]
            acc = _mean_std(rs, "accuracy")["accuracy_mean"]
            by_rank = trunc[trunc["variant"] == name].groupby("rank")["accuracy"].mean()
            held = curves[(curves["variant"] == name) & (curves["metric"] == "eval_accuracy")]
            held = held.groupby("step")["value"].mean()
            by_layer = [statistics.fmean(h["stable_rank"] for r in rs for h in r["spectrum"] if h["layer"] == l)
                        for l in range(self.config.n_layers)]
            steps_ms = [t for r in rs for t in r["step_ms"]]
            out.append({
                "name": name, "qk": first["qk"], "kind": first["kind"], "d_head": first["d_qk"],
                "rank_cap": first["d_qk"] if first["qk"] == "factored" else d, "params": first["params"],
                "params_qk_per_head": qk_params_per_head(d, first["qk"], first["d_qk"]),
                **_mean_std(rs, "final_loss"), **_mean_std(rs, "accuracy"), **_mean_std(rs, "stable_rank"),
                "effective_rank_mean": statistics.fmean(r["effective_rank"] for r in rs),
                "nuclear_norm_mean": statistics.fmean(r["nuclear_norm"] for r in rs),
                "stable_rank_by_layer": by_layer,
                "rank_needed": next((int(k) for k, v in by_rank.items() if v >= acc - tolerance), None),
                "steps_to_bar": next((int(k) for k, v in held.items() if v >= bar), None),
                "ln1_gain_mean": statistics.fmean(r["ln1_gain"] for r in rs),
                "ms_per_step": statistics.median(steps_ms) if steps_ms else math.nan,
                "seeds": len(rs), "diverged": sum(r["status"] != "completed" for r in rs),
                "run_ids": [r["run_id"] for r in rs if r["run_id"]],
            })
        return out

    def summary_frame(self) -> pd.DataFrame:
        rows = self.summary()
        for r in rows:
            r["stable_rank_by_layer"] = ", ".join(f"{v:.2f}" for v in r["stable_rank_by_layer"])
            r["run_ids"] = ", ".join(r["run_ids"])
        return pd.DataFrame(rows)

    def curves(self) -> pd.DataFrame:
        """Tidy curves: variant, seed, step, metric (loss/accuracy: training-batch means over the
        last eval_every steps; eval_loss/eval_accuracy: held-out), value."""
        rows = [{"variant": r["variant"], "seed": r["seed"], "step": c["step"], "metric": k, "value": c[k]}
                for r in self.runs for c in r["curves"] for k in ("loss", "accuracy", "eval_loss", "eval_accuracy")]
        return pd.DataFrame(rows, columns=["variant", "seed", "step", "metric", "value"])

    def spectra(self) -> pd.DataFrame:
        """Tidy singular values of B: variant, seed, layer, head, index, singular_value,
        normalized (sigma_i / sigma_1)."""
        rows = []
        for r in self.runs:
            for h in r["spectrum"]:
                top = h["singular_values"][0] or 1.0
                rows += [{"variant": r["variant"], "seed": r["seed"], "layer": h["layer"], "head": h["head"], "index": i,
                          "singular_value": s, "normalized": s / top} for i, s in enumerate(h["singular_values"])]
        return pd.DataFrame(rows, columns=["variant", "seed", "layer", "head", "index", "singular_value", "normalized"])

    def truncation(self) -> pd.DataFrame:
        """variant, seed, rank, loss, accuracy with every B cut to that rank."""
        rows = [{"variant": r["variant"], "seed": r["seed"], **t} for r in self.runs for t in r["truncation"]]
        return pd.DataFrame(rows, columns=["variant", "seed", "rank", "loss", "accuracy"])

    # what the numbers say ------------------------------------------------------------------------------
    def findings(self, tolerance: float = 0.01) -> list[str]:
        """Sentences read off the measured numbers (nothing here is fixed in advance): which
        variants reach the best accuracy and how fast, what the rank cap costs, the rank the heads
        learn (stable rank) and need (truncation), and what weight decay and the nuclear penalty do
        to it. ``tolerance``: how far below the best accuracy still counts as reaching it."""
        rows = {r["name"]: r for r in self.summary(tolerance)}
        if not rows:
            return []
        bar = get_task(self.config.task).accuracy_bar
        best = max(r["accuracy_mean"] for r in rows.values())
        out = [f"Best held-out accuracy {best:.3f} after {self.config.steps} steps; within {tolerance:.0%} of it: "
               + ", ".join(n for n, r in rows.items() if r["accuracy_mean"] >= best - tolerance) + "."]
        speed = [f"{n} {r['steps_to_bar']}" if r["steps_to_bar"] is not None else f"{n} never"
                 for n, r in sorted(rows.items(), key=lambda kv: kv[1]["steps_to_bar"] or math.inf)]
        out.append(f"Steps until the mean held-out accuracy reaches the task's bar {bar:.0%}: " + ", ".join(speed) + ".")
        if best < bar:
            out.append(f"No variant reached the task's bar {bar:.0%} in {self.config.steps} steps, so the runs say "
                       "nothing yet about the rank the task needs: train longer.")
            return out
        factored = sorted((r for r in rows.values() if r["qk"] == "factored"), key=lambda r: r["d_head"])
        short = [r for r in factored if r["accuracy_mean"] < best - tolerance]
        if short:
            out.append("The rank cap costs accuracy: " + ", ".join(
                f"d_qk={r['d_head']} reaches {r['accuracy_mean']:.3f} ± {r['accuracy_std']:.3f}" for r in short)
                + f" (best {best:.3f}).")
        elif factored:
            out.append(f"Every factored width down to d_qk={factored[0]['d_head']} reaches the best accuracy: "
                       "this task does not need a high-rank B.")
        for name, r in rows.items():
            need = (f"cutting every B to rank {r['rank_needed']} keeps the accuracy within {tolerance:.0%}"
                    if r["rank_needed"] is not None else "no tested rank cut keeps the accuracy")
            out.append(f"{name}: stable rank of B {r['stable_rank_mean']:.2f} ± {r['stable_rank_std']:.2f} (by layer "
                       f"{', '.join(f'{v:.2f}' for v in r['stable_rank_by_layer'])}) with a cap of {r['rank_cap']}; {need}.")
        plain = rows.get("merged")
        for name in ("merged + wd", "merged + nuclear"):
            if plain and name in rows:
                r = rows[name]
                out.append(f"{name} vs merged: stable rank {r['stable_rank_mean']:.2f} vs {plain['stable_rank_mean']:.2f}, "
                           f"nuclear norm of B {r['nuclear_norm_mean']:.3g} vs {plain['nuclear_norm_mean']:.3g}, "
                           f"LayerNorm gain |w| {r['ln1_gain_mean']:.2f} vs {plain['ln1_gain_mean']:.2f}, "
                           f"accuracy {r['accuracy_mean']:.3f} vs {plain['accuracy_mean']:.3f}.")
        return out

    # persistence ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"config": self.config.to_dict(), "runs": self.runs, "machine": self.machine, "created": self.created,
                "wall_time_s": self.wall_time_s, "variants": self.summary(), "command": self.config.command()}

    @classmethod
    def from_dict(cls, raw: dict) -> "Comparison":
        if not isinstance(raw, dict) or not isinstance(raw.get("runs"), list) or not isinstance(raw.get("config"), dict):
            raise ValueError("not a saved comparison: expected a JSON object with 'config' and 'runs'")
        try:
            return cls(CompareConfig.from_dict(raw["config"]), raw["runs"], raw.get("machine", ""),
                       raw.get("created", ""), float(raw.get("wall_time_s", 0.0)))
        except TypeError as e:
            raise ValueError(f"not a saved comparison: {e}") from None

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(_finite(self.to_dict()), indent=1) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Comparison":
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no saved comparison at {path}; run experiments/merged_vs_factored.py to make one")
        try:
            raw = json.loads(path.read_text())
        except ValueError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        return cls.from_dict(raw)

    def markdown(self) -> str:
        """The summary table and findings as Markdown (the experiment's .md report)."""
        c = self.config
        lines = [f"# Merged vs factored QK on `{c.task}` (seed 004)", "",
                 f"{c.n_layers} layers x {c.n_heads} heads, d_model {c.d_model}, d_head (V/O) {c.d_head}, no MLP; "
                 f"{c.steps} steps, batch {c.batch_size}, lr {c.lr:g}, weight decay {c.weight_decay:g} on every matrix "
                 f"(W_Q, W_K included; W_QK: 0, or {c.qk_weight_decay:g} for merged + wd), nuclear penalty "
                 f"lambda {c.nuclear:g} for merged + nuclear; seeds {c.seed_list}; final metrics on {c.measure_samples} "
                 f"held-out sequences (seed {c.eval_seed}).", "",
                 f"Machine: {self.machine}; created {self.created}; total wall time {self.wall_time_s:.0f} s.", "",
                 f"Reproduce: `{c.command()}`", "",
                 "| variant | rank cap | params (QK/head) | params (model) | final loss | accuracy | stable rank of B "
                 "| stable rank by layer | ms/step |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in self.summary():
            lines.append(f"| {r['name']} | {r['rank_cap']} | {r['params_qk_per_head']} | {r['params']} "
                         f"| {r['final_loss_mean']:.4f} ± {r['final_loss_std']:.4f} | {r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f} "
                         f"| {r['stable_rank_mean']:.2f} ± {r['stable_rank_std']:.2f} "
                         f"| {', '.join(f'{v:.2f}' for v in r['stable_rank_by_layer'])} | {r['ms_per_step']:.2f} |")
        lines += ["", "Mean ± sample standard deviation over seeds; ms/step is the median over every training step "
                      "(held-out evaluations excluded) of every seed, in one process.", ""]
        trunc = self.truncation()
        if len(trunc):
            table = trunc.groupby(["variant", "rank"], sort=False)["accuracy"].mean().unstack("rank")
            ranks = list(table.columns)
            lines += ["Accuracy with every B cut to rank r (mean over seeds):", "",
                      "| variant | " + " | ".join(f"r={k}" for k in ranks) + " |",
                      "|---|" + "---|" * len(ranks)]
            for name, row in table.iterrows():
                lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
            lines.append("")
        lines += ["## What the numbers say", ""] + [f"- {s}" for s in self.findings()]
        return "\n".join(lines) + "\n"


def _mean_std(rs: list[dict], key: str) -> dict:
    vals = [r[key] for r in rs if r[key] is not None and math.isfinite(r[key])]
    mean = statistics.fmean(vals) if vals else math.nan
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return {f"{key}_mean": mean, f"{key}_std": std}


def _finite(obj):
    """JSON has no NaN: non-finite floats become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def compare(cfg: CompareConfig, store=None, progress: Optional[Progress] = None) -> Comparison:
    """Train every variant with every seed (seed-major, so a partial picture covers every variant)
    and collect the records. ``store``: a ``runs.RunStore`` (each run is saved there), None (the
    default store) or False (nothing saved). ``progress(fraction, message)`` after every step."""
    from attn_core.runs import RunStore

    store = None if store is False else (store if store is not None else RunStore())
    variants = cfg.variants()
    jobs = [(s, v) for s in cfg.seed_list for v in variants]
    total = len(jobs) * cfg.steps
    runs = []
    threads = torch.get_num_threads()
    start = time.perf_counter()
    try:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        machine = _machine()  # with the threads the steps were timed with
        for i, (seed, variant) in enumerate(jobs):
            done = i * cfg.steps
            label = f"{variant.name}, seed {seed} ({i + 1}/{len(jobs)})"
            if progress is not None:
                progress(done / total, label)
            tick = None if progress is None else (lambda step, done=done, label=label: progress((done + step) / total, label))
            runs.append(train_variant(variant, cfg, seed, store, tick))
    finally:
        torch.set_num_threads(threads)
    if progress is not None:
        progress(1.0, "done")
    return Comparison(cfg, runs, machine=machine, wall_time_s=time.perf_counter() - start)


def results_path(root: Optional[str | Path] = None) -> Path:
    """Where experiments/merged_vs_factored.py saves the full comparison (JSON; .md beside it)."""
    base = Path(root) if root is not None else Path(__file__).resolve().parent.parent
    return base / "experiments" / "results" / "merged_vs_factored.json"
