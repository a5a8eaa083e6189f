"""A live job in a worker process of its own (``TrainingJob.start(process=True)``, what the
dashboard does): the web server's interpreter never runs a training step, so its reruns, figures
and serialisation do not take the GIL, the cores or the GPU's launch thread from training.

The worker is a fresh interpreter (``python -m`` the job's ``WORKER`` module, in a session
of its own, safe with CUDA; that module is the worker's side of the two pipes). It rebuilds the job from its :class:`~attn_core.training.config.JobConfig`
(a plain dataclass, so every field travels) and the run store's folder, and trains it with
``TrainingJob.run``: the same step loop, guard, telemetry and saving as a job in a thread. Two
pipes join it to the job in the parent:

- control (parent to worker): the config, then ``stop``, ``pause``, ``resume`` and ``watch``
  (the head whose probe pattern the page draws);
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


def obey(job, command: str, *args) -> None:
    """Do a driver's ``command`` (``stop`` [reason], ``pause``, ``resume``, ``watch`` layer head: the
    head the Retrain page draws, its probe pattern only) on the job a worker runs (a worker process
    here, a Ray Train rank in :mod:`attn_core.distributed.rank`)."""
    if command == "stop":
        job.stop(args[0] if args else "")
    elif command == "pause":
        job.pause()
    elif command == "resume":
        job.resume()
    elif command == "watch":
        job.watch(*args)


def apply_update(job, message: dict, final_weights=None):
    """On the driver: a worker's update of ``job`` (its new metric rows, run id and state are
    published as the job's own); returns the final weights it carries, else ``final_weights``."""
    for column, new in zip(job.recorder.columns, message.get("rows", ((), (), ()))):
        column.extend(new)
    if message.get("run_id"):
        job.recorder.run_id = message["run_id"]
    if message.get("weights") is not None:
        from safetensors.torch import load

        final_weights = load(message["weights"])
    job.publish(**message.get("state", {}))
    return final_weights


ROOT = Path(__file__).resolve().parents[2]  # the folder holding attn_core: the worker imports the same code

_LIVE: weakref.WeakSet = weakref.WeakSet()  # workers training now, stopped and awaited at exit


class Remote:
    """The worker process of one ``TrainingJob`` of this process (``job.remote``): it trains the
    job there and applies what comes back to the job here."""

    def __init__(self, job, threads: int | None):
        self.job, self.threads = job, threads
        self.process: subprocess.Popen | None = None
        self.control: Connection | None = None
        self.final_weights: dict | None = None  # the job builds no model on this side (job.build)

    def tell(self, *command) -> None:
        """Send a command (``stop`` [reason], ``pause``, ``resume``, ``watch`` layer head) to the
        worker, if it runs."""
        if self.control is not None:
            try:
                self.control.send(command)
            except (OSError, ValueError):  # the worker is gone: nothing left to tell
                pass

    def weights(self) -> dict:
        if self.final_weights is None:
            raise RuntimeError("a job in a worker process sends its weights back when it ends; join() it first")
        return {k: v.clone() for k, v in self.final_weights.items()}

    def apply(self, message: dict) -> None:
        """A worker's update of the job (its new metric rows, state, result and weights)."""
        self.final_weights = apply_update(self.job, message, self.final_weights)

    def train(self) -> None:
        """Train the job in a worker and follow it until it ends: its snapshots, then its result
        and weights, arrive here. Returns when the worker is gone."""
        job = self.job
        updates_r, updates_w = os.pipe()
        control_r, control_w = os.pipe()
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", job.WORKER, str(updates_w), str(control_r)],
                pass_fds=(updates_w, control_r),
                env={**os.environ, "PYTHONPATH": path},
                start_new_session=True,  # a terminal's Ctrl-C goes to the parent, which stops the job
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(updates_w)
            os.close(control_r)
        updates, control = Connection(updates_r, writable=False), Connection(control_w, readable=False)
        control.send((job.cfg, None if job.store is None else str(job.store.root), self.threads))
        self.control = control
        _LIVE.add(self)
        for command in job.requests():  # a head watched, a stop or pause asked for while it started
            self.tell(*command)
        ended = False
        try:
            while True:
                try:
                    message = updates.recv()
                except (EOFError, OSError):
                    break
                self.apply(message)
                ended = ended or message.get("final", False)
        finally:
            updates.close()
            self.control = None
            control.close()
            self.process.wait()
            _LIVE.discard(self)
        if not ended:
            job.publish(
                status="failed",
                message=f"the training process ended unexpectedly (exit code {self.process.returncode}); "
                "what it saved is in the run store",
            )


class Sender:
    """Sends a job's changes to the parent (on ``conn``: a pipe, or a Ray channel's ``send``), at
    most every SEND_EVERY_S and at each new status; the worker process's and a multi-worker run's
    rank 0's side of :meth:`Remote.apply`."""

    def __init__(self, conn: Connection, weights: bool = True):
        self.conn, self.weights = conn, weights  # weights: send the final weights (else the store has them)
        self.rows = 0
        self.last = 0.0
        self.seen: dict = {}
        self.broken = False

    def __call__(self, job, final: bool = False) -> None:
        state = job.state()
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
        if (
            final and self.weights
        ):  # as safetensors bytes: tensors pickled by multiprocessing would travel as shared fds
            from safetensors.torch import save

            message["weights"] = save(job.weights())
        self.rows, self.seen = n, dict(state)
        if not self.broken:
            try:
                self.conn.send(message)
            except OSError:  # the parent is gone: the control pipe's end stops the run
                self.broken = True


@atexit.register
def _stop_workers_at_exit() -> None:
    """This process is exiting: every worker stops after its step, saves, and is waited for."""
    remotes = list(_LIVE)
    for remote in remotes:
        remote.job.stop(PARENT_ENDED)
    deadline = time.monotonic() + EXIT_WAIT_S
    for remote in remotes:
        try:
            remote.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
