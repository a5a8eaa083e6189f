"""Where and how a training step runs: the device (CUDA when available, overridable), the
precision (fp32, or bf16 autocast of the forward and loss), and how often the step loop reads the
device (``sync_every``). The trainer, the configs and the front ends (device and precision
pickers) take them from here (see docs/architecture.md). torch is imported by the functions that
use it, so that the configs can check a precision or a sync interval without loading it.

Placement: every decision that depends on where tensors live is made here, by pure
functions of (tensor device, target device, precision, compiled), tested on the CPU with a table
of devices (tests/unit/test_placement.py): whether two devices are the same (``cuda`` is the
current CUDA device: ``cuda`` and ``cuda:0`` are the same device when 0 is current),
whether and how a tensor is copied (:func:`copy_plan`: pinned, non-blocking copies only for dense
CPU tensors headed to CUDA), the autocast of a precision, the optimizer's implementation, the
compile mode, the scoring form, where batches are drawn, how a host read is made
(:func:`host_read`), where a batch of small matrices is decomposed (:func:`decomposition_device`)
and how many intra-op threads a training loop takes (:func:`choose_threads`, from the step's work,
the cores, the load and the user's choice; the trainer applies it with :func:`apply_threads`). No other module compares ``torch.device`` objects (an architecture test
says so); the two helpers that act (:func:`move`, :func:`host_read`) apply these decisions."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, NamedTuple

from attn_core.validate import check, check_int, shown

PRECISIONS = ("fp32", "bf16")  # bf16: forward and loss under torch.autocast; weights and AdamW stay fp32
# sync_every=None: read the device every step on CPU, where reading costs nothing (CPU kernels run
# synchronously) and the guard then stops a bad step before its update; on CUDA a read waits for
# the queue to drain, so the loop reads every SYNC_EVERY_CUDA steps.
SYNC_EVERY_CUDA = 25
MAX_SYNC_EVERY = 10_000

# Intra-op threads of a training loop on the CPU (:func:`choose_threads`): one more thread for
# each WORK_PER_THREAD of a step's work (parameters x sequences x tokens). Below it a step is too
# short for threads to pay (a step of work 4.7e8, d_model 128, took 156 ms on one thread of a
# 2-core machine): every operation of a small model splits into pieces that cost less than
# waking a thread. A thread needs a free core too: on a machine busy with other work (load
# average at the core count) a second thread waits at every operation for a core and made steps
# 5 to 40 times slower (benchmarks/train_threads.py).
WORK_PER_THREAD = 250_000_000
MAX_THREADS = 256

if TYPE_CHECKING:
    import torch


def select_device(name: str = "auto") -> torch.device:
    """'auto' is CUDA when present, else CPU; 'cpu' and 'cuda[:i]' are honoured if available."""
    import torch

    if name is not None and (not isinstance(name, str) or len(name) > 32):  # torch.device(True): no one sentence
        raise ValueError(f"unknown device {shown(name)}; use auto, cpu or cuda")
    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use auto, cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA GPU is available; use cpu or auto")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {shown(name)}; use auto, cpu or cuda")
    return dev


def available_devices() -> list[str]:
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def check_precision(precision: object, prefix: str = "") -> str:
    ok = isinstance(precision, str) and precision in PRECISIONS
    check(ok, f"precision must be one of {', '.join(PRECISIONS)}, got {shown(precision)}", prefix)
    return str(precision)


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype of the forward under autocast: bfloat16 for bf16, None (no autocast) for fp32."""
    import torch

    return torch.bfloat16 if precision == "bf16" else None


def autocast_args(device: torch.device, dtype: torch.dtype | None) -> tuple[str, torch.dtype] | None:
    """(device type, dtype) of ``torch.autocast`` on ``device`` in ``dtype``; None (plain fp32)
    when ``dtype`` is None or the device has no autocast (the meta device of the device tests).
    A compiled step asks this once, outside the traced code: the question is not traceable."""
    import torch

    if dtype is None or not torch.amp.is_autocast_available(device.type):
        return None
    return device.type, dtype


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on ``device`` in ``dtype``; nothing (plain fp32) when ``dtype`` is None
    or the device has no autocast (the meta device of the device tests)."""
    import torch

    args = autocast_args(device, dtype)
    return contextlib.nullcontext() if args is None else torch.autocast(args[0], dtype=args[1])


def check_sync_every(sync_every: object, prefix: str = "") -> int | None:
    """None (the device's default) or an integer 1..MAX_SYNC_EVERY."""
    return None if sync_every is None else check_int("sync_every", sync_every, 1, MAX_SYNC_EVERY, prefix)


def sync_interval(cfg, device: torch.device) -> int:
    """Steps between two reads of the device: ``cfg.sync_every`` (``cfg`` a
    :class:`~attn_core.training.config.TrainConfig`), else 1 on CPU and SYNC_EVERY_CUDA on CUDA."""
    return cfg.sync_every or (SYNC_EVERY_CUDA if device.type == "cuda" else 1)


# --- placement -----------------------------------------------------------------------------------------
def _index(device: torch.device, current_cuda: int) -> int:
    """The device's index: ``cuda`` without one is the current CUDA device; cpu and meta have one device."""
    if device.index is not None:
        return device.index
    return current_cuda if device.type == "cuda" else 0


def same_device(a: torch.device | str, b: torch.device | str, current_cuda: int | None = None) -> bool:
    """Whether ``a`` and ``b`` are one device, ``current_cuda`` being the index of the current CUDA
    device (``torch.device('cuda:0') != torch.device('cuda')`` in torch, yet both are the GPU a
    one-GPU machine trains on); None: torch's current device, asked only when an unindexed
    ``cuda`` is compared (the tests pass it: the function is then pure)."""
    import torch

    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if current_cuda is None:
        current_cuda = current_cuda_index() if a.type == "cuda" and None in (a.index, b.index) else 0
    return _index(a, current_cuda) == _index(b, current_cuda)


def current_cuda_index() -> int:
    """The current CUDA device's index (0 without CUDA; asks torch only where CUDA is initialised)."""
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else 0


class Copy(NamedTuple):
    """How a tensor reaches a device: ``copy`` (it is elsewhere), ``pin`` (through page-locked host
    memory first) and ``non_blocking`` (the copy does not wait for the device)."""

    copy: bool
    pin: bool
    non_blocking: bool


def copy_plan(
    source: torch.device | str, target: torch.device | str, current_cuda: int | None = None, dense: bool = True
) -> Copy:
    """How a tensor on ``source`` reaches ``target``: nothing when they are one device
    (:func:`same_device`); a dense CPU tensor headed to CUDA is pinned and copied without a wait
    (the GPU's stream orders the copy before its use); every other copy is a plain ``.to`` (to
    the CPU it must wait: the host reads it; to meta there is nothing to wait for; CUDA to CUDA
    is ordered by torch; a sparse or other non-dense CPU tensor cannot be pinned)."""
    import torch

    source, target = torch.device(source), torch.device(target)
    if same_device(source, target, current_cuda):
        return Copy(False, False, False)
    pinned = source.type == "cpu" and target.type == "cuda" and dense
    return Copy(True, pinned, pinned)


def move(t: torch.Tensor, target: torch.device | str) -> torch.Tensor:
    """``t`` on ``target`` as :func:`copy_plan` says (``t`` itself when it is there already)."""
    import torch

    target = torch.device(target)
    plan = copy_plan(t.device, target, dense=t.layout == torch.strided)
    if not plan.copy:
        return t
    return (t.pin_memory() if plan.pin else t).to(target, non_blocking=plan.non_blocking)


def reads_through_pinned(device: torch.device | str) -> bool:
    """Whether a host read of values on ``device`` goes through a pinned buffer and one wait on
    the device's stream (CUDA); elsewhere the values are read where they are (CPU; on meta the read
    raises, which is how the tests find a host read on the training device)."""
    import torch

    return torch.device(device).type == "cuda"


def host_read(values: torch.Tensor) -> list:
    """``values.tolist()``: the one host read of a step window (:func:`reads_through_pinned`)."""
    import torch

    if reads_through_pinned(values.device):
        host = torch.empty(values.shape, dtype=values.dtype, device="cpu", pin_memory=True)
        host.copy_(values, non_blocking=True)
        torch.cuda.current_stream(values.device).synchronize()
        values = host
    return values.tolist()


def optimizer_options(device: torch.device | str, compiled: bool) -> dict:
    """AdamW's implementation on ``device``: fused on CUDA (one kernel for every parameter);
    the per-tensor form off CUDA when compiled (it takes the tensor learning rate of a compiled
    step eagerly too); PyTorch's default otherwise (the CPU's results stay what they were)."""
    import torch

    if torch.device(device).type == "cuda":
        return {"fused": True}
    return {"foreach": False} if compiled else {}


def compile_mode(device: torch.device | str) -> str:
    """CUDA graphs on CUDA (``reduce-overhead``); inductor's default elsewhere."""
    import torch

    return "reduce-overhead" if torch.device(device).type == "cuda" else "default"


def static_scoring(device: torch.device | str, compiled: bool) -> bool:
    """Whether a step scores its batch by a masked mean (no host read, static shapes: compiled,
    and on every device but the CPU) rather than by a flat index taken on the host."""
    import torch

    return compiled or torch.device(device).type != "cpu"


def batch_device(device: torch.device | str, host_batches: bool) -> torch.device:
    """Where a run on ``device`` draws its training batches: on the GPU itself on CUDA (its own
    stream: no copy, no wait), on the CPU elsewhere and for a task that reads host memory (text)."""
    import torch

    device = torch.device(device)
    return device if device.type == "cuda" and not host_batches else torch.device("cpu")


# cuSOLVER decomposes a batch at once only for matrices up to 32 x 32 (gesvdjBatched, syevjBatched);
# torch solves larger ones one after another. Measured on an H200 (torch 2.11, CUDA 13): the
# singular values of 144 heads' 64 x 64 cores took 213 ms, and of the 9,360 cores of their
# rotary offsets 11 s, about 1.2 ms a matrix, where the host takes tens of microseconds each.
CUDA_BATCHED_MAX = 32
HOST_DECOMPOSITION_MAX = 256  # wider: one matrix at a time on the GPU is no slower than the host
HOST_DECOMPOSITIONS = ("svd", "eigh")  # QR runs well on the GPU (the 288 QRs of that spectrum were < 40 ms)


def decomposition_device(
    device: torch.device | str, op: str, m: int, n: int, differentiable: bool = False
) -> torch.device:
    """Where a batch of ``m`` x ``n`` matrices on ``device`` is decomposed by ``op`` (``svd`` for
    singular values and vectors, ``eigh`` for symmetric eigenvalues, ``qr``): on the host for
    ``svd`` and ``eigh`` of CUDA matrices whose smaller side is over CUDA_BATCHED_MAX and at most
    HOST_DECOMPOSITION_MAX (the head-sized cores of a spectrum); where the matrices are otherwise:
    the CPU, the meta device (no values to move) and a ``differentiable`` decomposition (a
    penalty's inside a training step, which a copy to the host would make wait for the device)."""
    import torch

    device = torch.device(device)
    small = CUDA_BATCHED_MAX < min(m, n) <= HOST_DECOMPOSITION_MAX
    if device.type == "cuda" and op in HOST_DECOMPOSITIONS and small and not differentiable:
        return torch.device("cpu")
    return device


# --- threads -------------------------------------------------------------------------------------
def check_threads(threads: object, prefix: str = "") -> int | None:
    """None (chosen for the run: :func:`choose_threads`) or an integer 1..MAX_THREADS."""
    return None if threads is None else check_int("threads", threads, 1, MAX_THREADS, prefix)


def choose_threads(
    work: float,
    cores: int,
    requested: int | None = None,
    env: str | None = None,
    load: float = 0.0,
    device: torch.device | str = "cpu",
) -> int | None:
    """The torch intra-op threads of a training loop whose step does ``work`` (parameters x
    sequences x tokens) on ``device``, on a machine of ``cores`` CPUs whose load average (other
    work) is ``load``: ``requested`` (the user's ``--threads``) when given, else ``env``
    (``OMP_NUM_THREADS``) when it is a positive integer, else one thread per
    :data:`WORK_PER_THREAD` of work, at most the cores the load leaves free and at least one.
    None off the CPU (the step runs on the device: the process's setting is left as it is)."""
    if requested is not None:
        return int(requested)
    if env is not None and env.strip().isdigit() and int(env) > 0:
        return int(env)
    import torch

    if torch.device(device).type != "cpu":
        return None
    free = max(1, int(cores - load + 0.5))  # a core counts as free when under half of it is busy
    return max(1, min(int(cores), free, int(work // WORK_PER_THREAD) or 1))


def cpu_cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def apply_threads(requested: int | None, work: float, device: torch.device | str) -> int:
    """Set torch's intra-op threads for a training loop as :func:`choose_threads` says, from this
    machine's cores, its one-minute load average and ``OMP_NUM_THREADS``; returns the threads
    the loop runs with."""
    import torch

    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    env = os.environ.get("OMP_NUM_THREADS")
    threads = choose_threads(work, cpu_cores(), requested, env, load, device)
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return torch.get_num_threads()
