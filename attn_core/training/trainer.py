"""The bare trainer: AdamW with warmup + cosine decay, gradient clipping, periodic held-out
evaluation, metric callbacks, a NaN/Inf guard that keeps the last good weights, deterministic under
a seed, CUDA when available (overridable), fp32 or bf16 autocast.

The step loop never waits for the device between sync points: losses, terms, accuracy and the
gradient norm stay on the device and are read (one non-blocking copy) every ``sync_every`` steps,
at held-out evaluations and at the last step; the guard checks the steps read there (see
:class:`Trainer`).

It knows the model and the task only: presets, the run store and the live job build on it (see
docs/architecture.md). Its recipe, :class:`~attn_core.training.config.TrainConfig`, is
:mod:`attn_core.training.config`'s; the device, precision and sync cadence are
:mod:`attn_core.device`'s. The step loop that ends a run on divergence and records it is
:func:`attn_core.training.record.record_run`.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterable

import torch

from attn_core import device as D
from attn_core.device import batch_device, host_read, move, optimizer_options, select_device, sync_interval
from attn_core.model import Transformer
from attn_core.tasks import Batch, Task
from attn_core.training.config import TrainConfig
from attn_core.training.step import StepGraph

STEP, SYNC, RESTORE, KEEP = range(4)  # calls a multi-worker run's rank 0 announces (attn_core.distributed.parallel)

# Extra loss terms (regularizers): called with the model, the batch and the forward's cache;
# returns named scalar terms that are added to the task loss.
Penalty = Callable[[Transformer, Batch, dict], dict[str, torch.Tensor]]
Callback = Callable[[dict], None]

EVAL_SEED_OFFSET = 1_000_003  # held-out batches never share a generator stream with training
# A task that reads held-out text evaluates on held-out tokens in proportion to what the run trains
# on between two evaluations (at most ``eval_samples`` blocks): EVAL_SHARE of them, at least one
# training batch. A forward costs about a third of a training step per token, so evaluating costs
# the loop about 2% (a fixed 256 blocks cost a 100-step run on 8 x 128 tokens 10%).
EVAL_SHARE = 1 / 16
# A task loss above DIVERGENCE_FACTOR * ln(d_vocab) (a uniform guess costs ln(d_vocab)) means
# the run is confidently wrong everywhere: training has diverged even if no NaN appeared yet.
DIVERGENCE_FACTOR = 4.0


class Diverged(RuntimeError):
    """A step produced a non-finite or exploding loss or gradient; no update was applied."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"diverged at step {step}: {reason}")
        self.step, self.reason = step, reason


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


def adamw(groups: list[dict], cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with ``cfg``'s learning rate and betas: fused on CUDA (one kernel for every
    parameter, no per-tensor launches), PyTorch's default implementation elsewhere (the CPU's
    results stay what they were). Compiled (``cfg.compile``), the learning rate is a 0-dim tensor
    on the device that the schedule fills in place, so that the traced step never changes (off
    CUDA in the per-tensor form, which takes a tensor learning rate eagerly too)."""
    options = optimizer_options(device, cfg.compile)
    lr: float | torch.Tensor = cfg.lr
    if cfg.compile:
        lr = torch.tensor(cfg.lr, dtype=torch.float32, device=device)
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), **options)


def make_optimizer(model: Transformer, cfg: TrainConfig, device: torch.device | None = None) -> torch.optim.AdamW:
    """Weight decay on matrices only (not on biases, LayerNorm gains or embeddings' biases);
    frozen parameters (``requires_grad`` False, e.g. ``--train qk``) get no optimizer state."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return adamw(groups, cfg, device or next(model.parameters()).device)


def step_work(model: Transformer, task: Task, cfg: TrainConfig) -> int:
    """A training step's work as the thread count weighs it: parameters x sequences x tokens."""
    tokens = getattr(task, "block", None) or task.n_ctx
    return sum(p.numel() for p in model.parameters()) * cfg.batch_size * tokens


def eval_tokens(cfg: TrainConfig, n_ctx: int) -> int:
    """Held-out tokens of one evaluation of a run of ``cfg`` on sequences of ``n_ctx`` tokens (a
    task that reads held-out text takes them): :data:`EVAL_SHARE` of the tokens trained on between
    two evaluations (or in the whole run, when it is shorter), at least one batch."""
    interval = min(cfg.eval_every, cfg.steps)
    return cfg.batch_size * n_ctx * max(1, math.ceil(EVAL_SHARE * interval))


@torch.no_grad()
def evaluate(
    model: Transformer,
    task: Task,
    samples: int = 512,
    seed: int = 0,
    split: str = "test",
    device: torch.device | None = None,
    cache: dict | None = None,
    precision: str = "fp32",
    tokens: int | None = None,
) -> dict:
    """Accuracy and loss on ``samples`` held-out sequences drawn with their own seed; pass a
    dict as ``cache`` to keep the forward's attention (``Transformer.forward``). A task with its
    own ``evaluate`` (text, read in chunks of bounded memory) evaluates itself, in ``precision``
    and on at most ``tokens`` held-out tokens (None: ``samples`` blocks)."""
    if cache is None and getattr(task, "evaluate", None) is not None:
        return task.evaluate(model, samples, seed, split, device, precision=precision, tokens=tokens)
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

    Callbacks receive a metrics dict for every step, in step order (``step``, ``loss``,
    ``task_loss``, ``accuracy`` on the training batch, each penalty term, ``grad_norm``, ``lr``,
    and after evaluations ``eval_accuracy``/``eval_loss``), once the step's values have been read
    from the device: at the step itself with ``sync_every`` 1 (CPU's default), else at the sync
    point that ends its window (at most ``sync_every - 1`` steps later). Sync points are every
    ``sync_every``-th step, evaluation steps, the last step, the steps ``sync_at(step)`` names, and
    :meth:`sync`.

    Guard: a step whose loss or gradient is NaN/Inf, or whose task loss exceeds ``max_loss``
    (default ``DIVERGENCE_FACTOR * ln(d_vocab)``), raises :class:`Diverged` at the sync point that
    reads it, before that sync step's update: with ``sync_every`` 1 before any update of the bad
    step; otherwise the updates after the bad step are undone by :meth:`restore_good`. At each sync
    point whose steps were all good, the weights before its update (they gave a finite loss and
    gradient) are copied, on the device, into ``good_state`` (``good_step`` updates applied);
    :meth:`restore_good` puts them back."""

    def __init__(
        self,
        model: Transformer,
        task: Task,
        cfg: TrainConfig,
        callbacks: Iterable[Callback] = (),
        penalty: Penalty | None = None,
        max_loss: float | None = None,
        sync_at: Callable[[int], bool] | None = None,
        device: torch.device | str | None = None,
        dist=None,
    ):
        if model.cfg.d_vocab != task.d_vocab or model.cfg.n_ctx < task.n_ctx:
            raise ValueError(
                f"model (d_vocab={model.cfg.d_vocab}, n_ctx={model.cfg.n_ctx}) does not fit task "
                f"{task.name!r} (d_vocab={task.d_vocab}, n_ctx={task.n_ctx})"
            )
        self.cfg, self.task, self.penalty = cfg, task, penalty
        # ``device`` (library callers, and the tests that train on the meta device) overrides cfg.device
        self.device = torch.device(device) if device is not None else select_device(cfg.device)
        # the one place a training loop takes its intra-op threads (cfg.threads, else chosen from
        # the step's work and the free cores: device.choose_threads)
        self.threads = D.apply_threads(cfg.threads, step_work(model, task, cfg), self.device)
        self.model = model.to(self.device).train()
        # data-parallel (attn_core.distributed.DataParallel, one rank of a multi-worker run): the
        # model is sharded (FSDP) or wrapped for the step's forward (DDP) before the optimizer sees it
        self.dist = dist
        forward = dist.prepare(self.model) if dist is not None else self.model
        self.callbacks = list(callbacks)
        self.optimizer = make_optimizer(self.model, cfg, self.device)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, cfg))
        # training batches are drawn where the model trains on CUDA (the GPU's own stream: no
        # copy, no wait), on the CPU elsewhere (the CPU's stream, the same on every machine); a task
        # that reads its batches from host memory (text) draws on the CPU everywhere, and its
        # batches reach a GPU through pinned memory, copied without a wait (``_batch``)
        self.data = torch.Generator(device=batch_device(self.device, getattr(task, "host_batches", False)))
        self.data.manual_seed(cfg.seed)
        self.graph = StepGraph(self.model, task, penalty, self.device, cfg.precision, cfg.compile)
        if dist is not None:
            self.graph.forward, self.graph.shares = forward, dist.shares
        self.step_index = 0
        self.max_loss = DIVERGENCE_FACTOR * math.log(max(task.d_vocab, 2)) if max_loss is None else max_loss
        self.sync_every = sync_interval(cfg, self.device)
        self.sync_at = sync_at
        self.params = [p for p in self.model.parameters()]
        self.good_state = [t.clone() for t in self._tensors()]
        self.good_step = 0
        self.good_lock = threading.Lock()  # readers of good_state in other threads take it
        # steps run but not read yet: (step, lr, term names, device values [loss, task, acc, grad, *terms])
        self._pending: list[tuple[int, float, tuple, torch.Tensor]] = []
        self._pending_s = 0.0  # seconds inside step() of the pending steps
        self.seconds: dict[int, float] = {}  # seconds inside step() of the steps being delivered
        self.eval_s = 0.0  # seconds of the held-out evaluations inside step()

    def _tensors(self) -> list[torch.Tensor]:
        """The parameters' data (each rank's shard of them under FSDP), as good_state keeps them."""
        return [p.data for p in self.params] if self.dist is None else self.dist.tensors(self.params)

    def _before(self, call: int) -> None:
        """Rank 0 of a multi-worker run tells the other ranks which call comes (they replay it)."""
        if self.dist is not None:
            self.dist.before(call, self)

    # --- one step -------------------------------------------------------------------------------------
    def _batch(self) -> tuple[Batch, Batch | None]:
        """A training batch on the device and, for the exact (CPU) form of the loss, its scored
        positions as a flat index, taken on the host: ``task.loss`` of the flattened logits with
        the second batch is the task's loss, bit for bit. The static form (``graph.static``)
        needs no index: it scores with a mask (``step.masked_loss``)."""
        batch = self.task.sample(self.cfg.batch_size, self.data)
        if self.dist is not None:  # every rank draws the global batch and trains on its rows
            batch = self.dist.shard(batch)
        # host batches reach a GPU pinned, without a wait; batches drawn there stay (device.copy_plan)
        batch = Batch(*(move(t, self.device) for t in (batch.tokens, batch.targets, batch.mask)))
        if self.graph.static:
            return batch, None
        index = batch.mask.flatten().nonzero().squeeze(1)
        return batch, Batch(batch.tokens, batch.targets.flatten(), index)

    def step(self) -> dict:
        """One update. Returns this step's metrics when it is a sync point (always with
        ``sync_every`` 1), else only its ``step`` and ``lr``; every step's full metrics go to the
        callbacks (see the class)."""
        started = time.perf_counter()
        self._before(STEP)
        loss, task_loss, accuracy, terms = self.graph(*self._batch())  # forward and backward
        total = self.graph.clip(self.params, self.cfg.grad_clip)  # clip_grad_norm_'s, bit for bit
        with torch.no_grad():
            values = torch.stack(
                [loss.float(), task_loss.float(), accuracy.float(), total.float(), *(t.float() for t in terms.values())]
            ).detach()
            if self.dist is not None:  # every rank reads the mean over the ranks: one guard for all
                values = self.dist.reduce(values)
        step = self.step_index + 1
        evaluating = step % self.cfg.eval_every == 0 or step == self.cfg.steps
        sync = evaluating or step % self.sync_every == 0 or (self.sync_at is not None and self.sync_at(step))
        self._pending.append((step, math.nan, tuple(terms), values))
        rows: list[dict] = []
        if sync:
            rows = self._read()  # raises Diverged before this step's update
            with self.good_lock:  # these weights gave a finite loss and gradient
                torch._foreach_copy_(self.good_state, self._tensors())
                self.good_step = self.step_index
        self.graph.apply(self.optimizer)
        self.scheduler.step()
        lr = self.cfg.lr * lr_factor(self.step_index + 1, self.cfg)  # the schedule's, without reading a device
        self.step_index += 1
        if not sync:
            self._pending[-1] = (step, lr, *self._pending[-1][2:])
            self._pending_s += time.perf_counter() - started
            return {"step": step, "lr": lr}
        rows[-1]["lr"] = lr
        self._time(rows, time.perf_counter() - started)
        if evaluating:
            t_eval = time.perf_counter()
            ev = evaluate(
                self.model,
                self.task,
                self.cfg.eval_samples,
                self.cfg.seed,
                device=self.device,
                precision=self.cfg.precision,
                tokens=eval_tokens(self.cfg, self.task.n_ctx),
            )
            rows[-1].update(eval_accuracy=ev["accuracy"], eval_loss=ev["loss"])
            self.seconds[step] += time.perf_counter() - t_eval
            self.eval_s += time.perf_counter() - t_eval
        self._deliver(rows)
        return rows[-1]

    def sync(self) -> list[dict]:
        """Read the pending steps now (without an update): the callbacks get their metrics, which
        are returned; a bad one raises :class:`Diverged` (``good_state`` is not advanced here)."""
        if not self._pending:
            return []
        self._before(SYNC)
        rows = self._read()
        self._time(rows, 0.0)
        self._deliver(rows)
        return rows

    def _time(self, rows: list[dict], current_s: float) -> None:
        """``seconds``: the time inside step() of the steps read at this sync point (the pending
        ones and ``current_s`` of the running one), shared evenly: the device ran them as one
        queue, so only their sum is measured."""
        window_s, self._pending_s = self._pending_s + current_s, 0.0
        self.seconds = {m["step"]: window_s / len(rows) for m in rows} if rows else {}

    def _read(self) -> list[dict]:
        """The pending steps' values in one copy from the device; checks them in step order. The
        good steps before a bad one are delivered, then :class:`Diverged` is raised (``step_index``
        is left at the last good step)."""
        pending, self._pending = self._pending, []
        table = host_read(torch.stack([v for *_, v in pending]))  # one copy, one wait
        rows = []
        for (step, lr, names, _), vals in zip(pending, table):
            loss, task_loss, accuracy, grad_norm, *terms = vals
            reason = None
            if not math.isfinite(loss):
                bad = next((n for n, t in zip(names, terms) if not math.isfinite(t)), None)
                reason = f"loss is {loss}" + (f" (term {bad!r})" if bad else "")
            elif task_loss > self.max_loss:
                reason = (
                    f"task loss {task_loss:.4g} exceeds {self.max_loss:.3g} "
                    f"({DIVERGENCE_FACTOR:g} x the loss of a uniform guess)"
                )
            elif not math.isfinite(grad_norm):
                reason = f"gradient norm is {grad_norm}"
            if reason is not None:
                self.optimizer.zero_grad(set_to_none=True)
                self.step_index = step - 1
                self._time(rows, 0.0)
                self._deliver(rows)
                raise Diverged(step, reason)
            rows.append(
                {
                    "step": step,
                    "loss": loss,
                    "task_loss": task_loss,
                    "accuracy": accuracy,
                    "grad_norm": grad_norm,
                    "lr": lr,
                    **dict(zip(names, terms)),
                }
            )
        return rows

    def _deliver(self, rows: list[dict]) -> None:
        for metrics in rows:
            for cb in self.callbacks:
                cb(metrics)

    def run(self, progress: bool = False) -> dict:
        bar = None
        if progress:
            from attn_core.progress import Progress

            bar = Progress(self.cfg.steps, f"train {self.task.name}", unit="step")
            bar.set(self.step_index)
        metrics: dict = {}
        while self.step_index < self.cfg.steps:
            metrics = self.step()
            if bar is not None:
                note = None
                if "eval_accuracy" in metrics:
                    note = f"loss={metrics['task_loss']:.3f} acc={metrics['eval_accuracy']:.3f}"
                bar.set(self.step_index, note)
        if bar is not None:
            bar.close()
        self.model.eval()
        return metrics

    def view(self):
        """A context giving the model to measure: the model itself, or on rank 0 of an FSDP run a
        plain model holding the gathered weights (``DataParallel.view``)."""
        return contextlib.nullcontext(self.model) if self.dist is None else self.dist.view(self)

    @torch.no_grad()
    def restore_good(self) -> int:
        """Put the last good weights back into the model; returns their step."""
        self._before(RESTORE)
        with self.good_lock:
            torch._foreach_copy_(self._tensors(), self.good_state)
            return self.good_step

    @torch.no_grad()
    def keep_current(self) -> None:
        """Take the model's current weights as the last good ones (a caller that has checked them,
        e.g. a finite held-out loss after the last step)."""
        self._before(KEEP)
        with self.good_lock:
            torch._foreach_copy_(self.good_state, self._tensors())
            self.good_step = self.step_index

    def good_state_dict(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the last good weights, as a state dict (any thread; on rank 0 of an FSDP
        run, gathered from every rank)."""
        if self.dist is not None and self.dist.strategy == "fsdp":
            return self.dist.full_state(self)
        names = [n for n, _ in self.model.named_parameters()]
        with self.good_lock:
            return {n: t.detach().to("cpu", copy=True) for n, t in zip(names, self.good_state)}


def train(
    model: Transformer,
    task: Task,
    cfg: TrainConfig,
    callbacks: Iterable[Callback] = (),
    penalty: Penalty | None = None,
    progress: bool = False,
) -> tuple[Transformer, dict]:
    trainer = Trainer(model, task, cfg, callbacks, penalty)
    start = time.perf_counter()
    last = trainer.run(progress=progress)
    last["wall_time_s"] = time.perf_counter() - start
    return trainer.model, last
