"""A Ray Train worker callback that holds a worker's shutdown until rank 0 has saved its run (at
most ``SAVE_GRACE_S``): when a worker dies, Ray Train ends the others, and rank 0 may be saving
the last good weights just then. Ray Train's worker callbacks are internal API: with a Ray that
lacks them, :func:`grace_callback` is None (the driver then marks the run failed if rank 0 was
ended before it saved; what it had saved stays)."""

from __future__ import annotations

SAVE_GRACE_S = 4.5  # Ray Train waits 5 s for a worker's shutdown hooks before it kills the worker

try:
    from ray.train.v2._internal.execution.callback import WorkerCallback
except ImportError:  # pragma: no cover - another Ray
    WorkerCallback = None

if WorkerCallback is not None:

    class SaveFirst(WorkerCallback):
        """Before Ray Train ends this worker: wait for rank 0's save (``rank.SAVED``)."""

        def before_worker_shutdown(self):
            from attn_core.distributed.rank import SAVED

            SAVED.wait(SAVE_GRACE_S)


def grace_callback():
    """The callback for ``RunConfig(callbacks=...)``, or None."""
    return SaveFirst() if WorkerCallback is not None else None
