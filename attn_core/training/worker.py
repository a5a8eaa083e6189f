"""A live job in a worker process of its own (``TrainingJob.start(process=True)``, what the
dashboard does): the web server's interpreter never runs a training step, so its reruns, figures
and serialisation do not take the GIL, the cores or the GPU's launch thread from training.

The worker is a fresh interpreter (``python -m attn_core.training.worker_process``, in a session
of its own, safe with CUDA; that module is the worker's side of the two pipes). It rebuilds the job from its :class:`~attn_core.training.config.JobConfig`
(a plain dataclass, so every field travels) and the run store's folder, and trains it with
``TrainingJob.run``: the same step loop, guard, telemetry and saving as a job in a thread. Two
pipes join it to the job in the parent:

- control (parent to worker): the config, then ``stop``, ``pause`` and ``resume``;
- updates (worker to parent): what changed (new metric rows, the state, a new probe pattern), at
  most every :data:`SEND_EVERY_S` and at every change of status, then the final state and the
  last good weights (a CPU state dict) once the run is saved. A thread of the parent applies them
  to the parent's job, whose ``snapshot()`` is then what it is for a job in a thread.

Ctrl-C: the worker is in its own session, so a terminal's SIGINT reaches only the parent, whose
stop request (``interrupt.sigint_stops``) stops the worker; the worker ignores SIGINT anyway.
Nothing is lost when the parent goes away: when the control pipe closes (the parent was killed,
or is exiting: an exit handler stops every worker and waits for it to save) the worker stops after
its current step and saves the run as ``stopped``, saying why. A worker that dies ends its job
``failed`` in the parent. See docs/architecture.md, "Live retraining".
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
import weakref
from multiprocessing.connection import Connection
from pathlib import Path

SEND_EVERY_S = 0.05  # at most 20 updates a second (the page draws at most 5)
EXIT_WAIT_S = 120.0  # an exiting parent waits this long for each worker to save
PARENT_ENDED = "the process that started it ended"
ROOT = Path(__file__).resolve().parents[2]  # the folder holding attn_core: the worker imports the same code

_LIVE: weakref.WeakSet = weakref.WeakSet()  # jobs with a worker, stopped and awaited at exit


def tell(job, *command) -> None:
    """Send a control command to ``job``'s worker, if it has one (a gone worker is ignored)."""
    control = job._control
    if control is not None:
        try:
            control.send(command)
        except (OSError, ValueError):
            pass


def train_remotely(job, threads: int | None) -> None:
    """Train ``job`` (a ``TrainingJob`` of this process) in a worker and follow it until it ends:
    its snapshots, then its result and weights, arrive here. Returns when the worker is gone."""
    updates_r, updates_w = os.pipe()
    control_r, control_w = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "attn_core.training.worker_process", str(updates_w), str(control_r)],
            pass_fds=(updates_w, control_r),
            env=env,
            start_new_session=True,  # a terminal's Ctrl-C goes to the parent, which stops the job
            stdin=subprocess.DEVNULL,
        )
    finally:
        os.close(updates_w)
        os.close(control_r)
    updates, control = Connection(updates_r, writable=False), Connection(control_w, readable=False)
    job._process = process
    control.send((job.cfg, None if job.store is None else str(job.store.root), threads))
    job._control = control
    _LIVE.add(job)
    if job._stop.is_set():  # asked for while the worker started
        tell(job, "stop", job._stop_reason)
    elif not job._go.is_set():
        tell(job, "pause")
    ended = False
    try:
        while True:
            try:
                message = updates.recv()
            except (EOFError, OSError):
                break
            job._apply(message)
            ended = ended or message.get("final", False)
    finally:
        updates.close()
        job._control = None
        control.close()
        process.wait()
        _LIVE.discard(job)
    if not ended:
        job._publish(
            status="failed",
            message=f"the training process ended unexpectedly (exit code {process.returncode}); "
            "what it saved is in the run store",
        )


@atexit.register
def _stop_workers_at_exit() -> None:
    """This process is exiting: every worker stops after its step, saves, and is waited for."""
    jobs = list(_LIVE)
    for job in jobs:
        job._stop_reason = PARENT_ENDED
        job.stop()
    deadline = time.monotonic() + EXIT_WAIT_S
    for job in jobs:
        try:
            job._process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
