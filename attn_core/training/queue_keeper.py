"""The keeper of the server's job queue (:mod:`attn_core.training.queue`): once per process and
store, a thread that marks the entries of gone processes ``interrupted`` and adopts their waiting
entries (rebuilt and run here when their turn comes). The pages start it (``ui.queue_view.keep``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from attn_core.training.queue import JobQueue

_SERVED: set[Path] = set()
_SERVED_LOCK = threading.Lock()


def serve(queue: JobQueue | None = None, poll_s: float = 2.0) -> JobQueue:
    """Start (once per process and store) the server's queue keeper: it marks the entries of gone
    processes ``interrupted`` and adopts their waiting entries, at once and then every ``poll_s``."""
    queue = queue or JobQueue()
    with _SERVED_LOCK:
        if queue.root in _SERVED:
            return queue
        queue.reap()  # a store that cannot be read refuses here, and is tried again on the next call
        queue.adopt()
        _SERVED.add(queue.root)

    def keep() -> None:
        while queue.index.path.exists():  # a store removed (a test's) is no longer kept
            try:
                queue.reap()
                queue.adopt()
            except Exception:  # a store that cannot be read now: try again later
                pass
            time.sleep(poll_s)

    threading.Thread(target=keep, name="attn-lab queue keeper", daemon=True).start()
    return queue
