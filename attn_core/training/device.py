"""Where and how a training step runs: the device (CUDA when available, overridable), the
precision (fp32, or bf16 autocast of the forward and loss), and how often the step loop reads the
device (``sync_every``). The trainer, the configs and the front ends (device and precision
pickers) take them from here (see docs/architecture.md). torch is imported by the functions that
use it, so that the configs can check a precision or a sync interval without loading it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from attn_core.validate import check, check_int

PRECISIONS = ("fp32", "bf16")  # bf16: forward and loss under torch.autocast; weights and AdamW stay fp32
# sync_every=None: read the device every step on CPU, where reading costs nothing (CPU kernels run
# synchronously) and the guard then stops a bad step before its update; on CUDA a read waits for
# the queue to drain, so the loop reads every SYNC_EVERY_CUDA steps.
SYNC_EVERY_CUDA = 25
MAX_SYNC_EVERY = 10_000

if TYPE_CHECKING:
    import torch


def select_device(name: str = "auto") -> torch.device:
    """'auto' is CUDA when present, else CPU; 'cpu' and 'cuda[:i]' are honoured if available."""
    import torch

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
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def check_precision(precision: object, prefix: str = "") -> str:
    check(precision in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}", prefix)
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
