"""The worker process of a live job (its parent's side is :mod:`attn_core.training.worker`):
``python -m attn_core.retraining.worker_process UPDATES_FD CONTROL_FD`` reads the job's config from
the control pipe, builds and trains the job, sends its changes and finally its result and weights
on the updates pipe, and stops (saving the run) when told to or when the control pipe closes."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
from multiprocessing.connection import Connection

from attn_core.training.worker import PARENT_ENDED, Sender, obey


def _listen(job, control: Connection) -> None:
    """Act on the parent's commands; the end of the pipe (the parent is gone) stops the run."""
    while True:
        try:
            command, *args = control.recv()
        except (EOFError, OSError):
            job.stop(job.stop_reason or PARENT_ENDED)
            return
        obey(job, command, *args)


def main(updates_fd: int, control_fd: int) -> int:
    """The worker process: build the job as the parent did, train it, send it back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    updates, control = Connection(updates_fd, readable=False), Connection(control_fd, writable=False)
    cfg, store_root, threads = control.recv()
    from attn_core.retraining.job import TrainingJob
    from attn_core.runs import RunStore
    from attn_core.training.record import error_text

    if threads:  # the trainer takes them (its one place for threads: Trainer)
        cfg = dataclasses.replace(cfg, threads=threads)
    try:
        job = TrainingJob.open(cfg, store=RunStore(store_root) if store_root is not None else False)
    except Exception as e:  # the source or the store changed since the parent checked them
        updates.send({"state": {"status": "failed", "message": f"could not start: {error_text(e)}"}, "final": True})
        return 1
    send = Sender(updates)
    job.on_publish = send
    threading.Thread(target=_listen, args=(job, control), daemon=True, name="attn-lab control").start()
    try:
        job.run()
    finally:
        send(job, final=True)
        updates.close()
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(int(sys.argv[1]), int(sys.argv[2])))  # saved and sent: no teardown under the control thread
