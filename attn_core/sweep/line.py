"""One sweep at a time in a process: Ray Tune keeps process-wide state (its trainable registry,
its experiment runner), so two ``Tuner.fit`` calls of one process at once break each other (the
Sweeps page's second sweep, started while the first ran, ended ``interrupted`` with
"RuntimeError: dictionary changed size during iteration" from Tune's registry). A sweep takes a
place in :data:`LINE` before it starts Ray and waits there, first come first served, saying how
many sweeps are ahead, until the one before it has ended; sweeps of other processes (another
``attn-lab sweep``) have Ray drivers of their own and do not wait."""

from __future__ import annotations

from attn_core.training.slots import JobSlots

LINE = JobSlots(limit=lambda: 1)  # this process's line of sweeps


def queued_sweep_message(ahead: int) -> str:
    """What a waiting sweep's record says."""
    return (
        f"queued: {ahead} sweep{'s' if ahead != 1 else ''} of this process ahead (one sweep runs at a time "
        "in a process); it starts by itself when the one before it ends"
    )


def busy() -> bool:
    """Whether a sweep of this process runs or waits now (a new one would wait in line)."""
    running, waiting = LINE.counts()
    return running + waiting > 0
