"""The worker process of a live job (its parent's side is :mod:`attn_core.training.worker`):
``python -m attn_core.training.worker_process UPDATES_FD CONTROL_FD`` reads the job's config from
the control pipe, builds and trains the job, sends its changes and finally its result and weights
on the updates pipe, and stops (saving the run) when told to or when the control pipe closes."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection

from attn_core.training.worker import PARENT_ENDED, SEND_EVERY_S


class _Sender:
    """Sends a job's changes to the parent, at most every SEND_EVERY_S and at each new status."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.rows = 0
        self.last = 0.0
        self.seen: dict = {}
        self.broken = False

    def __call__(self, job, final: bool = False) -> None:
        state = job._state
        now = time.perf_counter()
        if not final and state["status"] == self.seen.get("status") and now - self.last < SEND_EVERY_S:
            return
        self.last = now
        steps, names, values = job.recorder.columns
        n = len(steps)
        changed = {k: v for k, v in state.items() if k not in self.seen or self.seen[k] is not v}
        changed["latest"] = dict(state["latest"])  # updated in place: always sent
        message = {
            "state": changed,
            "run_id": job.run_id,
            "rows": (steps[self.rows : n], names[self.rows : n], values[self.rows : n]),
            "final": final,
        }
        if final:  # as safetensors bytes: tensors pickled by multiprocessing would travel as shared fds
            from safetensors.torch import save

            message["weights"] = save(job.weights())
        self.rows, self.seen = n, dict(state)
        if not self.broken:
            try:
                self.conn.send(message)
            except OSError:  # the parent is gone: the control pipe's end stops the run
                self.broken = True


def _listen(job, control: Connection) -> None:
    """Act on the parent's commands; the end of the pipe (the parent is gone) stops the run."""
    while True:
        try:
            command, *args = control.recv()
        except (EOFError, OSError):
            job._stop_reason = job._stop_reason or PARENT_ENDED
            job.stop()
            return
        if command == "stop":
            job._stop_reason = args[0] if args and args[0] else job._stop_reason
            job.stop()
        elif command == "pause":
            job.pause()
        elif command == "resume":
            job.resume()
        elif command == "watch":
            job.watch(*args)


def main(updates_fd: int, control_fd: int) -> int:
    """The worker process: build the job as the parent did, train it, send it back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    updates, control = Connection(updates_fd, readable=False), Connection(control_fd, writable=False)
    cfg, store_root, threads = control.recv()
    import torch

    from attn_core.runs import RunStore
    from attn_core.training.job import TrainingJob
    from attn_core.training.record import error_text

    if threads:
        torch.set_num_threads(threads)
    try:
        job = TrainingJob(cfg, store=RunStore(store_root) if store_root is not None else False)
    except Exception as e:  # the source or the store changed since the parent checked them
        updates.send({"state": {"status": "failed", "message": f"could not start: {error_text(e)}"}, "final": True})
        return 1
    send = _Sender(updates)
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
