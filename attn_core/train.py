"""Training: AdamW with warmup + cosine decay, gradient clipping, periodic held-out evaluation,
metric callbacks, a NaN/Inf guard that keeps the last good weights, deterministic under a seed,
CUDA when available (overridable) -- and the live retraining job of issue 4
(:class:`TrainingJob`), which trains in a worker thread and publishes :class:`Snapshot` s."""
from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Callable, Iterable, Optional

import torch

from attn_core.card import Card
from attn_core.model import Transformer
from attn_core.tasks import Batch, Task
from attn_core.hooks import act_name

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
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"invalid training setting: {msg}")

        check(isinstance(self.steps, int) and self.steps > 0, f"steps must be a positive integer, got {self.steps!r}")
        check(isinstance(self.batch_size, int) and 1 <= self.batch_size <= 65536,
              f"batch_size must be 1..65536, got {self.batch_size!r}")
        check(math.isfinite(self.lr) and 0 < self.lr <= 10, f"lr must be in (0, 10], got {self.lr!r}")
        check(math.isfinite(self.weight_decay) and self.weight_decay >= 0, "weight_decay must be >= 0")
        check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "betas must be in [0, 1)")
        check(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0, "warmup_steps must be >= 0")
        check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio must be in [0, 1]")
        check(self.grad_clip > 0, "grad_clip must be positive")
        check(isinstance(self.eval_every, int) and self.eval_every > 0, "eval_every must be a positive integer")
        check(isinstance(self.eval_samples, int) and self.eval_samples > 0, "eval_samples must be positive")
        select_device(self.device)  # raises on an unknown or unavailable device

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "TrainConfig":
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
             split: str = "test", device: Optional[torch.device] = None, cache: Optional[dict] = None) -> dict:
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
                 callbacks: Iterable[Callback] = (), penalty: Optional[Penalty] = None,
                 max_loss: Optional[float] = None):
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
        cache: Optional[dict] = {} if self.penalty is not None else None
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
          penalty: Optional[Penalty] = None, progress: bool = False) -> tuple[Transformer, dict]:
    trainer = Trainer(model, task, cfg, callbacks, penalty)
    start = time.perf_counter()
    last = trainer.run(progress=progress)
    last["wall_time_s"] = time.perf_counter() - start
    return trainer.model, last


# --- the live retraining job (issue 4) ------------------------------------------------------------
#
# Metric names, shared by Snapshot.metrics() and RunStore.metrics() (columns step, name, value):
#   every step        loss, task_loss, accuracy (training batch), grad_norm, lr, term:<label>
#                     (lambda * R of each regularizer, see regularizers.RegSpec.label)
#   every eval_every  eval_accuracy, eval_loss (held-out samples)
#   every telemetry_every (on a fixed held-out probe batch and on the vocabulary view)
#                     entropy_data:L<l>H<h>, top1_data:L<l>H<h>, entropy_vocab:L<l>H<h> per head,
#                     entropy_data, entropy_vocab, top1_data: means over the regularized heads
#   every spectrum_every
#                     sigma:L<l>H<h>:<i> (singular values of B), stable_rank:L<l>H<h>
# Telemetry and spectra are also taken at step 0 (before the first update).

JOB_STATUSES = ("pending", "running", "paused", "completed", "stopped", "diverged", "failed")
FINAL_STATUSES = ("completed", "stopped", "diverged", "failed")
SCRATCH_PREFIX = "scratch:"  # source "scratch:<preset>" trains the preset's model from its init
MEASURE_KEYS = ("accuracy", "loss", "entropy_data", "entropy_vocab", "top1_mass", "stable_rank")
FLUSH_EVERY_S = 2.0  # metrics reach the run store at least this often


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
    ``warmup_steps`` to min(100, steps // 10)."""

    source: str
    regularizers: object = field(default_factory=dict)
    heads: Optional[str] = None
    entmax_alpha: Optional[float] = None
    steps: int = 300
    lr: float = 1e-3
    seed: int = 0
    device: str = "auto"
    batch_size: Optional[int] = None
    weight_decay: Optional[float] = None
    warmup_steps: Optional[int] = None
    eval_every: int = 100
    eval_samples: int = 256
    telemetry_every: int = 20
    spectrum_every: int = 50
    probe_samples: int = 16
    measure_samples: int = 512
    max_loss: Optional[float] = None

    def __post_init__(self) -> None:
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"invalid retraining setting: {msg}")

        check(isinstance(self.source, str) and self.source.strip() != "", "source must name a model, run:<id> "
              "or scratch:<preset>")
        check(isinstance(self.steps, int) and not isinstance(self.steps, bool) and self.steps > 0,
              f"steps must be a positive integer, got {self.steps!r}")
        for name in ("eval_every", "eval_samples", "telemetry_every", "spectrum_every", "probe_samples",
                     "measure_samples"):
            v = getattr(self, name)
            check(isinstance(v, int) and v > 0, f"{name} must be a positive integer, got {v!r}")
        if self.entmax_alpha is not None:
            check(isinstance(self.entmax_alpha, (int, float)) and 1.0 <= self.entmax_alpha <= 2.0,
                  f"entmax_alpha must be in [1, 2] (1 softmax, 1.5 entmax15, 2 sparsemax), got {self.entmax_alpha!r}")
        check(self.max_loss is None or (isinstance(self.max_loss, (int, float)) and self.max_loss > 0),
              "max_loss must be positive")
        from attn_core.regularizers import parse_specs

        parse_specs(self.regularizers)  # names, lambdas and k are checked here; heads once the model is known
        self.train_config({})  # lr, batch size, device ...

    def train_config(self, parent_train: dict) -> TrainConfig:
        """The TrainConfig of this run, taking what is unset from the parent's recipe."""
        return TrainConfig(
            steps=self.steps, lr=float(self.lr), seed=int(self.seed), device=self.device,
            batch_size=self.batch_size or int(parent_train.get("batch_size", 64)),
            weight_decay=float(self.weight_decay if self.weight_decay is not None else parent_train.get("weight_decay", 0.1)),
            warmup_steps=self.warmup_steps if self.warmup_steps is not None else min(100, self.steps // 10),
            eval_every=self.eval_every, eval_samples=self.eval_samples)

    def to_dict(self) -> dict:
        from attn_core.regularizers import parse_specs

        out = asdict(self)
        out["regularizers"] = [str(s) for s in parse_specs(self.regularizers)]
        return out

    def command(self) -> str:
        """The ``attn-lab retrain`` command that makes this run."""
        import shlex

        parts = ["attn-lab", "retrain", shlex.quote(self.source)]
        for spec in self.to_dict()["regularizers"]:
            parts += ["--reg", shlex.quote(spec)]
        if self.heads:
            parts += ["--heads", shlex.quote(self.heads)]
        parts += ["--steps", str(self.steps), "--seed", str(self.seed), "--lr", f"{self.lr:g}"]
        if self.entmax_alpha is not None:
            parts += ["--entmax-alpha", f"{self.entmax_alpha:g}"]
        if self.batch_size:
            parts += ["--batch-size", str(self.batch_size)]
        if self.device != "auto":
            parts += ["--device", self.device]
        return " ".join(parts)


def _mean(values: list[float]) -> float:
    good = [v for v in values if math.isfinite(v)]
    return sum(good) / len(good) if good else math.nan


@torch.no_grad()
def measure(model: Transformer, task: Task, heads=None, samples: int = 512, seed: int = 0) -> dict:
    """Accuracy and loss on held-out samples, and concentration means over ``heads`` (a
    selection, see ``regularizers.parse_heads``; None = every head): ``entropy_data`` (normalized
    entropy of attention rows on those samples), ``entropy_vocab`` (same on the vocabulary view),
    ``top1_mass`` (mean largest attention weight on data), ``stable_rank`` of B; ``per_head``
    holds each head's values and singular values."""
    from attn_core import regularizers as R

    heads = R.parse_heads(heads, model.cfg)
    cache: dict = {}
    ev = evaluate(model, task, samples, seed, cache=cache)
    data = R.data_concentration(model, cache, heads)
    vocab = R.vocab_concentration(model, heads)
    spec = R.spectrum(model)
    per_head = [{"head": R.head_label(l, h), "layer": l, "index": h,
                 "entropy_data": float(data["entropy"][l, h]), "top1_data": float(data["top1"][l, h]),
                 "entropy_vocab": float(vocab["entropy"][l, h]), "top1_vocab": float(vocab["top1"][l, h]),
                 "stable_rank": float(spec["stable_rank"][l, h]),
                 "singular_values": spec["singular_values"][l, h].tolist()} for l, h in heads]
    return {"accuracy": ev["accuracy"], "loss": ev["loss"],
            "entropy_data": _mean([r["entropy_data"] for r in per_head]),
            "entropy_vocab": _mean([r["entropy_vocab"] for r in per_head]),
            "top1_mass": _mean([r["top1_data"] for r in per_head]),
            "stable_rank": _mean([r["stable_rank"] for r in per_head]),
            "samples": samples, "per_head": per_head}


@dataclass(frozen=True)
class Snapshot:
    """What a training job has published, as of one moment; cheap to take (no copying: the
    metric log is append-only and the snapshot remembers its length).

    ``status`` is one of JOB_STATUSES, ``message`` says why a run ended (or is paused);
    ``latest`` has the newest value of every metric; ``probe_pattern`` is the attention
    [n_layers, n_heads, T, T] of every head on one fixed held-out input (``probe_tokens``) with
    the weights of step ``probe_step``; ``before``/``after`` come from :func:`measure`."""

    status: str
    message: str
    step: int
    steps: int
    run_id: Optional[str]
    elapsed_s: float
    train_s: float  # seconds inside the training loop (steps, telemetry), without setup/measure/save
    step_s: float  # of which inside Trainer.step (the rest is the job's telemetry and publishing)
    latest: dict
    regularized_heads: tuple
    n_layers: int
    n_heads: int
    before: Optional[dict]
    after: Optional[dict]
    probe_tokens: tuple
    probe_pattern: Optional[object]  # numpy array, never written after publication
    probe_step: int
    _log: tuple = field(repr=False, default=((), (), ()))
    _n: int = 0

    @property
    def done(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def progress(self) -> float:
        return self.step / self.steps if self.steps else 0.0

    @property
    def steps_per_s(self) -> float:
        return self.step / self.train_s if self.train_s > 0 else 0.0

    def metrics(self, names: Optional[Iterable[str]] = None, prefix: Optional[str] = None):
        """The metric log up to this snapshot as a DataFrame (step, name, value), the same
        format as ``RunStore.metrics``; optionally only some ``names`` or a name ``prefix``."""
        import pandas as pd

        steps, names_, values = (col[:self._n] for col in self._log)
        df = pd.DataFrame({"step": steps, "name": names_, "value": values})
        if names is not None:
            df = df[df["name"].isin(list(names))]
        if prefix is not None:
            df = df[df["name"].str.startswith(prefix)]
        return df.reset_index(drop=True)


class TrainingJob:
    """A retraining run in a worker thread that never touches Streamlit.

    Build it (every setting is checked here, so a bad one fails before anything starts), then
    ``start()`` it and poll ``snapshot()``; ``pause()``, ``resume()`` and ``stop()`` act between
    steps. ``run()`` does the same work in the calling thread. When the run ends it is saved in the
    run store (unless ``store=False``): completed, stopped (at the user's request), diverged
    (NaN/Inf or exploding loss; the last good weights are kept) or failed (an error).
    Two jobs never share state: each loads its own copy of the parent."""

    def __init__(self, cfg: JobConfig, store=None):
        from attn_core import regularizers as R
        from attn_core import zoo
        from attn_core.runs import RunStore, is_run_ref

        self.cfg = cfg
        self.store = None if store is False else (store if store is not None else RunStore())
        parent_card = Card()
        if cfg.source.startswith(SCRATCH_PREFIX):
            from attn_core.presets import get_preset
            from attn_core.tasks import get_task

            preset = get_preset(cfg.source[len(SCRATCH_PREFIX):])
            model, task = init_model(preset.model_config(), cfg.seed), get_task(preset.task)
            parent_train = preset.train.to_dict()
        else:
            if is_run_ref(cfg.source):
                loaded = (self.store or RunStore()).load_model(cfg.source)
            else:
                loaded = zoo.load(cfg.source)
            if loaded.task is None:
                raise ValueError(f"model {loaded.name!r} has no known task in its card, so it cannot be retrained")
            model, task, parent_card = loaded.model, loaded.task, loaded.card
            parent_train = parent_card.train
        self.parent = cfg.source
        self.task = task
        model = R.with_entmax(model, cfg.entmax_alpha)
        self.penalty = R.build_penalty(cfg.regularizers, model, cfg.heads)
        self.train_cfg = cfg.train_config(parent_train)
        self.trainer = Trainer(model, task, self.train_cfg, penalty=self.penalty or None, max_loss=cfg.max_loss)
        self.model = self.trainer.model
        self.device = self.trainer.device
        self.parent_card = parent_card
        self.probe = task.sample(cfg.probe_samples, cfg.seed + 2 * EVAL_SEED_OFFSET, split="test").to(self.device)
        self.run_id: Optional[str] = None

        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._go = threading.Event()
        self._go.set()
        self._thread: Optional[threading.Thread] = None
        self._log: tuple[list, list, list] = ([], [], [])
        self._flushed = 0
        self._state = dict(status="pending", message="", step=0, latest={}, before=None, after=None,
                           probe_pattern=None, probe_step=0, elapsed_s=0.0, train_s=0.0, step_s=0.0)
        self._t0: Optional[float] = None
        self._last_flush = 0.0
        self._probe_tokens = tuple(task.names(self.probe.tokens[0].tolist()))
        self._snap: Optional[Snapshot] = None
        self._publish()

    # --- control (any thread) -------------------------------------------------------------------
    def start(self) -> "TrainingJob":
        if self._thread is not None or self._state["status"] != "pending":
            raise RuntimeError("this job has already been started; build a new one to train again")
        self._thread = threading.Thread(target=self._run_safely, name=f"attn-lab job {self.parent}", daemon=True)
        self._thread.start()
        return self

    def run(self) -> dict:
        """Train in this thread until the run ends; returns :meth:`result`."""
        if self._state["status"] != "pending":
            raise RuntimeError("this job has already been started; build a new one to train again")
        self._run_safely()
        return self.result()

    def stop(self) -> None:
        self._stop.set()
        self._go.set()

    def pause(self) -> None:
        self._go.clear()

    def resume(self) -> None:
        self._go.set()

    def join(self, timeout: Optional[float] = None) -> bool:
        """Wait for the worker; True when the run has ended."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.snapshot().done

    @property
    def status(self) -> str:
        return self.snapshot().status

    def snapshot(self) -> Snapshot:
        """The latest published state (a reference swap under a lock: microseconds)."""
        with self._lock:
            return self._snap

    def weights(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the last good weights (a state dict)."""
        return self.trainer.good_state_dict()

    def model_copy(self) -> Transformer:
        """A CPU model with the last good weights, for the page to draw from."""
        m = Transformer(self.model.cfg)
        m.load_state_dict(self.weights())
        return m.eval()

    def result(self) -> dict:
        s = self.snapshot()
        return {"run_id": s.run_id, "status": s.status, "message": s.message, "steps": s.step,
                "before": s.before, "after": s.after, "steps_per_s": s.steps_per_s}

    # --- the worker ---------------------------------------------------------------------------------
    def _publish(self, **changes) -> None:
        st = self._state
        st.update(changes)
        if self._t0 is not None:
            st["elapsed_s"] = time.perf_counter() - self._t0
        snap = Snapshot(
            status=st["status"], message=st["message"], step=st["step"], steps=self.cfg.steps, run_id=self.run_id,
            elapsed_s=st["elapsed_s"], train_s=st["train_s"], step_s=st["step_s"], latest=dict(st["latest"]),
            regularized_heads=tuple(self._head_names()), n_layers=self.model.cfg.n_layers,
            n_heads=self.model.cfg.n_heads, before=st["before"], after=st["after"],
            probe_tokens=self._probe_tokens, probe_pattern=st["probe_pattern"],
            probe_step=st["probe_step"], _log=self._log, _n=len(self._log[0]))
        with self._lock:
            self._snap = snap

    def _head_names(self) -> list[str]:
        from attn_core.regularizers import head_label

        return [head_label(l, h) for l, h in self.penalty.regularized_heads]

    def _record(self, step: int, values: dict) -> None:
        steps, names, vals = self._log
        for name, v in values.items():
            steps.append(step)
            names.append(name)
            vals.append(float(v))
        self._state["latest"].update(values)

    def _telemetry(self, step: int) -> None:
        from attn_core import regularizers as R

        model = self.model
        with torch.no_grad():
            cache: dict = {}
            model(self.probe.tokens, cache=cache)
            data = R.data_concentration(model, cache)
            vocab = R.vocab_concentration(model)
            pattern = torch.stack([cache[act_name("pattern", l)][0] for l in range(model.cfg.n_layers)])
        H_data, top1, H_vocab = data["entropy"].tolist(), data["top1"].tolist(), vocab["entropy"].tolist()
        row: dict = {}
        for l in range(model.cfg.n_layers):
            for h in range(model.cfg.n_heads):
                lab = R.head_label(l, h)
                row[f"entropy_data:{lab}"] = H_data[l][h]
                row[f"top1_data:{lab}"] = top1[l][h]
                row[f"entropy_vocab:{lab}"] = H_vocab[l][h]
        sel = self.penalty.regularized_heads
        row["entropy_data"] = _mean([H_data[l][h] for l, h in sel])
        row["entropy_vocab"] = _mean([H_vocab[l][h] for l, h in sel])
        row["top1_data"] = _mean([top1[l][h] for l, h in sel])
        self._record(step, row)
        self._state.update(probe_pattern=pattern.float().cpu().numpy(), probe_step=step)

    def _spectra(self, step: int) -> None:
        from attn_core import regularizers as R

        spec = R.spectrum(self.model)
        sigma, stable = spec["singular_values"].tolist(), spec["stable_rank"].tolist()
        row = {}
        for l in range(self.model.cfg.n_layers):
            for h in range(self.model.cfg.n_heads):
                lab = R.head_label(l, h)
                for i, s in enumerate(sigma[l][h]):
                    row[f"sigma:{lab}:{i}"] = s
                row[f"stable_rank:{lab}"] = stable[l][h]
        self._record(step, row)

    def _flush(self, force: bool = False) -> None:
        if self.store is None or self.run_id is None:
            return
        now = time.perf_counter()
        if not force and now - self._last_flush < FLUSH_EVERY_S:
            return
        self._last_flush = now
        steps, names, vals = self._log
        n = len(steps)
        if n > self._flushed:
            self.store.log_metrics(self.run_id, zip(steps[self._flushed:n], names[self._flushed:n], vals[self._flushed:n]))
            self._flushed = n

    def _measure(self) -> dict:
        return measure(self.model, self.task, self.penalty.regularized_heads, self.cfg.measure_samples, self.cfg.seed)

    def _run_safely(self) -> None:
        self._t0 = time.perf_counter()
        status, message = "failed", ""
        try:
            if self.store is not None:
                self.run_id = self.store.create(self.parent, self.task.name, self.cfg.to_dict())
            self._publish(status="running", before=self._measure())
            status, message = self._loop()
        except Exception as e:  # an error inside training: the run fails with its reason
            status, message = "failed", f"failed at step {self.trainer.step_index + 1}: {type(e).__name__}: {e}"
        self._finish(status, message)

    def _loop(self) -> tuple[str, str]:
        cfg, trainer = self.cfg, self.trainer
        t_loop = time.perf_counter()
        self._telemetry(0)
        self._spectra(0)
        self._publish(train_s=time.perf_counter() - t_loop)
        while trainer.step_index < cfg.steps:
            if not self._go.is_set():
                self._publish(status="paused", message=f"paused at step {trainer.step_index}",
                              train_s=self._state["train_s"])
                paused_at = time.perf_counter()
                self._go.wait()
                t_loop += time.perf_counter() - paused_at  # pauses do not count as training time
                self._publish(status="running", message="")
            if self._stop.is_set():
                return "stopped", f"stopped at step {trainer.step_index} of {cfg.steps}"
            t_step = time.perf_counter()
            try:
                m = trainer.step()
            except Diverged as d:
                kept = trainer.restore_good()
                return "diverged", f"{d}; kept weights of step {kept}"
            self._state["step_s"] += time.perf_counter() - t_step
            step = m.pop("step")
            m = {(f"term:{k}" if k in self.penalty.heads else k): v for k, v in m.items()}
            self._record(step, m)
            if step % cfg.telemetry_every == 0 or step == cfg.steps:
                self._telemetry(step)
            if step % cfg.spectrum_every == 0 or step == cfg.steps:
                self._spectra(step)
            self._publish(step=step, train_s=time.perf_counter() - t_loop)
            self._flush()
        return "completed", f"completed {cfg.steps} steps"

    def _finish(self, status: str, message: str) -> None:
        after = None
        try:
            after = self._measure()
            if status == "completed" and not math.isfinite(after["loss"]):
                kept = self.trainer.restore_good()
                status, message = "diverged", f"diverged after the last step: held-out loss is NaN; kept weights of step {kept}"
                after = self._measure()
        except Exception as e:
            message = message or f"could not measure the final weights: {e}"
        if self.store is not None and self.run_id is not None:
            # the final status is published only once the run is in the store
            self._publish(after=after, message=f"{message}; saving the run")
            try:
                self._flush(force=True)
                summary = {"before": _public(self._state["before"]), "after": _public(after)}
                self.store.finish(self.run_id, status, self.model_copy(), self._card(status, message, after),
                                  message=message, summary=summary)
            except Exception as e:  # the store itself failed (disk full, permissions): say so
                status, message = "failed", f"{message}; saving the run failed: {type(e).__name__}: {e}"
        self._publish(status=status, message=message, after=after)

    def _card(self, status: str, message: str, after: Optional[dict]) -> dict:
        import platform

        return {
            "name": f"run:{self.run_id}", "task": self.task.name, "parent": self.parent,
            "description": f"{self.parent} retrained: " + (", ".join(self.cfg.to_dict()["regularizers"]) or "no regularizer")
                           + (f", entmax alpha {self.cfg.entmax_alpha:g}" if self.cfg.entmax_alpha is not None else ""),
            "regularizers": self.penalty.describe(), "regularized_heads": self._head_names(),
            "entmax_alpha": self.model.cfg.entmax_alpha,
            "metrics": {**_public(after or {}), "eval_samples": self.cfg.measure_samples, "split": "test"},
            "before": _public(self._state["before"] or {}), "after": _public(after or {}),
            "per_head": {"before": (self._state["before"] or {}).get("per_head"), "after": (after or {}).get("per_head")},
            "seed": self.cfg.seed, "steps": self._state["step"], "job": self.cfg.to_dict(),
            "train": self.train_cfg.to_dict(), "status": status, "message": message,
            "wall_time_s": round(self._state["elapsed_s"], 2), "device": str(self.device),
            "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
            "params": self.model.n_params(), "command": self.cfg.command(),
            "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        }


def _public(m: Optional[dict]) -> Optional[dict]:
    """The before/after keys of a measurement (no per-head detail)."""
    return None if m is None else {k: m[k] for k in MEASURE_KEYS if k in m}
