"""One rank of a data-parallel retrain: what a :class:`~attn_core.training.trainer.Trainer` asks of
its ``dist`` (a :class:`DataParallel`), on top of a ``torch.distributed`` process group that Ray
Train set up (gloo on CPU workers, NCCL on GPU workers).

**The same run as one process.** Every rank draws the same global batch (the trainer's generator,
same seed) and trains on its rows (:meth:`DataParallel.shard`, contiguous slices that differ by at
most one row). So that the sum over ranks is the one-process loss, each rank weights its shard's
mean task loss (and accuracy) by its share of the batch's scored positions and its penalty terms
by its share of the rows, times the world size (:meth:`DataParallel.shares`: the gradients are
then averaged, by DDP's all-reduce or FSDP's reduce-scatter). The logged values are averaged over
the ranks every step (:meth:`DataParallel.reduce`), so every rank reads the same loss and the NaN
guard stops every rank at the same step.

**Strategies** (:meth:`DataParallel.prepare`): ``ddp`` wraps the model in
``DistributedDataParallel`` for the step's forward only (the trainer's model stays the plain
module that measurements read); ``fsdp`` shards each block and the rest of the model in place
(``fully_shard``): the penalties it trains read the forward's cache, never the sharded weights
(``scaling.check_specs``).

**Rank 0 leads.** Only rank 0 runs the job (telemetry, measurements, the run store): before each
trainer call that holds a collective or changes the weights it broadcasts the call on a gloo
control group (:meth:`DataParallel.before`), and the other ranks replay it (:meth:`follow`). Under
FSDP a measurement, a checkpoint or the save gathers the full weights onto rank 0 (:meth:`view`,
:meth:`full_state`): the other ranks contribute their shards and keep nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from attn_core.tasks import Batch
from attn_core.training.trainer import KEEP, RESTORE, STEP, SYNC, Diverged

# the calls rank 0 broadcasts (code, argument) and the others replay: the trainer's, then these
GATHER_WEIGHTS, GATHER_GOOD, PING, END = range(KEEP + 1, KEEP + 5)
CALLS = {SYNC: "sync", RESTORE: "restore_good", KEEP: "keep_current"}


def bounds(rows: int, world: int, rank: int) -> tuple[int, int]:
    """The rows [lo, hi) of ``rank`` in a batch of ``rows`` split into ``world`` contiguous parts
    whose sizes differ by at most one."""
    base, extra = divmod(rows, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a view of its storage), any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


class DataParallel:
    """Rank ``rank`` of ``world`` training with ``strategy`` on ``device``."""

    def __init__(self, rank: int, world: int, strategy: str, device: torch.device):
        self.rank, self.world, self.strategy = rank, world, strategy
        self.device = torch.device(device)
        self.leader = rank == 0
        self.control = dist.new_group(backend="gloo")  # calls travel on the host, never wait for a GPU
        self._lock = threading.Lock()  # a broadcast is one message (the keep-alive thread sends too)
        self._scored: torch.Tensor | None = None  # scored positions of the whole batch
        self._rows = 0
        self._view = None  # rank 0's plain model of gathered FSDP weights
        self.last_sent = time.monotonic()  # when rank 0 last broadcast a call

    def describe(self) -> dict:
        """How the run was trained (the card's ``distributed``)."""
        return {
            "workers": self.world,
            "strategy": self.strategy,
            "backend": dist.get_backend(),
            "device": self.device.type,
            "framework": "Ray Train (TorchTrainer)",
        }

    # --- the step ------------------------------------------------------------------------------
    def shard(self, batch: Batch) -> Batch:
        """This rank's rows of the global ``batch`` (remembering what the whole batch scores)."""
        rows = batch.tokens.shape[0]
        if rows < self.world:
            raise ValueError(f"a batch of {rows} sequences cannot be split over {self.world} workers")
        lo, hi = bounds(rows, self.world, self.rank)
        self._scored, self._rows = batch.mask.sum(), rows
        return Batch(batch.tokens[lo:hi], batch.targets[lo:hi], batch.mask[lo:hi])

    def shares(self, mask: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The weights of this shard's mean task loss (its scored positions over the batch's, times
        the world size) and of its penalty terms (its rows over the batch's, times the world size)."""
        scored = self._scored.to(mask.device).clamp_min(1)
        return mask.sum() * self.world / scored, mask.shape[0] * self.world / self._rows

    def reduce(self, values: torch.Tensor) -> torch.Tensor:
        """The mean over the ranks of a step's values (every rank gets the same)."""
        values = _local(values).clone()  # under FSDP the gradient norm made the stack a (replicated) DTensor
        dist.all_reduce(values)  # SUM: gloo has no AVG
        return values / self.world

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Make ``model`` (on this rank's device) data-parallel; returns what the step's forward
        calls (the DDP wrapper, or the model sharded in place)."""
        if self.strategy == "fsdp":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(self.device.type, (self.world,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            # the root too: FSDP2 keeps the root's weights gathered after a forward by default (for
            # the backward that usually follows); after the held-out evaluation's forward, which
            # has none, the next step's gradients of those weights were not averaged over the
            # ranks (the weights drifted 1e-3 from the one-process run's within 20 steps)
            fully_shard(model, mesh=mesh, reshard_after_forward=True)
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index or 0] if self.device.type == "cuda" else None
        # the buffers (score scales, rotary frequencies) are constants: synced once, at the start
        return DistributedDataParallel(model, device_ids=ids, forward_sync_buffers=False)

    def tensors(self, params) -> list[torch.Tensor]:
        """The parameters' data as plain tensors (each rank's shard under FSDP), for the trainer's
        copies of its last good weights."""
        return [_local(p.data) for p in params]

    # --- rank 0 leads, the others follow -----------------------------------------------------------
    def _send(self, code: int, arg: int = 0) -> None:
        message = torch.tensor([code, arg], dtype=torch.int64, device="cpu")  # the gloo control group: host
        with self._lock:
            dist.broadcast(message, src=0, group=self.control)
            self.last_sent = time.monotonic()

    def before(self, code: int, trainer, arg: int = 0) -> None:
        """On rank 0, tell the others which trainer call comes next (nothing on the others). A
        step carries whether the trainer's ``sync_at`` makes it a sync point (the job's telemetry
        and checkpoint steps: the others keep their last good weights at the same steps)."""
        if not self.leader:
            return
        if code == STEP:
            step = trainer.step_index + 1
            arg = int(trainer.sync_at is not None and bool(trainer.sync_at(step)))
        self._send(code, arg)

    def ping(self) -> None:
        """Rank 0 is alive but has no call for the others (paused, measuring, saving)."""
        if self.leader:
            self._send(PING)

    def end(self) -> None:
        """Rank 0 is done: the others return from :meth:`follow`."""
        if self.leader:
            self._send(END)

    def follow(self, trainer, on_step=None) -> None:
        """On ranks other than 0: replay rank 0's trainer calls until it ends. ``on_step(seconds)``
        after each step, with the seconds inside it (this worker's throughput). A divergence is rank 0's to handle (it restores the
        last good weights, which is replayed here too)."""
        while True:
            message = torch.zeros(2, dtype=torch.int64, device="cpu")
            dist.broadcast(message, src=0, group=self.control)
            code, arg = message.tolist()
            if code == END:
                return
            try:
                if code == STEP:
                    trainer.sync_at = lambda step, sync=bool(arg): sync
                    started = time.perf_counter()
                    trainer.step()
                    if on_step is not None:
                        on_step(time.perf_counter() - started)
                elif code in CALLS:
                    getattr(trainer, CALLS[code])()
                elif code in (GATHER_WEIGHTS, GATHER_GOOD):
                    self._gather(trainer, code)
            except Diverged:
                pass

    # --- full weights on rank 0 (FSDP) ---------------------------------------------------------------
    def _gather(self, trainer, code: int) -> dict[str, torch.Tensor] | None:
        """The full weights (GATHER_WEIGHTS: the model's; GATHER_GOOD: the last good ones) on rank
        0's CPU, from every rank's shard (None on the others)."""
        names = [n for n, _ in trainer.model.named_parameters()]
        params = trainer.params  # the sharded parameters (the module's own may be gathered ones just now)
        shards = [p.detach() for p in params] if code == GATHER_WEIGHTS else trainer.good_state
        out = {}
        for name, p, shard in zip(names, params, shards):
            if hasattr(p, "full_tensor"):
                from torch.distributed.tensor import DTensor

                if not isinstance(shard, DTensor):
                    shard = DTensor.from_local(shard, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
                full = shard.full_tensor()
            else:
                full = shard
            if self.leader:
                out[name] = full.detach().to("cpu", copy=True)
        return out if self.leader else None

    def full_state(self, trainer) -> dict[str, torch.Tensor]:
        """Rank 0's CPU copy of the last good weights (gathered under FSDP)."""
        if self.strategy != "fsdp":
            return None
        self.before(GATHER_GOOD, trainer)
        return self._gather(trainer, GATHER_GOOD)

    @contextlib.contextmanager
    def view(self, trainer) -> Iterator[torch.nn.Module]:
        """The model to measure, on rank 0: the trainer's model itself under DDP; under FSDP a
        plain model on rank 0's device holding the gathered weights (the model's own blocks are
        sharded)."""
        if self.strategy != "fsdp":
            yield trainer.model
            return
        self.before(GATHER_WEIGHTS, trainer)
        state = self._gather(trainer, GATHER_WEIGHTS)
        if self._view is None:
            from attn_core.model import Transformer

            self._view = Transformer(trainer.model.cfg).to(self.device)
        self._view.load_state_dict(state)
        self._view.train(trainer.model.training)
        yield self._view
