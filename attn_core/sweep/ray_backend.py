"""Running trials on Ray Tune, on the Ray of this process (:func:`attn_core.cluster.ray_session`
starts or joins it: the one place). Each trial is a function trainable run through
``tune.Tuner`` with ``tune.with_resources`` (CPUs and possibly fractional GPUs per trial) and an
optional ASHA scheduler. A :class:`~ray.tune.Callback` on the driver hands every trial's payload
(weights bytes + metrics, :mod:`attn_core.sweep.trial`) to ``on_payload`` as it arrives, so the
driver records results while the sweep runs."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence

from attn_core.sweep.check import check_settings

try:  # the module imports without Ray; running a sweep says how to install it (cluster.ray_module)
    from ray.tune import Callback as _Callback
    from ray.tune.stopper import Stopper as _Stopper
except ImportError:  # pragma: no cover
    _Callback = _Stopper = object
from attn_core.sweep.trial import run_trial

REPORT_FRACTION = 10  # with ASHA a trial reports its loss about 10 times
STORAGE_ENV = "ATTN_LAB_TUNE_STORAGE"  # Tune's experiment folder (default: a temporary folder, removed)
_LOCK = threading.Lock()  # the process-wide Tune settings (_tune_settings)


def _trainable(config: dict) -> None:
    """The Tune function trainable: one trial; its payload goes back in the last report.

    With ASHA a trial reports its loss every ``report_every`` steps before its last, and its last
    step only in the final report (with the payload): a trial that reaches its last step is
    recorded as trained, never as stopped early. A baseline (lambda = 0) reports nothing before
    the end, so ASHA never stops it: the sweep's comparisons and its Pareto frontier need it."""
    from ray import tune

    from attn_core.sweep.plan import Trial

    steps = int(config.get("steps") or 0)
    every = 0 if not Trial.from_dict(config["trial"]).spec else int(config.get("report_every") or 0)

    def report(step: int, latest: dict) -> None:
        if step < steps:  # the last step is the final report's
            tune.report({"step": step, "loss": float(latest.get("task_loss", float("nan"))), "final": False})

    payload = run_trial(
        config["trial"],
        config["job"],
        threads=config.get("threads") or 1,
        report=report if every else None,
        report_every=every,
        stop=_stopping,
        store_root=config.get("store_root"),
    )
    loss = (payload.get("after") or {}).get("loss")
    tune.report(
        {
            "step": int(payload.get("steps") or 0),
            "loss": float("nan") if loss is None else float(loss),
            "final": True,
            "payload": payload,
        }
    )


def _stopping() -> bool:
    """On a worker: whether Tune is stopping this trial (its session's stop event, set when the
    driver stops the experiment). Without it a stopped trial trains on until Tune kills its
    worker, 10 s later; should Ray's internals move, the trial only stops later."""
    try:
        from ray.train._internal.session import get_session

        session = get_session()
        return bool(session is not None and session.stop_event.is_set())
    except Exception:  # noqa: BLE001 -- an internal API: its absence costs time, never the trial
        return False


def run_tune(
    trials: Sequence[dict],
    job: dict,
    on_payload: Callable[[dict], None],
    *,
    steps: int,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    scheduler: str = "none",
    name: str = "attn-lab-sweep",
    stop: Callable[[], bool] | None = None,
    stopped_by: Callable[[], str] | None = None,
    cluster: dict | None = None,
    store_root: str | None = None,
) -> None:
    """Run ``trials`` (dicts of :class:`~attn_core.sweep.plan.Trial`) on the Ray of this process
    (see :func:`attn_core.cluster.ray_session`); ``on_payload(payload)`` is called on the driver once per trial,
    including the ones that fail on a worker or are stopped early by ASHA. Once ``stop()`` is
    true (Ctrl-C), Tune stops every running trial (each is handed over ``stopped``, marked
    ``interrupted`` so that a resume runs it again; ``stopped_by()`` names the stop in their
    messages) and starts no more; Tune's own SIGINT handler
    is off (the caller owns Ctrl-C). A trial on Ray Train workers (``job["workers"]``) is Ray Train
    V2's per-trial driver: it reserves no CPU (its workers reserve theirs) and as many trials run at
    once as ``cluster`` (the cluster's resources) holds their workers. ``store_root``: the run store
    whose ``run:`` and ``upload:`` models and token caches the trials read (a worker process has
    no other way to know a user's store; None: the workers' default store)."""
    from ray import tune

    check_settings(cpus_per_trial, gpus_per_trial, scheduler)
    if not trials:
        return
    job = dict(job)
    if gpus_per_trial > 0 and job.get("device", "auto") == "auto":
        job["device"] = "cuda"
    every = max(1, steps // REPORT_FRACTION) if scheduler == "asha" else 0
    sched = None
    if scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        sched = ASHAScheduler(
            time_attr="step",
            metric="loss",
            mode="min",
            max_t=steps,
            grace_period=max(1, steps // 4),
            reduction_factor=2,
        )

    resources, concurrent = trial_resources(job, cpus_per_trial, gpus_per_trial, cluster or {})
    token = next(_TOKENS)
    _SINKS[token] = on_payload
    _STOPS[token] = stop or (lambda: False)
    _CAUSES[token] = stopped_by or (lambda: "Ctrl-C")
    collect = Collect(token, steps)
    shared = os.environ.get(STORAGE_ENV)  # a multi-node cluster may need a shared folder (or s3://...)
    storage = shared or tempfile.mkdtemp(prefix="attn-lab-tune-")
    _tune_settings(+1)
    try:
        tuner = tune.Tuner(
            tune.with_resources(_trainable, resources),
            param_space={
                "trial": tune.grid_search(list(trials)),
                "job": job,
                "report_every": every,
                "steps": steps,
                "threads": max(1, int(cpus_per_trial)),
                "store_root": store_root,
            },
            tune_config=tune.TuneConfig(
                scheduler=sched,
                num_samples=1,
                trial_dirname_creator=_dirname,
                reuse_actors=True,  # a worker imports torch once, not per trial
                max_concurrent_trials=concurrent,
            ),
            run_config=tune.RunConfig(
                name=name,
                storage_path=storage,
                callbacks=[collect],
                stop=_Stop(token),
                verbose=0,
                failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
            ),
        )
        tuner.fit()
        collect.hand_over_interrupted()
    finally:
        _SINKS.pop(token, None)
        _STOPS.pop(token, None)
        _CAUSES.pop(token, None)
        _tune_settings(-1)
        if not shared:
            shutil.rmtree(storage, ignore_errors=True)


DRIVER_MEMORY = 2**28  # bytes a trial that drives Ray Train workers reserves (it reserves no CPU)


def trial_resources(job: dict, cpus: float, gpus: float, cluster: dict) -> tuple[dict, int | None]:
    """(what a trial reserves, how many trials run at once: None for no limit). A trial on Ray Train
    workers reserves a little memory and no CPU (a Tune trial must reserve something; its workers
    reserve their CPUs and GPUs), and only as many run at once as the cluster holds their workers,
    so that no trial's workers wait for another's (Ray Train V2's advice for Tune)."""
    workers = job.get("workers")
    if not workers:
        return {"cpu": cpus, "gpu": gpus}, None
    from attn_core.training.scaling import worker_resources

    need = worker_resources(float(job.get("gpus_per_worker") or 0))
    fits = [int(float(cluster.get(k, 0.0)) // (v * workers)) for k, v in need.items()]
    return {"cpu": 0, "memory": DRIVER_MEMORY}, max(1, min(fits)) if fits else None


TUNE_ENV = {  # no result files (the driver records), no SIGINT handler of Tune's (Ctrl-C is the caller's)
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "RAY_AIR_NEW_OUTPUT": "0",
    "TUNE_DISABLE_SIGINT_HANDLER": "1",
}
_TUNING: dict = {"fits": 0, "env": {}, "level": logging.NOTSET}


def _tune_settings(change: int) -> None:
    """The process-wide settings of a Tune fit: made by the first fit running, restored when the
    last ends (two sweeps at once must not restore them under each other)."""
    quiet = logging.getLogger("ray.tune")  # Tune warns that the result files it was told not to write are missing
    with _LOCK:
        _TUNING["fits"] += change
        if change > 0 and _TUNING["fits"] == 1:
            _TUNING.update(env={k: os.environ.get(k) for k in TUNE_ENV}, level=quiet.level)
            os.environ.update(TUNE_ENV)
            quiet.setLevel(logging.ERROR)
        elif change < 0 and _TUNING["fits"] == 0:
            quiet.setLevel(_TUNING["level"])
            for k, v in _TUNING["env"].items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# Tune pickles its run config, callbacks included: a callback keeps a token, and the driver's
# on_payload (which holds the run store and a lock) stays here.
_SINKS: dict[int, Callable[[dict], None]] = {}
_STOPS: dict[int, Callable[[], bool]] = {}
_CAUSES: dict[int, Callable[[], str]] = {}  # what a stop is called in the messages (Ctrl-C, SIGTERM)
_TOKENS = itertools.count()


class _Stop(_Stopper):
    """Tune's stopper: every trial stops once the driver's ``stop()`` is true (Ctrl-C)."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, trial_id, result) -> bool:
        return False

    def stop_all(self) -> bool:
        return bool(_STOPS.get(self.token, lambda: False)())


class Collect(_Callback):
    """On the driver: each trial's payload, handed over once."""

    def __init__(self, token: int, steps: int):
        self.token, self.steps = token, steps
        self.done: set[str] = set()
        self.last_step: dict[str, int] = {}
        self.started: dict[str, dict] = {}  # trial id -> the trial, once it has started

    def _interrupted(self) -> bool:
        return bool(_STOPS.get(self.token, lambda: False)())

    def _why(self, step: int) -> str:
        return _stopped(step, self.steps, _CAUSES.get(self.token, lambda: "Ctrl-C")())

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started[trial.trial_id] = trial.config["trial"]

    def hand_over_interrupted(self) -> None:
        """After a stop: each trial that started and was not handed over is, as ``stopped``."""
        for trial_id, config in list(self.started.items()):
            if trial_id not in self.done and self._interrupted():
                self.done.add(trial_id)
                step = self.last_step.get(trial_id, 0)
                _SINKS[self.token](_lost(config, "stopped", self._why(step), True))

    def _give(self, trial, payload: dict) -> None:
        if trial.trial_id in self.done:
            return
        self.done.add(trial.trial_id)
        _SINKS[self.token](payload)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.last_step[trial.trial_id] = int(result.get("step") or 0)
        if result.get("final"):
            self._give(trial, result.pop("payload", None))  # the bytes stay out of Tune's logs and state

    def on_trial_complete(self, iteration, trials, trial, **info):  # ended without a final report: ASHA
        if trial.trial_id not in self.done:
            step = self.last_step.get(trial.trial_id, 0)
            if self._interrupted():
                why = self._why(step)
            else:
                why = f"stopped early by the ASHA scheduler at step {step} of {self.steps}"
            self._give(trial, _lost(trial.config["trial"], "stopped", why, self._interrupted()))

    def on_trial_error(self, iteration, trials, trial, **info):
        if self._interrupted():  # a worker ended by the stop: a resume runs the trial again
            step = self.last_step.get(trial.trial_id, 0)
            self._give(trial, _lost(trial.config["trial"], "stopped", self._why(step), True))
            return
        err = getattr(trial, "error_message", None) or "the trial's worker failed"
        self._give(trial, _lost(trial.config["trial"], "failed", str(err).strip().splitlines()[-1][:500]))


def _stopped(step: int, steps: int, cause: str) -> str:
    return f"stopped by {cause} at step {step} of {steps}" if step else f"stopped by {cause} before it finished"


def _dirname(trial) -> str:
    return f"trial-{trial.trial_id}"


def _lost(trial: dict, status: str, message: str, interrupted: bool = False) -> dict:
    """The payload of a trial that ended without its own (no weights); ``interrupted``: stopped by
    the user, so a resume runs it again."""
    from attn_core.sweep.plan import Trial

    t = Trial.from_dict(trial)
    return {
        "key": t.key,
        "trial": t.to_dict(),
        "parent": t.source,
        "status": status,
        "message": message,
        "weights": None,
        "interrupted": interrupted,
    }
