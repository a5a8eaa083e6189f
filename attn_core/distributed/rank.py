"""What every Ray Train worker of a multi-worker retrain runs (:func:`train_loop`, the
``train_loop_per_worker`` of :mod:`attn_core.distributed.remote`): one rank.

Every rank builds the job from the same :class:`~attn_core.training.config.JobConfig` with its
:class:`~attn_core.distributed.parallel.DataParallel` (so the model, task, penalty and trainer
are the same everywhere and the model is sharded or wrapped in step). Rank 0 then runs the job as
one process would (``TrainingJob.run``: the step loop, guard, telemetry, checkpoints and the run
store, which only it writes) and sends the job's snapshots up the channel to the driver, whose
commands (stop, pause, resume) it takes from there; the other ranks replay rank 0's trainer calls
(``DataParallel.follow``) and keep no store. Every rank reports its throughput and peak memory.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import socket
import threading
import time

PING_S = 30.0  # rank 0 says it lives at least this often (a pause, a long measurement or save)
STATS_EVERY_S = 1.0  # a worker's throughput reaches the driver at most this often
POLL_S = 0.2  # rank 0 reads the driver's commands this often


# set once this worker has nothing left to save (rank 0: its run is in the store)
SAVED = threading.Event()


class Stats:
    """One worker's throughput and peak memory, sent to the channel at most every STATS_EVERY_S."""

    def __init__(self, channel, rank: int, device):
        self.channel, self.rank, self.device = channel, rank, device
        self.steps, self.seconds, self.last = 0, 0.0, 0.0

    def peak_mib(self) -> float:
        import torch

        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        try:  # this process image's own peak (ru_maxrss can carry a parent's across exec)
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
        except (OSError, StopIteration):
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    def info(self, steps: int, seconds: float) -> dict:
        return {
            "rank": self.rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": str(self.device),
            "steps": steps,
            "steps_per_s": steps / seconds if seconds > 0 else 0.0,
            "peak_mib": round(self.peak_mib(), 1),
        }

    def tick(self, seconds: float) -> None:
        """A step of ``seconds`` ended (a worker other than rank 0 counts its own; rank 0's are its
        job's: steps over the time inside ``Trainer.step``)."""
        self.steps, self.seconds = self.steps + 1, self.seconds + seconds
        self.report(self.steps, self.seconds)

    def report(self, steps: int, seconds: float, force: bool = False) -> None:
        now = time.monotonic()
        if self.channel is not None and (force or now - self.last >= STATS_EVERY_S):
            self.last = now
            self.channel.worker.remote(self.rank, self.info(steps, seconds))


def _listen(job, channel, done: threading.Event) -> None:
    """Rank 0: act on the driver's commands; a driver that is gone stops the run (it is saved)."""
    import ray

    from attn_core.training.worker import PARENT_ENDED, obey

    while not done.wait(POLL_S):
        try:
            commands = ray.get(channel.commands.remote())
        except Exception:  # noqa: BLE001 -- the driver (which owns the channel) is gone
            job.stop(job.stop_reason or PARENT_ENDED)
            return
        for command, *args in commands:
            obey(job, command, *args)


def _keepalive(dp, done: threading.Event) -> None:
    """Rank 0: while it measures, saves or is paused, the others wait for its next call; a ping
    every PING_S keeps their wait within the process group's timeout."""
    while not done.wait(PING_S / 3):
        if time.monotonic() - dp.last_sent >= PING_S:
            try:
                dp.ping()
            except Exception:  # noqa: BLE001 -- a rank is gone: the step loop says so
                return


def follower_config(cfg):
    """A rank other than 0 keeps no checkpoints (rank 0 writes them, from gathered weights)."""
    return dataclasses.replace(cfg, checkpoint_every=None, checkpoint_log=None, checkpoint_steps=None)


def run_rank(job_class, cfg, dp, store_root: str | None, channel=None):
    """Rank ``dp.rank`` of the run of ``cfg`` (see the module), a ``job_class`` (``TrainingJob``,
    which the driver passes: it starts this module). ``store_root``: the run store rank 0 writes
    (None: nothing is stored, the final weights and card travel to the driver); ``channel``: the
    driver's (None: nobody watches, as in the tests of the ranks alone). Returns this rank's job."""
    from attn_core.runs import RunStore
    from attn_core.training.worker import Sender

    stats = Stats(channel, dp.rank, dp.device)
    SAVED.clear()
    if not dp.leader:
        SAVED.set()
        job = job_class.open(follower_config(cfg), store=False, dist=dp)
        dp.follow(job.trainer, on_step=stats.tick)
        stats.report(stats.steps, stats.seconds, force=True)
        return job
    job = job_class.open(cfg, store=RunStore(store_root) if store_root else False, dist=dp)
    done = threading.Event()
    send = None
    if channel is not None:
        send = Sender(_Channel(channel), weights=store_root is None)

        def publish(job) -> None:
            send(job)
            s = job.snapshot()
            stats.report(s.step, s.step_s)

        job.on_publish = publish
        threading.Thread(target=_listen, args=(job, channel, done), daemon=True, name="attn-lab commands").start()
    threading.Thread(target=_keepalive, args=(dp, done), daemon=True, name="attn-lab ping").start()
    try:
        job.run()
        if send is not None:
            if store_root is None:  # no store: the driver records what a run store would have
                _send_record(channel, job)
            s = job.snapshot()
            stats.report(s.step, s.step_s, force=True)
            send(job, final=True)  # gathers the weights of an FSDP run (the others still follow)
    finally:
        done.set()
        SAVED.set()
        try:
            dp.end()
        except Exception:  # noqa: BLE001 -- a rank is gone: the run has said why
            pass
    return job


def _send_record(channel, job) -> None:
    """A run without a store (a sweep trial): the card and the checkpoint files go to the driver,
    which records the run (``sweep.trial.record_trial``)."""
    from attn_core.training.checkpoints import take_files
    from attn_core.training.record import Outcome

    res = job.result()
    card = job.card(Outcome(res["status"], res["message"]), res["after"])
    channel.put.remote({"card": card.to_dict(), "checkpoints": take_files(job.checkpoints)})


class _Channel:
    """The driver's channel as the worker process's pipe (``Sender`` sends to it)."""

    def __init__(self, channel):
        self.channel = channel

    def send(self, message: dict) -> None:
        self.channel.put.remote(message)


def train_loop(config: dict) -> None:
    """Ray Train's ``train_loop_per_worker``: this worker's rank of the run in ``config``
    (job_class, cfg, store, channel, threads), on the device Ray gave it."""
    import ray.train
    import ray.train.torch
    import torch

    from attn_core.distributed.parallel import DataParallel

    ctx = ray.train.get_context()
    threads = max(1, int(config.get("threads") or 1))  # the CPUs Ray gave this worker
    torch.set_num_threads(threads)
    if config.get("store"):  # the ranks read the text cache and run:<id> sources of the driver's store
        os.environ["ATTN_LAB_RUNS"] = config["store"]
    cfg = dataclasses.replace(config["cfg"], threads=threads)  # its trainer keeps them
    device = ray.train.torch.get_device() if cfg.gpus_per_worker else torch.device("cpu")
    if device.type == "cuda":  # NCCL and every tensor made without a device go to this worker's GPU
        torch.cuda.set_device(device)
    dp = DataParallel(ctx.get_world_rank(), ctx.get_world_size(), cfg.strategy, device)
    run_rank(config["job_class"], cfg, dp, config.get("store"), config.get("channel"))
