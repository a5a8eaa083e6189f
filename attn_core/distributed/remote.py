"""The driver's side of a retrain on Ray Train workers (``TrainingJob`` with ``cfg.workers``, what
``attn-lab retrain --workers N`` and the Retrain page start): :class:`RayRemote` is to the job
what :class:`attn_core.training.worker.Remote` is to a job in a worker process, over Ray instead
of pipes.

It starts or joins Ray (:func:`attn_core.cluster.ray_session`, the one place), checks that the
cluster holds N workers, and runs Ray Train V2's ``TorchTrainer`` with N workers of
:func:`attn_core.distributed.rank.train_loop` (gloo on CPU workers, NCCL on GPU workers) in a
thread, while this thread follows a small actor, the :class:`Channel`: rank 0 puts the job's
changes there (metric rows, the state, the probe pattern, then its result) and takes the
driver's commands (stop, pause, resume) from it; every worker puts its throughput and peak memory
there. The job's snapshots here are then what they are for a job in a thread.

When a worker dies, the run fails: rank 0 finds its collective broken, saves the run ``failed``
with the last good weights it holds (under DDP the whole model; under FSDP they were sharded, and
what the run checkpointed is kept), and Ray Train ends the others. The driver adds Ray's reason
(which worker, how it ended) to the run's message, and marks the run failed itself if rank 0 was
ended before it could (what it saved stays).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import threading
import time

from attn_core.training.scaling import check_cluster, worker_resources

POLL_S = 0.05  # the driver reads the channel this often (the page draws at most 5 times a second)
EXIT_WAIT_S = 120.0  # an exiting driver waits this long for rank 0 to save a stopped run
STORAGE_ENV = "ATTN_LAB_TUNE_STORAGE"  # Ray's run folder (shared on a cluster); default a temporary one


class Channel:
    """The actor between the driver and the workers (num_cpus 0, on the driver's node)."""

    def __init__(self):
        self.updates: list = []
        self.pending: list = []
        self.workers: dict = {}

    def put(self, message: dict) -> None:
        self.updates.append(message)

    def take(self) -> tuple[list, dict]:
        out, self.updates = self.updates, []
        return out, dict(self.workers)

    def command(self, *command) -> None:
        self.pending.append(command)

    def commands(self) -> list:
        out, self.pending = self.pending, []
        return out

    def worker(self, rank: int, info: dict) -> None:
        self.workers[rank] = info


class RayRemote:
    """The Ray Train run of one ``TrainingJob`` (``job.remote``), followed from this process."""

    def __init__(self, job, address: str | None = None, keep: bool = False):
        check_workers(job, address)
        self.job, self.address, self.keep = job, address, keep  # keep: Ray stays up after (the dashboard)
        self.channel = None
        self.final_weights: dict | None = None
        self.card: dict | None = None  # a run without a store: rank 0's card and checkpoint files
        self.checkpoint_files: dict | None = None
        self.ended = False
        self.refused: Exception | None = None  # Ray or the cluster refused the run before it began
        self._exited = threading.Event()  # this side builds no model (as worker.Remote)

    # --- what the job asks of its remote ----------------------------------------------------------
    def tell(self, *command) -> None:
        """Send a command (``stop`` [reason], ``pause``, ``resume``) to rank 0, once it runs."""
        if self.channel is not None:
            try:
                self.channel.command.remote(*command)
            except Exception:  # noqa: BLE001 -- Ray is gone: nothing left to tell
                pass

    def weights(self) -> dict:
        """The run's final weights: sent back (a run without a store) or read from the store."""
        if self.final_weights is None and self.job.store is not None and self.job.run_id is not None:
            loaded = self.job.store.load_model(self.job.run_id)
            self.final_weights = loaded.model.state_dict()
        if self.final_weights is None:
            raise RuntimeError("the workers' run has no weights here yet; join() it first")
        return {k: v.clone() for k, v in self.final_weights.items()}

    def apply(self, message: dict) -> None:
        """Rank 0's update of the job (as ``worker.Remote.apply``), or a run's record."""
        job = self.job
        if "card" in message:
            self.card, self.checkpoint_files = message["card"], message.get("checkpoints")
            return
        from attn_core.training.worker import apply_update

        self.ended = self.ended or message.get("final", False)
        self.final_weights = apply_update(job, message, self.final_weights)

    # --- the run -----------------------------------------------------------------------------------
    def train(self) -> None:
        """Run the job on the workers and follow it until it ends (its snapshots, then its result
        arrive here); a run that ends without rank 0's result is marked failed with Ray's reason."""
        from attn_core.cluster import ClusterError, ray_session

        cfg, job = self.job.cfg, self.job
        cpus = max(os.cpu_count() or 1, int(cfg.workers * worker_resources(0)["CPU"]))
        job.publish(message=f"starting {cfg.workers} worker(s) on Ray")
        error = None
        try:
            with ray_session(self.address, num_cpus=cpus, keep=self.keep) as session:
                check_cluster(session["cluster"], cfg.workers, cfg.gpus_per_worker)
                error = self._fit(session)
        except Exception as e:  # Ray could not start, the cluster is too small ...
            error = _first_line(e)
            if isinstance(e, ClusterError) and job.run_id is None:  # nothing ran: the request was refused
                self.refused = e
        if not self.ended:
            self._failed(error or "the workers ended without a result")
        elif error:
            self._amend(error)

    def _fit(self, session) -> str | None:
        """Ray Train's run of the job, followed here; returns why it failed (None: it did not)."""
        import ray

        job, cfg = self.job, self.job.cfg
        here = ray.get_runtime_context().get_node_id()
        self.channel = ray.remote(num_cpus=0)(Channel).options(scheduling_strategy=_on_node(here)).remote()
        for command in job.requests():  # a head watched, a stop or pause asked for while Ray started
            self.tell(*command)
        storage = os.environ.get(STORAGE_ENV) or tempfile.mkdtemp(prefix="attn-lab-train-")
        config = {
            "job_class": type(job),
            "cfg": cfg,
            "store": None if job.store is None else str(job.store.root),
            "channel": self.channel,
            "threads": int(worker_resources(0)["CPU"]),
        }
        result: dict = {}
        fit = threading.Thread(target=_fit, args=(_trainer(cfg, config, storage), result), daemon=True)
        atexit.register(self._at_exit)
        fit.start()
        try:
            while fit.is_alive():
                fit.join(POLL_S)
                self._drain()
            self._drain()
        finally:
            self._exited.set()
            atexit.unregister(self._at_exit)
            if not os.environ.get(STORAGE_ENV):
                shutil.rmtree(storage, ignore_errors=True)
        return result.get("error")

    def _drain(self) -> None:
        import ray

        messages, workers = ray.get(self.channel.take.remote())
        for message in messages:
            self.apply(message)
        if workers:
            self.job.publish(workers=tuple(workers[r] for r in sorted(workers)))

    def _at_exit(self) -> None:
        """This process exits while the workers train: stop the run and wait for rank 0 to save it
        (Ray's own exit handler, which runs after this one, then ends the workers)."""
        from attn_core.training.worker import PARENT_ENDED

        if not self._exited.is_set():
            self.job.stop(PARENT_ENDED)
            deadline = time.monotonic() + EXIT_WAIT_S
            while not self._exited.wait(POLL_S) and time.monotonic() < deadline:
                pass

    def _failed(self, why: str) -> None:
        """The run ended without rank 0's result: failed, with Ray's reason, in the store too."""
        job = self.job
        message = f"failed at step {job.snapshot().step}: {why}"
        if job.store is not None and job.run_id is not None:
            try:
                if job.store.get(job.run_id)["card"] is None:  # rank 0 saved nothing (a saved run has its card)
                    job.store.finish(job.run_id, "failed", None, {}, message=message + _kept(job))
            except Exception as e:  # noqa: BLE001 -- the store's own error is part of the message
                message += f"; the run store could not record it: {_first_line(e)}"
        job.publish(status="failed", message=message + _kept(job))

    def _amend(self, why: str) -> None:
        """Rank 0 recorded the run, but Ray knows more (which worker died, how): a failed run's
        message says it instead of rank 0's broken collective, and what was kept."""
        job = self.job
        snap = job.snapshot()
        if snap.status != "failed":
            message = f"{snap.message}; {why}"
        else:
            has = False
            if job.store is not None and job.run_id is not None:
                try:
                    has = job.store.get(job.run_id)["has_weights"]
                except Exception:  # noqa: BLE001 -- the store's state is said by what follows
                    pass
            kept = "its last good weights are kept" if has else _kept(job).lstrip("; ")
            message = f"failed at step {snap.step}: {why}" + (f"; {kept}" if kept else "")
        if job.store is not None and job.run_id is not None:
            try:
                row = job.store.get(job.run_id)
                job.store.finish(job.run_id, row["status"], None, {}, message=message, summary=row["summary"])
            except Exception:  # noqa: BLE001 -- the recorded run stays as rank 0 wrote it
                pass
        job.publish(message=message)


def check_workers(job, address: str | None = None) -> None:
    """Refuse, in one sentence and before anything starts, a run on workers that could not run:
    a batch smaller than the workers, Ray missing, a cluster that cannot be reached or does not
    answer as Ray, and for a local Ray more workers (or GPUs) than this machine has."""
    from attn_core.cluster import address_of, preflight, ray_module
    from attn_core.training.scaling import check_local

    workers, batch = job.cfg.workers, job.train_cfg.batch_size
    if batch < workers:
        raise ValueError(
            f"a batch of {batch} sequences cannot be split over {workers} workers; give --batch-size {workers} or more"
        )
    preflight(address)
    if address_of(address) is None and not ray_module().is_initialized():  # a local Ray will start
        import torch

        check_local(workers, job.cfg.gpus_per_worker, torch.cuda.device_count())


def _kept(job) -> str:
    return "; what it saved (checkpoints, the metric log) is kept" if job.run_id is not None else ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _on_node(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=True)


def _trainer(cfg, config: dict, storage: str):
    """Ray Train V2's TorchTrainer of ``cfg.workers`` workers running ``train_loop(config)``."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from attn_core.distributed.grace import grace_callback
    from attn_core.distributed.rank import train_loop

    grace = grace_callback()

    return TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=cfg.workers,
            use_gpu=bool(cfg.gpus_per_worker),
            resources_per_worker=worker_resources(cfg.gpus_per_worker),
        ),
        run_config=RunConfig(
            name=f"attn-lab-retrain-{os.getpid()}-{time.monotonic_ns()}",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=0),  # a worker that dies fails the run
            callbacks=[grace] if grace is not None else None,
        ),
    )


def _fit(trainer, result: dict) -> None:
    """``trainer.fit()`` (in a thread of its own); a failure's reason into ``result``."""
    try:
        trainer.fit()
    except Exception as e:  # noqa: BLE001 -- Ray Train's error, said in the run's message
        result["error"] = failure_text(e)


def failure_text(e: BaseException) -> str:
    """Ray Train's failure as one line: which worker failed and how (it died: its pid and Ray's exit
    type; an error: its last line)."""
    failures = getattr(e, "worker_failures", None)
    if failures:
        said = {rank: _cause(err) for rank, err in sorted(failures.items())}
        died = {rank: why for rank, why in said.items() if why.startswith("died")}
        # the others' broken collectives follow from a death: the death is the reason
        return "; ".join(f"worker {rank} {why}" for rank, why in (died or said).items())
    return _cause(e)


def _cause(e: BaseException) -> str:
    text = str(e).strip()
    if type(e).__name__ == "ActorDiedError" or "actor died" in text.lower():
        pid = re.search(r"\bpid: (\d+)", text)
        exit_type = re.search(r"exit type: (\w+)", text)
        how = ", ".join(filter(None, [pid and f"pid {pid[1]}", exit_type and f"exit type {exit_type[1]}"]))
        return f"died ({how})" if how else "died"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # an error of the training function ends with its traceback's last line; Ray's own starts with it
    line = (lines[-1] if "Traceback" in text else lines[0]) if lines else ""
    return f"failed: {line[:300] or type(e).__name__}"
