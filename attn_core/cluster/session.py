"""How this lab starts or joins Ray, for every command that uses it (``attn-lab sweep``,
``attn-lab retrain --workers``, the Sweeps and Retrain pages): the one place.

- Ray missing, or a cluster that cannot be reached, is one sentence (:class:`ClusterError`)
  before anything starts (:func:`preflight`); so is a port that accepts a connection but does not
  answer as Ray's gRPC service within a bound (:func:`answer_bound`), an HTTP server say, and a
  ``ray://`` address without Ray's client package.
- ``address`` (``--address``: ``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``; else
  ``$RAY_ADDRESS``) joins an existing cluster, which is left at the end; without one a local Ray
  is started (``num_cpus``, default every core) and shut down by its last user, and ended with
  this process even by ``kill -9`` (:mod:`attn_core.cluster.watchdog`).
- Usage statistics are off unless the user turned them on (``RAY_USAGE_STATS_ENABLED``); Ray
  Train runs its V2 API (``RAY_TRAIN_V2_ENABLED=1``) without its Prometheus metrics; a local Ray
  also without the preemption watcher (it follows node drains of a cluster). Each is a default the
  user's own environment overrides (:data:`RAY_DEFAULTS`).
- A Ray this process already runs is shared: every user of the process (two sweeps, a sweep and
  a multi-worker retrain of the dashboard) counts, and the last one shuts it down; a Ray the
  caller started itself stays up.
- A long-lived process whose other threads go on (the dashboard's server) keeps its Ray
  (``keep``): it is shut down when the process ends (:func:`end_ray`), never between its users.
  Ray's driver cannot be shut down safely under other threads: while ``ray.shutdown()`` tears the
  core worker down, a Ray object freed by any other thread (a Streamlit script thread's garbage
  collection finds the reference cycles a Tune fit leaves, ObjectRefs among them) reaches the
  core worker that is gone, and Ray ends the whole process ("The core worker has already been
  shutdown ... The process will exit"). Every shutdown made here also collects that garbage first
  and holds automatic collection off while Ray goes down (:func:`_shutdown`).
"""

from __future__ import annotations

import atexit
import gc
import importlib.util
import logging
import os
import signal
import socket
import threading
import time
from contextlib import contextmanager
from urllib.parse import urlparse

from attn_core.cluster import watchdog

CONNECT_TIMEOUT_S = 5.0
ANSWER_S = 5.0  # seconds a cluster's port has to answer as Ray's (gRPC) service does
ANSWER_ENV = "ATTN_LAB_RAY_ANSWER_S"  # another bound, in seconds (tests use a short one)
# the start of an HTTP/2 connection (gRPC's, which Ray's GCS and its client server speak): the
# client preface and an empty SETTINGS frame; a gRPC server answers with its own SETTINGS frame
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS_FRAME = 4  # an HTTP/2 frame's type, its fourth byte
USAGE_STATS_ENV = "RAY_USAGE_STATS_ENABLED"  # off (0) unless the user sets it: the lab runs offline
# Ray's settings this lab makes unless the user's environment has them (read by Ray when it starts
# and when a TorchTrainer starts; Ray Train passes its own to its controller and workers)
RAY_DEFAULTS = {
    USAGE_STATS_ENV: "0",
    "RAY_TRAIN_V2_ENABLED": "1",  # ray.train.torch.TorchTrainer is Ray Train V2's
    "RAY_TRAIN_METRICS_ENABLED": "0",  # no Prometheus exporter to feed
}
LOCAL_DEFAULTS = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}  # one machine: no node is drained


class ClusterError(ValueError):
    """Ray is missing, or a cluster cannot be reached or lacks what was asked: one sentence."""


def ray_module():
    """The ``ray`` module, or the one-line error saying how to install it."""
    try:
        import ray
        from ray import tune  # noqa: F401
    except ImportError:
        raise ClusterError(
            "Ray is not installed: pip install 'ray[tune]' (the version is pinned in requirements.txt)"
        ) from None
    return ray


def address_of(address: str | None) -> str | None:
    """The cluster to join: ``address``, else ``$RAY_ADDRESS``, else None (a local Ray)."""
    return address or os.environ.get("RAY_ADDRESS") or None


def check_reachable(address: str) -> None:
    """A quick check of ``host:port`` / ``ray://host:port`` (``auto`` is Ray's to find): it accepts
    a connection and answers as Ray's gRPC service does within :func:`answer_bound` seconds (Ray's
    own start-up waits without a bound on a port that accepts and never answers, and fails late
    and obscurely on an HTTP server)."""
    if address == "auto":
        return
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError:  # a port that is not a number
        host = port = None
    if not host or not port:
        raise ClusterError(f"--address {address!r} is not auto, HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as sock:
            if parsed.scheme == "ray" and importlib.util.find_spec("grpc") is None:
                raise ClusterError(
                    f"--address {address} needs Ray's client package (ray:// addresses): pip install 'ray[client]', "
                    "or give the cluster's HOST:PORT"
                )
            _answers_as_ray(sock, address)
    except UnicodeError:  # a part over 63 characters, an empty one: the IDNA codec's error
        shown = host if len(host) <= 40 else host[:40] + "..."
        raise ClusterError(
            f"--address: {shown!r} is not a host name (each dot-separated part of a name is 1 to 63 characters)"
        ) from None
    except OSError as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def answer_bound() -> float:
    """Seconds a cluster's port has to answer (:data:`ANSWER_ENV`, else :data:`ANSWER_S`)."""
    try:
        bound = float(os.environ.get(ANSWER_ENV, ANSWER_S))
    except ValueError:
        return ANSWER_S
    return bound if 0 < bound < float("inf") else ANSWER_S


def _answers_as_ray(sock: socket.socket, address: str) -> None:
    """Open an HTTP/2 connection on ``sock`` and wait (bounded) for the server's SETTINGS frame, as
    Ray's GCS and client server (gRPC) send at once. Skipped under TLS (``RAY_USE_TLS``)."""
    if os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true"):
        return
    bound = answer_bound()
    deadline = time.monotonic() + bound
    sock.sendall(HTTP2_PREFACE)
    head = b""
    while len(head) < 9:  # an HTTP/2 frame header
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            chunk = sock.recv(9 - len(head))
        except TimeoutError:
            raise ClusterError(
                f"{address} accepted a connection but did not answer as a Ray cluster within {bound:g} s "
                "(is it the head node's GCS port, 6379 by default?)"
            ) from None
        if not chunk:
            break
        head += chunk
    if len(head) < 9 or head[3] != SETTINGS_FRAME:
        http = head.startswith((b"HTTP/", b"<"))  # a status line, or HTTP/0.9's bare page of an error
        raise ClusterError(
            f"{address} is not a Ray cluster: it answered "
            + ("as an HTTP server does" if http else "but not as Ray's gRPC service does")
            + " (is it the head node's GCS port, 6379 by default?)"
        )


def preflight(address: str | None = None) -> None:
    """Raise the one-line :class:`ClusterError` now if Ray is missing or the cluster is unreachable."""
    ray = ray_module()
    address = address_of(address)
    if address and not ray.is_initialized():
        check_reachable(address)


def settings(local: bool) -> None:
    """Make this lab's Ray settings (:data:`RAY_DEFAULTS`) where the user made none."""
    for key, value in {**RAY_DEFAULTS, **(LOCAL_DEFAULTS if local else {})}.items():
        os.environ.setdefault(key, value)


class _NotMainThread(logging.Filter):
    """Ray warns that it cannot set its SIGTERM handler when a job's thread starts it (a retrain
    on workers starts Ray from its thread): expected, and this lab ends its Ray itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


# The Ray this process started (or the cluster it joined), shared by every user of the process that
# runs while it is up (the dashboard can start a second sweep, or a retrain on workers, while the
# first runs): it is shut down when the last of them ends, never under another one, or (``keep``)
# when the process ends. The lock also makes two users starting at once start one Ray.
_LOCK = threading.Lock()
_OURS: dict = {"users": 0, "guard": None, "ours": False, "keep": False, "at_exit": False, "keeper": None}


def ray_users() -> int:
    """How many users of this process use the Ray it started (0: none started, or it ended)."""
    with _LOCK:
        return _OURS["users"]


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None, *, keep: bool = False):
    """Ray for the length of a sweep or a retrain; yields a dict (ray_version, address, started,
    shared, cluster: its resources).

    Ray already initialised in this process is used as it is: when this process started it (for
    another user still running, or kept: ``shared``), this one counts as one more of its users and
    the last user shuts it down; a Ray the caller started stays up. Otherwise, without ``address``
    (or ``$RAY_ADDRESS``) a local Ray is started with ``num_cpus`` (default every core) and shut
    down at the end; with one, the cluster is joined (and left at the end). ``keep``: this process
    lives on with other threads (the dashboard's server), so the Ray it started or joined stays up
    after its last user, for the next one, until the process ends (:func:`end_ray`): a shutdown
    under the server's other threads could end the server (see the module's notes)."""
    ray = ray_module()
    address = address_of(address)
    settings(local=not address)
    started = shared = False
    with _LOCK:
        if _OURS["ours"] and not ray.is_initialized():  # someone shut our Ray down: it is no longer ours
            watchdog.stop(_OURS["guard"])
            if _OURS["keeper"] is not None:
                _OURS["keeper"].set()
            _OURS.update(guard=None, ours=False, keep=False, keeper=None)
        if _OURS["ours"]:
            _OURS["users"] += 1
            _OURS["keep"] = _OURS["keep"] or keep
            shared = True
        elif not ray.is_initialized():
            if address:
                check_reachable(address)
            kwargs = dict(
                include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False, configure_logging=True
            )
            # a local Ray ends with this process, kill -9 included (its processes only)
            guard = None if address else watchdog.start(os.path.dirname(ray.__file__))
            quiet = _NotMainThread()
            logging.getLogger("ray._private.worker").addFilter(quiet)
            _no_failure_handler()  # this driver's SIGTERM is the command's (stop and save, exit 143)
            on_term = _sigterm_handler()  # ray.init makes SIGTERM sys.exit; the command's own (stop and save) stays
            try:
                if address:
                    ray.init(address=address, **kwargs)
                else:
                    _start_local(ray, num_cpus=num_cpus or os.cpu_count() or 1, **kwargs)
                _restore_sigterm(on_term)
            except Exception as e:  # ConnectionError, a ray:// handshake that fails, a version mismatch ...
                watchdog.stop(guard)
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ClusterError(f"cannot start or join Ray{f' at {address}' if address else ''}: {first}") from None
            finally:
                logging.getLogger("ray._private.worker").removeFilter(quiet)
            _OURS.update(users=1, guard=guard, ours=True, keep=keep)
            started = True
            if keep and not _OURS["at_exit"]:  # before Ray's own exit handler (atexit runs the last first)
                atexit.register(end_ray)
                _OURS["at_exit"] = True
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
                if _OURS["users"] == 0 and not _OURS["keep"]:
                    _shutdown(ray)


def end_ray() -> bool:
    """Shut down the Ray this process started or joined and keeps (``ray_session(keep=True)``),
    once no user of it runs; True when it did. Runs by itself as the process ends (tests call it
    to end a kept Ray); a Ray still in use is left to Ray's own exit handler and the watchdog."""
    with _LOCK:
        if not _OURS["ours"] or _OURS["users"] > 0:
            return False
        _shutdown(ray_module())
        return True


def _start_local(ray, **kwargs) -> None:
    """``ray.init`` of a local Ray. Ray starts its GCS and raylet with the kernel's parent-death
    signal (``PR_SET_PDEATHSIG``, SIGKILL), which Linux sends when the *thread* that started them
    ends, not the process. Called from a thread of its own (a sweep's, a retrain's job thread),
    ``ray.init`` runs in a thread that lives until this Ray is shut down (:func:`_shutdown`), so that
    a Ray kept for, or shared with, another user outlives the thread of the user that started it
    (it was killed as the first sweep's thread ended, and the dashboard's server with it)."""
    if threading.current_thread() is threading.main_thread():
        ray.init(**kwargs)
        return
    up, stop, failed = threading.Event(), threading.Event(), []

    def keeper() -> None:
        try:
            ray.init(**kwargs)
        except BaseException as e:  # noqa: BLE001 -- raised in the caller's thread
            failed.append(e)
        up.set()
        if not failed:
            stop.wait()

    threading.Thread(target=keeper, name="attn-lab ray", daemon=True).start()
    up.wait()
    if failed:
        raise failed[0]
    _OURS["keeper"] = stop


def _shutdown(ray) -> None:
    """``ray.shutdown()`` of the Ray this process started or joined, then its watchdog's end (the
    caller holds :data:`_LOCK`). Garbage is collected first, while the core worker is up: a Tune
    fit leaves reference cycles holding ObjectRefs, and whichever thread's collection freed them
    next (a Streamlit script thread's) during the shutdown reached the core worker being torn
    down, and Ray ended the process. Automatic collection stays off until Ray is down, so that no
    thread frees one meanwhile; the users of this Ray, the only threads holding live Ray objects,
    have all ended."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        ray.shutdown()
    finally:
        if enabled:
            gc.enable()
        watchdog.stop(_OURS["guard"])
        if _OURS["keeper"] is not None:  # the thread that started Ray ends with it
            _OURS["keeper"].set()
        _OURS.update(guard=None, ours=False, keep=False, keeper=None)


def _sigterm_handler():
    """This thread's SIGTERM handler, if it is the main thread (where handlers live)."""
    return signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None


def _restore_sigterm(handler) -> None:
    if handler is not None:
        signal.signal(signal.SIGTERM, handler)


def _no_failure_handler() -> None:
    """Ray's core installs absl's failure-signal handler in a driver as it starts, SIGTERM among its
    signals: a ``kill`` then printed a stack dump and the process aborted (SIGABRT) once the run
    was saved, instead of ending with 143. Ray's own switch (``RAY_DISABLE_FAILURE_SIGNAL_HANDLER``,
    read when Ray is imported) is set here for this process only: the workers keep theirs."""
    from ray._private import ray_constants

    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
