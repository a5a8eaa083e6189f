"""The bare trainer: AdamW with warmup + cosine decay, gradient clipping, periodic held-out
evaluation, metric callbacks, a NaN/Inf guard that keeps the last good weights, deterministic under
a seed, CUDA when available (overridable).

It knows the model and the task only: presets, the run store and the live job build on it (see
docs/architecture.md). The step loop that ends a run on divergence and records it is
:func:`attn_core.training.record.record_run`.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields

import torch

from attn_core.model import Transformer
from attn_core.tasks import Batch, Task
from attn_core.validate import check, is_int, is_number

# Extra loss terms (regularizers): called with the model, the batch and the forward's cache;
# returns named scalar terms that are added to the task loss.
Penalty = Callable[[Transformer, Batch, dict], dict[str, torch.Tensor]]
Callback = Callable[[dict], None]

EVAL_SEED_OFFSET = 1_000_003  # held-out batches never share a generator stream with training
# A task loss above DIVERGENCE_FACTOR * ln(d_vocab) (a uniform guess costs ln(d_vocab)) means
# the run is confidently wrong everywhere: training has diverged even if no NaN appeared yet.
DIVERGENCE_FACTOR = 4.0


class Diverged(RuntimeError):
    """A step produced a non-finite or exploding loss or gradient; no update was applied."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"diverged at step {step}: {reason}")
        self.step, self.reason = step, reason


@dataclass
class TrainConfig:
    """The recipe of one training run (recorded in every card as ``train``)."""

    steps: int = 2000
    batch_size: int = 128
    lr: float = 3e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.98
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_samples: int = 512
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        def ok(cond: bool, msg: str) -> None:
            check(cond, msg, prefix="invalid training setting: ")

        def count(v, lo: int = 1) -> bool:
            return is_int(v) and v >= lo

        ok(count(self.steps), f"steps must be a positive integer, got {self.steps!r}")
        ok(count(self.batch_size) and self.batch_size <= 65536, f"batch_size must be 1..65536, got {self.batch_size!r}")
        ok(is_number(self.lr) and 0 < self.lr <= 10, f"lr must be in (0, 10], got {self.lr!r}")
        ok(is_number(self.weight_decay) and self.weight_decay >= 0, "weight_decay must be >= 0")
        ok(is_number(self.beta1) and is_number(self.beta2) and 0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
           "betas must be in [0, 1)")
        ok(count(self.warmup_steps, 0), "warmup_steps must be >= 0")
        ok(is_number(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1, "min_lr_ratio must be in [0, 1]")
        ok(is_number(self.grad_clip) and self.grad_clip > 0, "grad_clip must be positive")
        ok(count(self.eval_every), "eval_every must be a positive integer")
        ok(count(self.eval_samples), "eval_samples must be positive")
        ok(is_int(self.seed), f"seed must be an integer, got {self.seed!r}")
        select_device(self.device)  # raises on an unknown or unavailable device

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


def select_device(name: str = "auto") -> torch.device:
    """'auto' is CUDA when present, else CPU; 'cpu' and 'cuda[:i]' are honoured if available."""
    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use auto, cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA GPU is available; use cpu or auto")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}; use auto, cpu or cuda")
    return dev


def available_devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to 1, then cosine decay to ``min_lr_ratio`` at the last step."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def init_model(model_cfg, seed: int) -> Transformer:
    model = Transformer(model_cfg)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    return model


def make_optimizer(model: Transformer, cfg: TrainConfig) -> torch.optim.AdamW:
    """Weight decay on matrices only (not on biases, LayerNorm gains or embeddings' biases)."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


@torch.no_grad()
def evaluate(model: Transformer, task: Task, samples: int = 512, seed: int = 0,
             split: str = "test", device: torch.device | None = None, cache: dict | None = None) -> dict:
    """Accuracy and loss on ``samples`` held-out sequences drawn with their own seed; pass a
    dict as ``cache`` to keep the forward's attention (``Transformer.forward``)."""
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    batch = task.sample(samples, seed + EVAL_SEED_OFFSET, split=split).to(device)
    logits = model(batch.tokens, cache=cache)
    out = {"accuracy": task.accuracy(logits, batch), "loss": task.loss(logits, batch).item(), "samples": samples}
    model.train(was_training)
    return out


class Trainer:
    """Optimises a model on a task; ``step()`` is one update, ``run()`` the whole schedule.

    Callbacks receive a metrics dict after every step (``step``, ``loss``, ``task_loss``,
    ``accuracy`` on the training batch, each penalty term, ``grad_norm``, ``lr``, and after
    evaluations ``eval_accuracy``/``eval_loss``).

    Guard: a step whose loss or gradient is NaN/Inf, or whose task loss exceeds ``max_loss``
    (default ``DIVERGENCE_FACTOR * ln(d_vocab)``), raises :class:`Diverged` before any update.
    The weights of the last step whose loss and gradient were finite are kept in
    ``good_state`` (``good_step`` updates applied); :meth:`restore_good` puts them back."""

    def __init__(self, model: Transformer, task: Task, cfg: TrainConfig,
                 callbacks: Iterable[Callback] = (), penalty: Penalty | None = None,
                 max_loss: float | None = None):
        if model.cfg.d_vocab != task.d_vocab or model.cfg.n_ctx < task.n_ctx:
            raise ValueError(f"model (d_vocab={model.cfg.d_vocab}, n_ctx={model.cfg.n_ctx}) does not fit task "
                             f"{task.name!r} (d_vocab={task.d_vocab}, n_ctx={task.n_ctx})")
        self.cfg, self.task, self.penalty = cfg, task, penalty
        self.device = select_device(cfg.device)
        self.model = model.to(self.device).train()
        self.callbacks = list(callbacks)
        self.optimizer = make_optimizer(self.model, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, cfg))
        self.data = torch.Generator().manual_seed(cfg.seed)
        self.step_index = 0
        self.max_loss = DIVERGENCE_FACTOR * math.log(max(task.d_vocab, 2)) if max_loss is None else max_loss
        self.params = [p for p in self.model.parameters()]
        self.good_state = [p.detach().clone() for p in self.params]
        self.good_step = 0
        self.good_lock = threading.Lock()  # readers of good_state in other threads take it

    def step(self) -> dict:
        batch = self.task.sample(self.cfg.batch_size, self.data).to(self.device)
        cache: dict | None = {} if self.penalty is not None else None
        logits = self.model(batch.tokens, cache=cache)
        task_loss = self.task.loss(logits, batch)
        terms = self.penalty(self.model, batch, cache) if self.penalty is not None else {}
        loss = task_loss + sum(terms.values()) if terms else task_loss
        loss_value, task_value = loss.item(), task_loss.item()
        step = self.step_index + 1
        if not math.isfinite(loss_value):
            bad = next((n for n, t in terms.items() if not math.isfinite(t.item())), None)
            raise Diverged(step, f"loss is {loss_value}" + (f" (term {bad!r})" if bad else ""))
        if task_value > self.max_loss:
            raise Diverged(step, f"task loss {task_value:.4g} exceeds {self.max_loss:.3g} "
                                 f"({DIVERGENCE_FACTOR:g} x the loss of a uniform guess)")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in self.params if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads)
        grad_norm = float(total)
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise Diverged(step, f"gradient norm is {grad_norm}")
        # clip_grad_norm_'s rescaling (bit for bit), skipped when its factor would be 1
        coef = self.cfg.grad_clip / (total + 1e-6)
        if float(coef) < 1.0:
            torch._foreach_mul_(grads, coef)
        with self.good_lock:  # these weights gave a finite loss and gradient
            torch._foreach_copy_(self.good_state, [p.detach() for p in self.params])
            self.good_step = self.step_index
        self.optimizer.step()
        self.scheduler.step()
        metrics = {"step": step, "loss": loss_value, "task_loss": task_value,
                   "accuracy": self.task.accuracy(logits.detach(), batch),
                   "grad_norm": grad_norm, "lr": self.scheduler.get_last_lr()[0]}
        metrics.update({name: t.item() for name, t in terms.items()})
        self.step_index += 1
        if self.step_index % self.cfg.eval_every == 0 or self.step_index == self.cfg.steps:
            ev = evaluate(self.model, self.task, self.cfg.eval_samples, self.cfg.seed, device=self.device)
            metrics.update(eval_accuracy=ev["accuracy"], eval_loss=ev["loss"])
        for cb in self.callbacks:
            cb(metrics)
        return metrics

    def run(self, progress: bool = False) -> dict:
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=self.cfg.steps - self.step_index, desc=f"train {self.task.name}", unit="step")
        metrics: dict = {}
        while self.step_index < self.cfg.steps:
            metrics = self.step()
            if bar is not None:
                bar.update(1)
                if "eval_accuracy" in metrics:
                    bar.set_postfix(loss=f"{metrics['task_loss']:.3f}", acc=f"{metrics['eval_accuracy']:.3f}")
        if bar is not None:
            bar.close()
        self.model.eval()
        return metrics

    @torch.no_grad()
    def restore_good(self) -> int:
        """Put the last good weights back into the model; returns their step."""
        with self.good_lock:
            torch._foreach_copy_([p.data for p in self.params], self.good_state)
            return self.good_step

    def good_state_dict(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the last good weights, as a state dict (any thread)."""
        names = [n for n, _ in self.model.named_parameters()]
        with self.good_lock:
            return {n: t.detach().to("cpu", copy=True) for n, t in zip(names, self.good_state)}


def train(model: Transformer, task: Task, cfg: TrainConfig, callbacks: Iterable[Callback] = (),
          penalty: Penalty | None = None, progress: bool = False) -> tuple[Transformer, dict]:
    trainer = Trainer(model, task, cfg, callbacks, penalty)
    start = time.perf_counter()
    last = trainer.run(progress=progress)
    last["wall_time_s"] = time.perf_counter() - start
    return trainer.model, last
