"""The device part of one training step: forward (under the precision's autocast), task loss,
penalty terms and accuracy, then backward; then the update: the gradient norm and its clipping,
and the optimizer's step. Eager, or compiled with ``torch.compile`` (``TrainConfig.compile``,
``--compile``). The trainer (:mod:`attn_core.training.trainer`) samples the batch, reads the values
at its sync points (between the clipping and the optimizer's step, so that a bad step is never
applied) and keeps the schedule.

Two ways to score a batch, equal up to float rounding:

- exact (CPU, eager): the scored positions are a flat index taken on the host, and the loss is
  ``task.loss`` of the flattened logits, bit for bit (the CPU path and its recorded results);
- static (CUDA, meta, and every compiled step): a masked mean over all positions,
  :func:`masked_loss`. No boolean indexing, so no wait for the device (a boolean index needs the
  count of True entries on the host) and the same shapes every step, which CUDA graphs need.

Compiled, the step is three regions, each traced once (``dynamic=False``: the batch and the
context never change within a run) and never again: the forward with the loss and penalties
(its backward is compiled with it), the clipping (gradient norm and rescale, into new gradients:
a graph that mutates its inputs is not run as a CUDA graph) and the optimizer's step, whose
learning rate is a tensor the schedule fills in place (a float would be a constant of the traced
step, and every new value a recompile). Autocast is decided outside the traced
code (whether a device has autocast is not traceable: asking inside broke the graph there, and
its resumed remainder was traced again on every step) and entered with constant arguments
inside it. On CUDA each region runs as a CUDA graph (``mode="reduce-overhead"``: replayed as one
launch instead of hundreds, so the GPU does not wait on Python); an optimizer step split off from
the backward is how dynamo traces optimizers (a step after a traced backward breaks the graph).
If compiling fails (no compiler, an op dynamo cannot trace) the step falls back to eager and says
so in :attr:`StepGraph.note`; the run goes on. See docs/architecture.md, "Live retraining".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attn_core.device import autocast_args, autocast_dtype, compile_mode, static_scoring
from attn_core.model import Transformer
from attn_core.tasks import Batch, Task

# (loss, task loss, accuracy on the batch, penalty terms), all 0-dim tensors on the device
Values = tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]
BACKEND = "inductor"  # torch.compile's backend (the tests count recompiles with a lighter one)


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the positions where ``mask`` is True (logits [N, V], targets and
    mask [N]): ``Task.loss`` up to float rounding, without boolean indexing (no host sync, static
    shapes). A batch with nothing scored gives 0."""
    per_token = F.cross_entropy(logits, targets, reduction="none")
    dtype = torch.promote_types(per_token.dtype, torch.float32)  # a bf16 count is exact only up to 256
    weight = mask.to(dtype)
    return (per_token.to(dtype) * weight).sum() / weight.sum().clamp_min(1)


def masked_accuracy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Fraction of the positions where ``mask`` is True whose argmax is the target (float32)."""
    right = (logits.argmax(-1) == targets) & mask
    return right.sum().float() / mask.sum().clamp_min(1).float()


def clip_coefficient(total: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The factor ``clip_grad_norm_`` rescales gradients of total norm ``total`` by (at most 1)."""
    return (max_norm / (total + 1e-6)).clamp(max=1.0)


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The total 2-norm of the gradients of ``params`` (a 0-dim tensor on their device), and the
    gradients rescaled in place as ``clip_grad_norm_`` does, bit for bit (a factor clamped to 1
    leaves them as they are); no host read. The eager step's form."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    torch._foreach_mul_(grads, clip_coefficient(total, max_norm))
    return total


def clipped_gradients(grads: list[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """:func:`clip_gradients` without touching its inputs: the total norm and new, rescaled
    gradients (the same products). The compiled step's form: a traced function that mutates its
    inputs (the gradients, made afresh by every backward) is not run as a CUDA graph (torch says
    ``skipping cudagraphs due to mutated inputs``); the new gradients are outputs of
    the graph, which the optimizer's graph then reads."""
    total = torch.nn.utils.get_total_norm(grads)
    return total, torch._foreach_mul(grads, clip_coefficient(total, max_norm))


class StepGraph:
    """Forward, losses and backward of one step of ``model`` on ``task`` (with ``penalty``, a
    Trainer ``Penalty``, or None), in ``precision``, and the update (:meth:`clip`,
    :meth:`apply`); ``compile`` runs the static form and the update through ``torch.compile``
    (:func:`compile_mode`). ``static`` is True when batches are scored by :func:`masked_loss`
    (always when compiled, on any device but the CPU)."""

    def __init__(
        self,
        model: Transformer,
        task: Task,
        penalty: Callable | None,
        device: torch.device,
        precision: str,
        compile: bool = False,
    ):
        self.model, self.task, self.penalty, self.device = model, task, penalty, device
        # one rank of a multi-worker run (attn_core.distributed): the forward runs through the DDP
        # wrapper, and shares(mask) weights the shard's task loss and terms so that the ranks' sum
        # is the whole batch's loss
        self.forward, self.shares = model, None
        self.autocast = autocast_dtype(precision)
        self._amp = autocast_args(device, self.autocast)  # decided here: not traceable inside the step
        self.static = static_scoring(device, compile)
        self.mode = compile_mode(device) if compile else None
        self.note = ""  # why a compiled step fell back to eager
        self._compiled = self._compile(self._static_values) if compile else None
        self._clip = self._compile(clipped_gradients, fullgraph=True) if compile else None
        self._steps: dict[int, Callable] = {}  # the compiled step of each optimizer (by id)
        # seconds of the first call of each compiled region (tracing and compiling, and one run):
        # what compiling cost, reported apart from steps/s
        self.compile_s = 0.0
        self._first: set[str] = set()

    def _timed(self, region: str, fn: Callable, *args):
        """``fn(*args)``; its seconds are added to :attr:`compile_s` on the region's first call."""
        if region in self._first:
            return fn(*args)
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._first.add(region)
            self.compile_s += time.perf_counter() - started

    def _compile(self, fn: Callable, fullgraph: bool = False) -> Callable:
        return torch.compile(fn, mode=self.mode, dynamic=False, fullgraph=fullgraph, backend=BACKEND)

    @property
    def compiled(self) -> bool:
        """Whether steps run compiled (False once compiling failed)."""
        return self._compiled is not None

    def _amp_context(self) -> contextlib.AbstractContextManager:
        if self._amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self._amp[0], dtype=self._amp[1])

    def _static_values(self, tokens: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> Values:
        cache: dict | None = self._cache()
        with self._amp_context():
            logits = self.forward(tokens, cache=cache).flatten(0, 1)
            flat_targets, flat_mask = targets.flatten(), mask.flatten()
            task_loss = masked_loss(logits, flat_targets, flat_mask)
        accuracy = masked_accuracy(logits.detach(), flat_targets, flat_mask)
        return self._with_terms(task_loss, accuracy, Batch(tokens, targets, mask), cache)

    def _exact_values(self, batch: Batch, scored: Batch) -> Values:
        cache: dict | None = self._cache()
        with self._amp_context():
            logits = self.forward(batch.tokens, cache=cache).flatten(0, 1)
            task_loss = self.task.loss(logits, scored)
        with torch.no_grad():
            right = logits.argmax(-1)[scored.mask] == scored.targets[scored.mask]
            accuracy = right.float().mean()
        return self._with_terms(task_loss, accuracy, batch, cache)

    def _cache(self) -> dict | None:
        """The dict the forward fills for the penalty: a penalty's own ``cache()`` keeps only the
        activations it reads (a ConcentrationPenalty keeps its Q and K), so other layers stay fused."""
        if self.penalty is None:
            return None
        return getattr(self.penalty, "cache", dict)()

    def _with_terms(self, task_loss: torch.Tensor, accuracy: torch.Tensor, batch: Batch, cache) -> Values:
        # penalties in fp32 (QR/SVD of B have no bf16 kernels; the cached patterns are fp32 already)
        terms = self.penalty(self.model, batch, cache) if self.penalty is not None else {}
        if self.shares is not None:
            task_share, term_share = self.shares(batch.mask)
            task_loss, accuracy = task_loss * task_share, accuracy * task_share
            terms = {name: term * term_share for name, term in terms.items()}
        loss = task_loss + sum(terms.values()) if terms else task_loss
        return loss, task_loss, accuracy, terms

    def _fall_back(self, e: Exception) -> None:
        """Compiling failed: every part of the step runs eagerly from now on (same maths)."""
        self._compiled = self._clip = None
        self._steps.clear()
        self.note = (
            f"torch.compile failed ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]}); the step runs eagerly"
        )

    def __call__(self, batch: Batch, scored: Batch | None = None) -> Values:
        """Forward and backward of one batch (``scored``: the flat index of the exact form; unused
        when static); the gradients are in the parameters' ``.grad`` (set to None before)."""
        for p in self.model.parameters():
            p.grad = None
        if self._compiled is not None:
            try:
                if self.mode == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are read
                return self._timed("forward", self._forward_backward, batch)
            except Exception as e:  # compiling failed: train eagerly (same maths, static form)
                self._fall_back(e)
                for p in self.model.parameters():
                    p.grad = None
        values = self._static_values(batch.tokens, batch.targets, batch.mask) if self.static else None
        if values is None:
            values = self._exact_values(batch, scored)
        values[0].backward()
        return values

    def _forward_backward(self, batch: Batch) -> Values:
        values = self._compiled(batch.tokens, batch.targets, batch.mask)
        values[0].backward()
        return values

    def clip(self, params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
        """:func:`clip_gradients` of ``params``; compiled, :func:`clipped_gradients` (the same
        products), whose new gradients replace the parameters' own."""
        if self._clip is not None:
            with_grad = [p for p in params if p.grad is not None]
            try:
                total, grads = self._timed("clip", self._clip, [p.grad for p in with_grad], max_norm)
            except Exception as e:  # compiled as one graph: nothing ran when it fails
                self._fall_back(e)
            else:
                for p, g in zip(with_grad, grads):
                    p.grad = g
                return total
        return clip_gradients(params, max_norm)

    def apply(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's step (compiled with the step: its learning rate must then be a tensor,
        :func:`attn_core.training.trainer.adamw`)."""
        if self._compiled is not None:
            step = self._steps.get(id(optimizer))
            if step is None:
                step = self._steps[id(optimizer)] = self._compile(optimizer.step)
            try:
                self._timed("update", step)
                return
            except Exception as e:  # the update's body is compiled before it runs
                self._fall_back(e)
        optimizer.step()
