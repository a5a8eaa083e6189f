"""Running trials on Ray Tune: a local Ray started in this process (one worker per core, one torch
thread per trial) and shut down afterwards, or an existing cluster (``address``: ``auto``,
``host:port`` or ``ray://host:port``). Each trial is a function trainable run through
``tune.Tuner`` with ``tune.with_resources`` (CPUs and possibly fractional GPUs per trial) and an
optional ASHA scheduler. A :class:`~ray.tune.Callback` on the driver hands every trial's payload
(weights bytes + metrics, :mod:`attn_core.sweep.trial`) to ``on_payload`` as it arrives, so the
driver records results while the sweep runs."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from urllib.parse import urlparse

from attn_core.sweep import watchdog
from attn_core.sweep.check import check_settings
from attn_core.sweep.plan import SweepError

try:  # the module imports without Ray; running a sweep says how to install it (ray_module)
    from ray.tune import Callback as _Callback
    from ray.tune.stopper import Stopper as _Stopper
except ImportError:  # pragma: no cover
    _Callback = _Stopper = object
from attn_core.sweep.trial import run_trial

REPORT_FRACTION = 10  # with ASHA a trial reports its loss about 10 times
CONNECT_TIMEOUT_S = 5.0
STORAGE_ENV = "ATTN_LAB_TUNE_STORAGE"  # Tune's experiment folder (default: a temporary folder, removed)
USAGE_STATS_ENV = "RAY_USAGE_STATS_ENABLED"  # off (0) unless the user sets it: the lab runs offline


def ray_module():
    """The ``ray`` module, or the one-line error saying how to install it."""
    try:
        import ray
        from ray import tune  # noqa: F401
    except ImportError:
        raise SweepError(
            "Ray is not installed: pip install 'ray[tune]' (the version is pinned in requirements.txt)"
        ) from None
    return ray


def _check_reachable(address: str) -> None:
    """A quick TCP check of ``host:port`` / ``ray://host:port`` (``auto`` is Ray's to find)."""
    if address == "auto":
        return
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    if not parsed.hostname or not parsed.port:
        raise SweepError(f"--address {address!r} is not auto, HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise SweepError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def preflight(address: str | None = None) -> None:
    """Raise the one-line :class:`SweepError` now if Ray is missing or the cluster is unreachable."""
    ray = ray_module()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address and not ray.is_initialized():
        _check_reachable(address)


# The local Ray this process started, shared by every sweep of the process that runs while it is
# up (the dashboard can start a second sweep while the first runs): it is shut down when the last
# of them ends, never under another one. The lock also makes two sweeps starting at once start one Ray.
_LOCK = threading.Lock()
_OURS: dict = {"users": 0, "guard": None}


def ray_users() -> int:
    """How many sweeps of this process use the Ray it started (0: none started, or it ended)."""
    with _LOCK:
        return _OURS["users"]


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None):
    """Ray for the length of a sweep; yields a dict (ray_version, address, started, shared).

    Ray already initialised in this process is used as it is: when this process started it (for
    another sweep still running, ``shared``), this sweep counts as one more of its users and the last
    user shuts it down; a Ray the caller started stays up. Otherwise, without ``address`` (or
    ``$RAY_ADDRESS``) a local Ray is started with ``num_cpus`` (default every core) and shut down at
    the end; with one, the cluster is joined (and left at the end)."""
    ray = ray_module()
    address = address or os.environ.get("RAY_ADDRESS") or None
    os.environ.setdefault(USAGE_STATS_ENV, "0")  # no usage statistics unless the user asks for them
    started = shared = False
    with _LOCK:
        if _OURS["users"] > 0 and ray.is_initialized():
            _OURS["users"] += 1
            shared = True
        elif not ray.is_initialized():
            if address:
                _check_reachable(address)
            kwargs = dict(
                include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False, configure_logging=True
            )
            # a local Ray ends with this process, kill -9 included (its processes only)
            guard = None if address else watchdog.start(os.path.dirname(ray.__file__))
            on_term = _sigterm_handler()  # ray.init makes SIGTERM sys.exit; the command's own (stop and save) stays
            try:
                if address:
                    ray.init(address=address, **kwargs)
                else:
                    ray.init(num_cpus=num_cpus or os.cpu_count() or 1, **kwargs)
                _restore_sigterm(on_term)
            except Exception as e:  # ConnectionError, a ray:// handshake that fails, a version mismatch ...
                watchdog.stop(guard)
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise SweepError(f"cannot start or join Ray{f' at {address}' if address else ''}: {first}") from None
            _OURS.update(users=1, guard=guard)
            started = True
    try:
        ctx = ray.get_runtime_context()
        where = address or ("local" if started or shared else getattr(ctx, "gcs_address", "") or "local")
        yield {
            "ray_version": ray.__version__,
            "address": where,
            "started": started,
            "shared": shared,
            "cluster": ray.cluster_resources(),
        }
    finally:
        if started or shared:
            with _LOCK:
                _OURS["users"] -= 1
                if _OURS["users"] == 0:
                    ray.shutdown()
                    watchdog.stop(_OURS["guard"])
                    _OURS["guard"] = None


def _trainable(config: dict) -> None:
    """The Tune function trainable: one trial; its payload goes back in the last report."""
    from ray import tune

    every = int(config.get("report_every") or 0)

    def report(step: int, latest: dict) -> None:
        tune.report({"step": step, "loss": float(latest.get("task_loss", float("nan"))), "final": False})

    payload = run_trial(
        config["trial"],
        config["job"],
        threads=config.get("threads") or 1,
        report=report if every else None,
        report_every=every,
        stop=_stopping,
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
) -> None:
    """Run ``trials`` (dicts of :class:`~attn_core.sweep.plan.Trial`) on the Ray of this process
    (see :func:`ray_session`); ``on_payload(payload)`` is called on the driver once per trial,
    including the ones that fail on a worker or are stopped early by ASHA. Once ``stop()`` is
    true (Ctrl-C), Tune stops every running trial (each is handed over ``stopped``, marked
    ``interrupted`` so that a resume runs it again) and starts no more; Tune's own SIGINT handler
    is off (the caller owns Ctrl-C)."""
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

    token = next(_TOKENS)
    _SINKS[token] = on_payload
    _STOPS[token] = stop or (lambda: False)
    collect = Collect(token, steps)
    shared = os.environ.get(STORAGE_ENV)  # a multi-node cluster may need a shared folder (or s3://...)
    storage = shared or tempfile.mkdtemp(prefix="attn-lab-tune-")
    _tune_settings(+1)
    try:
        resources = {"cpu": cpus_per_trial, "gpu": gpus_per_trial}
        tuner = tune.Tuner(
            tune.with_resources(_trainable, resources),
            param_space={
                "trial": tune.grid_search(list(trials)),
                "job": job,
                "report_every": every,
                "threads": max(1, int(cpus_per_trial)),
            },
            tune_config=tune.TuneConfig(
                scheduler=sched, num_samples=1, trial_dirname_creator=_dirname, reuse_actors=True
            ),  # a worker imports torch once, not per trial
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
        _tune_settings(-1)
        if not shared:
            shutil.rmtree(storage, ignore_errors=True)


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

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started[trial.trial_id] = trial.config["trial"]

    def hand_over_interrupted(self) -> None:
        """After a stop: each trial that started and was not handed over is, as ``stopped``."""
        for trial_id, config in list(self.started.items()):
            if trial_id not in self.done and self._interrupted():
                self.done.add(trial_id)
                step = self.last_step.get(trial_id, 0)
                _SINKS[self.token](_lost(config, "stopped", _ctrl_c(step, self.steps), True))

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
                why = _ctrl_c(step, self.steps)
            else:
                why = f"stopped early by the ASHA scheduler at step {step} of {self.steps}"
            self._give(trial, _lost(trial.config["trial"], "stopped", why, self._interrupted()))

    def on_trial_error(self, iteration, trials, trial, **info):
        if self._interrupted():  # a worker ended by the stop: a resume runs the trial again
            step = self.last_step.get(trial.trial_id, 0)
            self._give(trial, _lost(trial.config["trial"], "stopped", _ctrl_c(step, self.steps), True))
            return
        err = getattr(trial, "error_message", None) or "the trial's worker failed"
        self._give(trial, _lost(trial.config["trial"], "failed", str(err).strip().splitlines()[-1][:500]))


def _ctrl_c(step: int, steps: int) -> str:
    return f"stopped by Ctrl-C at step {step} of {steps}" if step else "stopped by Ctrl-C before it finished"


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


def _sigterm_handler():
    import signal
    import threading

    return signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None


def _restore_sigterm(handler) -> None:
    import signal

    if handler is not None:
        signal.signal(signal.SIGTERM, handler)
