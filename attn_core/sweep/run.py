"""A sweep from start to end: the plan is stored as a sweep in the run store, its unfinished trials
run on Ray (:mod:`attn_core.sweep.ray_backend`), and each payload that comes back is written by
this process (the driver, SQLite's single writer) as a run of the sweep. ``resume`` reruns only
the trials that have no finished run yet. :func:`sweep_result` is the CLI's and the page's view."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from attn_core.card import public
from attn_core.runs import FINAL, RunStore
from attn_core.runs.names import in_store
from attn_core.sweep.check import check_resources, check_sweep
from attn_core.sweep.line import LINE, queued_sweep_message
from attn_core.sweep.plan import SweepError, SweepInterrupted, SweepPlan, pareto
from attn_core.sweep.trial import record_trial
from attn_core.training import queue as Q

BACKEND = "ray-tune"


def finished_keys(sweep: dict) -> set[str]:
    """Trial keys of a stored sweep that already have a finished run (a trial stopped by Ctrl-C
    is not finished: a resume runs it again)."""
    return {
        r["trial"]
        for r in sweep["runs"]
        if r["status"] in FINAL and r["trial"] and not (r.get("summary") or {}).get("interrupted")
    }


def start_sweep(plan: SweepPlan, store: RunStore | None = None, *, resume: str | None = None) -> tuple[str, SweepPlan]:
    """The sweep's id and plan: a new sweep for ``plan`` once :func:`check_sweep` finds nothing a
    trial would refuse, or (``resume``) the stored one, whose plan is the stored plan (``plan``
    may then be None)."""
    store = store or RunStore()
    if resume:
        sweep = store.get_sweep(resume)
        return sweep["id"], SweepPlan.from_dict(sweep["config"])
    if plan is None:
        raise SweepError("give a sweep plan or the id of a sweep to resume")
    check_sweep(plan)
    return store.create_sweep(plan.name, plan.to_dict(), {"backend": BACKEND}), plan


def run_sweep(
    plan: SweepPlan | None,
    store: RunStore | None = None,
    *,
    resume: str | None = None,
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    scheduler: str = "none",
    on_trial: Callable[[str, dict], None] | None = None,
    sweep_id: str | None = None,
    stop: Callable[[], bool] | None = None,
    ticket: int | None = None,
    stopped_by: Callable[[], str] | None = None,
    keep_ray: bool = False,
    queue: Q.JobQueue | None = None,
    entry: int | None = None,
) -> dict:
    """Run a sweep (or ``resume`` one) on Ray and return :func:`sweep_result`.

    Nothing starts (no Ray, nothing written) unless :func:`check_sweep` passes: the model, the
    heads, every spec and the trial settings are checked first, as ``attn-lab retrain`` checks
    them; then, once Ray is up, the CPUs and GPUs a trial asks for against the cluster's
    (:func:`check_resources`). ``address`` None starts a local Ray (every core, shut down
    afterwards, and ended with this process even by ``kill -9``) unless Ray already runs in this
    process or ``$RAY_ADDRESS`` names a cluster; ``on_trial(run_id, payload)`` is called on the
    driver after each trial is recorded. ``sweep_id``: an id :func:`start_sweep` already made (the
    Sweeps page shows the sweep before Ray is up). ``stop()`` true (Ctrl-C) stops the running
    trials (recorded ``stopped``, run again by a resume) and starts no more: the sweep ends
    ``interrupted``. A trial that fails or diverges is recorded with its status and the sweep goes
    on; a sweep whose every trial failed ends ``failed``, its message saying why. One sweep runs at a
    time in a process (:mod:`attn_core.sweep.line`): the others wait, their record saying so;
    ``ticket``: a place in that line the caller took already (the Sweeps page takes it when Launch
    is pressed, so sweeps run in the order they were launched). ``stopped_by()`` names what made
    ``stop()`` true in the records' messages (the CLI: ``Ctrl-C``, ``SIGTERM`` or ``SIGHUP``).
    ``keep_ray``: the Ray this sweep starts stays up after it for the next sweep of this process, until
    the process ends (the dashboard's server, whose other threads run on: see
    :func:`attn_core.cluster.ray_session`). ``entry``: the sweep's entry in the server's job
    ``queue`` (:mod:`attn_core.training.queue`): the sweep waits for its turn there first (its
    record saying its place), its limits and a cancel stop it, and its outcome is written back."""
    from attn_core.cluster import preflight, ray_session
    from attn_core.sweep.ray_backend import run_tune

    store = store or RunStore()
    stop = stop or (lambda: False)
    cause = stopped_by or (lambda: "Ctrl-C")
    if sweep_id is not None:
        plan = SweepPlan.from_dict(store.get_sweep(sweep_id)["config"])
    elif resume:
        plan = SweepPlan.from_dict(store.get_sweep(resume)["config"])
    elif plan is None:
        raise SweepError("give a sweep plan or the id of a sweep to resume")
    lock = threading.Lock()
    errors: list[str] = []
    ran: list[dict] = []

    def on_payload(payload: dict) -> None:
        with lock:
            try:
                run_id = record_trial(store, sweep_id, payload)
            except Exception as e:  # the store refused one payload: say so, go on with the others
                errors.append(f"{payload.get('key')}: {type(e).__name__}: {e}")
                return
            ran.append(payload)
        if on_trial is not None:
            on_trial(run_id, payload)

    start = time.perf_counter()
    stack = contextlib.ExitStack()  # the sweep's place in the line, left however it ends
    # its checks read models, uploads and token caches in the sweep's store, not the caller's
    # (a thread of no session on a shared server: a sweep taken over after a restart, the page's)
    stack.enter_context(in_store(store.root))
    if ticket is not None:
        stack.callback(LINE.release, ticket)
    status, message, info, todo, began = "interrupted", "", {}, [], False
    recorded = sweep_id is not None  # the Sweeps page made the record: a refusal is written there too
    try:
        check_sweep(plan, cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial, scheduler=scheduler)
        preflight(address)  # Ray missing, a cluster unreachable: one line, before anything is written
        _not_stopped(stop, recorded, cause)
        if entry is not None:
            stop, cause = _queued(queue, entry, store, sweep_id if recorded else None, stop, cause, stack)
        if ticket is None:
            ticket = LINE.ticket()  # one Tune fit at a time in a process (attn_core.sweep.line)
            stack.callback(LINE.release, ticket)

        def waiting(ahead: int) -> None:
            if recorded:
                store.update_sweep(sweep_id, "running", queued_sweep_message(ahead))

        if not LINE.wait(ticket, stop, on_wait=waiting):
            _not_stopped(stop, recorded, cause)
            raise SweepInterrupted("stopped while it waited for another sweep of this process; nothing was run")
        with ray_session(address, keep=keep_ray) as session:
            check_resources(session["cluster"], cpus_per_trial, gpus_per_trial, plan.job)  # before any trial or record
            _not_stopped(stop, recorded, cause)
            if sweep_id is None:
                sweep_id = resume or store.create_sweep(plan.name, plan.to_dict(), {"backend": BACKEND})
                recorded = True
            began = True
            todo = [t.to_dict() for t in plan.trials if t.key not in finished_keys(store.get_sweep(sweep_id))]
            info = {
                "backend": BACKEND,
                "ray_version": session["ray_version"],
                "address": session["address"],
                "cluster_cpus": session["cluster"].get("CPU", 0.0),
                "cluster_gpus": session["cluster"].get("GPU", 0.0),
                "cpus_per_trial": cpus_per_trial,
                "gpus_per_trial": gpus_per_trial,
                "scheduler": scheduler,
                "workers_per_trial": plan.job.get("workers"),
            }
            store.update_sweep(sweep_id, "running", info=info)
            if not stop():
                run_tune(
                    todo,
                    plan.job,
                    on_payload,
                    steps=int(plan.job.get("steps", 300)),
                    cpus_per_trial=cpus_per_trial,
                    gpus_per_trial=gpus_per_trial,
                    scheduler=scheduler,
                    name=sweep_id,
                    stop=stop,
                    stopped_by=cause,
                    cluster=session["cluster"],
                    store_root=str(store.root),
                )
            status, message = _outcome(store, sweep_id, plan, ran, errors, stop(), cause)
    except BaseException as e:  # the sweep can be resumed; its record says what ended it
        message = str(e) if isinstance(e, (SweepError, ValueError)) else f"{type(e).__name__}: {e}"
        status = "interrupted" if began or isinstance(e, SweepInterrupted) else "failed"
        raise
    finally:
        stack.close()
        if entry is not None:
            queue.release(entry, status, message, target=sweep_id)
        if recorded:
            wall = time.perf_counter() - start
            store.update_sweep(
                sweep_id, status, message, info={**info, "wall_s": round(wall, 3), "last_run_trials": len(todo)}
            )
    return sweep_result(store, sweep_id)


def _queued(queue, entry: int, store, sweep_id, stop, cause, stack):
    """Wait for the sweep's turn in the server's queue, then guard it there: ``(stop, cause)``
    that also end it at its wall time limit or a cancel."""
    said = lambda _: sweep_id and store.update_sweep(sweep_id, "running", queue.describe(entry))  # noqa: E731
    if not queue.wait(entry, stop, on_wait=said):
        _not_stopped(stop, sweep_id is not None, cause)
        raise SweepInterrupted("cancelled while it waited in the server's queue; nothing was run")
    halt, why, ended = threading.Event(), [], threading.Event()
    stack.callback(ended.set)
    queue.watch(entry, lambda reason: (why.append(reason), halt.set()), ended.is_set)
    return (lambda: stop() or halt.is_set()), (lambda: why[0] if why else cause())


def rebuild(queue: Q.JobQueue, entry: dict) -> threading.Thread:
    """A waiting sweep of a server that is gone, run here in a thread from its entry's spec
    (the sweep's record and settings) when its turn comes."""
    spec = entry["spec"]
    store = RunStore(spec["store"])
    kw = dict(sweep_id=spec["sweep_id"], cpus_per_trial=float(spec.get("cpus", 1.0)), keep_ray=True)

    def work() -> None:
        with contextlib.suppress(Exception):  # the sweep's record says how it ended
            run_sweep(None, store, queue=queue, entry=entry["id"], **kw)

    thread = threading.Thread(target=work, daemon=True, name=f"attn-lab sweep {spec['sweep_id']}")
    thread.start()
    return thread


Q.register("sweep", rebuild)


def _not_stopped(stop: Callable[[], bool], recorded: bool, cause: Callable[[], str]) -> None:
    if stop() and not recorded:
        raise SweepInterrupted(f"interrupted by {cause()} before the sweep began; nothing was run or recorded")


def _outcome(
    store: RunStore,
    sweep_id: str,
    plan: SweepPlan,
    ran: list[dict],
    errors: list[str],
    stopped: bool,
    cause: Callable[[], str],
):
    """(status, message) of a sweep after a run: interrupted by a stop (``cause()``) or with trials left,
    failed when every trial of this run failed (the first reason said), else completed."""
    left = len(plan.trials) - len(finished_keys(store.get_sweep(sweep_id)))
    failed = [p for p in ran if p.get("status") == "failed"]
    if stopped:
        status = "interrupted" if left else "completed"
        message = f"stopped by {cause()}: {len(plan.trials) - left} of {len(plan.trials)} trials recorded"
    elif ran and len(failed) == len(ran):
        status = "failed"
        message = f"every trial failed ({len(failed)}); {failed[0].get('key')}: {failed[0].get('message', '')}"
    else:
        status = "completed" if left == 0 else "interrupted"
        message = f"{left} trial(s) not recorded" if left else ""
        if failed:
            message = "; ".join(filter(None, [message, f"{len(failed)} of {len(ran)} trials failed"]))
    if errors:
        message = "; ".join([message, *errors] if message else errors)
    return status, message[:2000]


def _quality(after: dict) -> float | None:
    """What the Pareto frontier maximises against data entropy: accuracy, or on text minus the
    held-out perplexity."""
    if after.get("perplexity") is not None:
        return -after["perplexity"]
    return after.get("accuracy")


def sweep_result(store: RunStore, sweep_id: str) -> dict:
    """{sweep_id, name, status, message, backend, ray_version, address, wall_s, trials: [{run_id,
    key, reg, lambda, seed, status, message, before, after}], pareto: [run_id, ...]} (trials in plan
    order; a trial that has not run yet has status ``pending`` and no run id)."""
    sweep = store.get_sweep(sweep_id)
    plan = SweepPlan.from_dict(sweep["config"])
    by_key: dict[str, dict] = {}
    for r in sweep["runs"]:  # the newest finished run of a trial wins
        if r["trial"] and (r["status"] in FINAL or r["trial"] not in by_key):
            by_key[r["trial"]] = r
    trials = []
    for t in plan.trials:
        r = by_key.get(t.key)
        summary = (r or {}).get("summary") or {}
        trials.append(
            {
                "run_id": r["id"] if r else None,
                "key": t.key,
                "source": t.source,
                "reg": t.reg,
                "lambda": t.lam,
                "seed": t.seed,
                "entmax_alpha": t.entmax_alpha,
                "status": r["status"] if r else "pending",
                "message": r["message"] if r else "",
                "has_weights": bool(r and r["has_weights"]),
                "before": public(summary.get("before")),
                "after": public(summary.get("after")),
            }
        )
    info = sweep["info"]
    front = pareto(
        (t["run_id"], _quality(t["after"]), (t["after"] or {}).get("entropy_data"))
        for t in trials
        if t["status"] == "completed" and t["after"]
    )
    return {
        "sweep_id": sweep["id"],
        "name": sweep["name"],
        "status": sweep["status"],
        "message": sweep["message"],
        "created": sweep["created"],
        "backend": info.get("backend", BACKEND),
        "ray_version": info.get("ray_version"),
        "address": info.get("address"),
        "wall_s": info.get("wall_s"),
        "job": plan.job,
        "trials": trials,
        "pareto": front,
    }
