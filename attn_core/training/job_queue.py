"""A :class:`~attn_core.retraining.job.TrainingJob` in the server's queue
(:mod:`attn_core.training.queue`): its entry (with what rebuilds it, as JSON, and its estimated
seconds), its wait (its status ``queued``, its message its place and a range for the wait), the
guard of its limits while it trains, its outcome written back, and its rebuilding from the entry
in a new server process."""

from __future__ import annotations

from attn_core.runs import RunStore
from attn_core.training import estimate
from attn_core.training.config import JobConfig
from attn_core.training.queue import JobQueue, device_name


def enter(job, entry: int | None, start: dict) -> int:
    """The job's entry in ``job.slots``: ``entry`` (a rebuilt job's), else a new one; ``start``:
    the arguments of ``start()`` that a rebuilt job is started with again."""
    if entry is None:
        spec = {"config": job.cfg.to_dict(), "store": str(job.store.root) if job.store else None, **start}
        device = device_name(job.device)
        entry = job.slots.ticket(
            user=job.user, kind="retrain", device=device, spec=spec, steps=job.cfg.steps, estimate_s=estimate_s(job)
        )
    if job.slots.ahead(entry):
        job._publish(status="queued", message=job.slots.describe(entry))
    return int(entry)


def run_queued(job) -> None:
    """Wait for the job's turn (in the job's thread), train, and write its outcome to the queue;
    stopped or cancelled while it waits, it ends ``stopped`` without training."""
    outcome = dict(status="failed", message="")
    ticket = job._ticket
    try:
        queued = lambda ahead: job._publish(status="queued", message=job.slots.describe(ticket))  # noqa: E731
        if job.slots.wait(ticket, job._stop.is_set, queued):
            job.slots.watch(ticket, job._limit_stop, job._done.is_set)
            try:
                job._train() if job.remote is None else job.remote.train()
            finally:
                job._done.set()
            snap = job.snapshot()
            outcome = dict(status=snap.status, message=snap.message, target=job.run_id)
            return
        why = job._stop_reason or ("stopped while queued" if job._stop.is_set() else "cancelled while queued")
        outcome = dict(status="cancelled", message=f"{why}; nothing was trained or saved")
        job._publish(status="stopped", message=outcome["message"])
        job._done.set()
    finally:
        job.slots.release(ticket, **outcome)


def estimate_s(job) -> float | None:
    """The job's estimated seconds (``training.estimate``): what the queue tells those behind it."""
    try:
        facts = getattr(job.task, "facts", None)
        block = facts["block"] if facts else job.task.seq_len
        e = estimate.run_seconds(job.model.cfg, job.cfg.steps, job.train_cfg.batch_size, block, str(job.device))
        return float(e["total_s"])
    except Exception:  # no estimate: the wait of those behind it is not said
        return None


def rebuild(cls, queue: JobQueue, entry: dict):
    """The job (of class ``cls``) of a waiting entry whose server is gone, rebuilt from its spec
    and started here: it waits for that entry and trains when its turn comes."""
    spec = entry["spec"]
    store = RunStore(spec["store"]) if spec.get("store") else False
    job = cls(JobConfig(**spec["config"]), store=store, slots=queue, user=entry["user"])
    keep = dict(threads=spec.get("threads"), address=spec.get("address"), keep_ray=spec.get("keep_ray", False))
    return job.start(process=spec.get("process", False), entry=entry["id"], **keep)
