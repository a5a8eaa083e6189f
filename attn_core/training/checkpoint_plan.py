"""Which steps of a run keep their weights: :class:`CheckpointPlan` (every N steps, K log-spaced
steps, explicit steps, which parameters, a disk bound) and its :meth:`~CheckpointPlan.schedule`.
A setting of the training configs, so it imports no torch; writing and reading the checkpoints is
``attn_core.training.checkpoints`` (docs/checkpoints.md)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from attn_core.validate import check, is_int, is_number, shown

PARAMS = ("all", "attn")
DEFAULT_MAX_MB = 1024.0  # the default disk bound of one series
MAX_CHECKPOINTS = 10_000  # checkpoints of one run


def log_steps(total: int, n: int) -> list[int]:
    """Up to ``n`` steps spaced evenly in log(step) from 1 to ``total``, rounded; steps that round
    to the same whole step are kept once, so early in a run there may be fewer than ``n``."""
    if n <= 1 or total <= 1:
        return [total]
    return sorted({max(1, round(total ** (i / (n - 1)))) for i in range(n)})


@dataclass(frozen=True)
class CheckpointPlan:
    """Which steps a run keeps: multiples of ``every``, ``log`` steps log-spaced from 1 to the
    end, the given ``steps`` (steps past the end are dropped), always 0 and the last; ``params``
    ``all`` or ``attn`` (attention and LayerNorm tensors only); ``max_mb`` the disk bound (MiB)."""

    every: int | None = None
    log: int | None = None
    steps: tuple[int, ...] = ()
    params: str = "all"
    max_mb: float = DEFAULT_MAX_MB

    def __post_init__(self) -> None:
        def ok(cond: bool, msg: str) -> None:
            check(cond, msg, prefix="invalid checkpoint setting: ")

        ok(
            self.every is None or (is_int(self.every) and self.every >= 1),
            f"--checkpoint-every must be a whole number of steps >= 1, got {shown(self.every)}",
        )
        ok(
            self.log is None or (is_int(self.log) and 1 <= self.log <= MAX_CHECKPOINTS),
            f"--checkpoint-log must be 1..{MAX_CHECKPOINTS:,} checkpoints, got {shown(self.log)}",
        )
        steps = tuple(self.steps or ())
        ok(all(is_int(s) and s >= 0 for s in steps), "--checkpoint-steps must be whole numbers >= 0")
        ok(len(steps) <= MAX_CHECKPOINTS, f"--checkpoint-steps takes at most {MAX_CHECKPOINTS:,} steps")
        object.__setattr__(self, "steps", tuple(sorted(set(int(s) for s in steps))))
        ok(self.params in PARAMS, f"--checkpoint-params must be one of {', '.join(PARAMS)}, got {shown(self.params)}")
        ok(
            is_number(self.max_mb) and 0 < self.max_mb < math.inf,
            f"--checkpoint-max-mb must be a positive number of MiB, got {shown(self.max_mb)}",
        )

    @property
    def active(self) -> bool:
        """Whether the plan keeps anything (a plan of defaults keeps nothing)."""
        return self.every is not None or self.log is not None or bool(self.steps)

    def schedule(self, total: int) -> list[int]:
        """The steps kept in a run of ``total`` steps, ascending; [] for an inactive plan."""
        if not self.active:
            return []
        out = {0, total}
        if self.every is not None:
            out.update(range(self.every, total + 1, self.every))
        if self.log is not None:
            out.update(log_steps(total, self.log))
        out.update(s for s in self.steps if s <= total)
        steps = sorted(out)
        check(
            len(steps) <= MAX_CHECKPOINTS,
            f"{len(steps):,} checkpoints is more than {MAX_CHECKPOINTS:,}; keep fewer (a larger --checkpoint-every)",
        )
        return steps

    def to_dict(self) -> dict:
        return {**asdict(self), "steps": list(self.steps)}

    @classmethod
    def of(cls, every=None, log=None, steps=(), params="all", max_mb=None) -> CheckpointPlan | None:
        """A plan from settings as a config holds them; None when nothing is kept."""
        plan = cls(every, log, tuple(steps or ()), params or "all", DEFAULT_MAX_MB if max_mb is None else max_mb)
        return plan if plan.active else None
