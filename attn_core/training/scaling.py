"""How a retrain is spread over workers (``--workers N``, ``--gpus-per-worker G``, ``--strategy``):
the settings a :class:`~attn_core.training.config.JobConfig` carries and records, checked here
without torch or Ray (the CLI's help imports this). The training itself is
:mod:`attn_core.distributed.parallel` (one rank) and :mod:`attn_core.distributed.remote` (the
driver's side, Ray Train)."""

from __future__ import annotations

import math
import os

from attn_core.validate import check, is_int, is_number

STRATEGIES = ("ddp", "fsdp")
STRATEGY_HELP = (
    "ddp: every worker holds the whole model and AdamW state, gradients are averaged (the faster choice for a model "
    "that fits one device); fsdp: weights, gradients and AdamW state are sharded across the workers "
    "(torch.distributed.fsdp.fully_shard), gathered on rank 0 when a measurement, a checkpoint or the save needs them."
)
MAX_WORKERS = 4096
MAX_GPUS_PER_WORKER = 64
CPUS_PER_WORKER = 1.0  # Ray CPUs a worker reserves (its torch threads: 1)
# regularizers that read W_Q and W_K themselves, after the forward (not from its cache): FSDP has
# sharded a block's weights again by then (and gathering them for the penalty would lose its
# gradient to the block's reduce-scatter), so they train with ddp
WEIGHT_VIEWS = ("vocab", "spectrum")


def check_scaling(workers, gpus_per_worker, strategy, device: str = "auto", prefix: str = "") -> None:
    """One sentence for a bad setting: ``workers`` None (train in this process) or 1..MAX_WORKERS,
    ``gpus_per_worker`` 0 (CPU workers, gloo) or a whole number of GPUs (CUDA workers, NCCL), a
    known ``strategy``; a worker trains on the device Ray gives it, so ``device`` stays auto (or
    names that kind)."""
    check(
        workers is None or (is_int(workers) and 1 <= workers <= MAX_WORKERS),
        f"workers must be a whole number in 1..{MAX_WORKERS} (unset: train in this process), got {workers!r}",
        prefix,
    )
    check(
        is_number(gpus_per_worker)
        and math.isfinite(gpus_per_worker)
        and 0 <= gpus_per_worker <= MAX_GPUS_PER_WORKER
        and float(gpus_per_worker).is_integer(),
        f"gpus_per_worker must be a whole number in 0..{MAX_GPUS_PER_WORKER}, got {gpus_per_worker!r}",
        prefix,
    )
    check(strategy in STRATEGIES, f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}", prefix)
    if workers is None:
        check(
            not gpus_per_worker and strategy == STRATEGIES[0],
            "--gpus-per-worker and --strategy need --workers (training on Ray Train workers)",
            prefix,
        )
        return
    kind = "cuda" if gpus_per_worker else "cpu"
    check(
        device in ("auto", kind) or (kind == "cuda" and str(device).startswith("cuda:")),
        f"--device {device} does not fit {'GPU' if gpus_per_worker else 'CPU'} workers "
        f"(--gpus-per-worker {gpus_per_worker:g}): each worker trains on the device Ray gives it; leave --device auto",
        prefix,
    )


def worker_resources(gpus_per_worker: float) -> dict[str, float]:
    """What one worker reserves on the Ray cluster."""
    return {"CPU": CPUS_PER_WORKER, **({"GPU": float(gpus_per_worker)} if gpus_per_worker else {})}


def check_cluster(cluster: dict, workers: int, gpus_per_worker: float) -> None:
    """Refuse a run the Ray cluster cannot hold (``cluster``: its resources), which would
    otherwise wait for workers for ever."""
    need = {k: v * workers for k, v in worker_resources(gpus_per_worker).items()}
    short = [
        f"{need[k]:g} {k}s but the cluster has {float(cluster.get(k, 0.0)):g}"
        for k in need
        if need[k] > float(cluster.get(k, 0.0))
    ]
    if short:
        from attn_core.cluster import ClusterError

        raise ClusterError(f"{workers} workers need {'; '.join(short)} (nothing was trained)")


def local_cpus() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_local(workers: int, gpus_per_worker: float, gpus: int, cpus: int | None = None) -> None:
    """Refuse, before a local Ray starts, ``workers`` this machine cannot run: more than one per core
    it may use (``cpus``: :func:`local_cpus`), or more GPUs than it has (``gpus``). A local Ray
    would otherwise start one process per worker, however many (``--workers 1000``: hundreds of
    processes on two cores)."""
    from attn_core.cluster import ClusterError

    cpus = local_cpus() if cpus is None else cpus
    need_cpus = workers * CPUS_PER_WORKER
    if need_cpus > cpus:
        raise ClusterError(
            f"--workers {workers} needs {need_cpus:g} CPUs but this machine has {cpus} (one worker per core): "
            f"give --workers {int(cpus // CPUS_PER_WORKER) or 1} or fewer, or join a cluster with --address "
            "(nothing was trained)"
        )
    need_gpus = workers * float(gpus_per_worker or 0)
    if need_gpus > gpus:
        raise ClusterError(
            f"--workers {workers} with --gpus-per-worker {gpus_per_worker:g} needs {need_gpus:g} GPUs but this "
            f"machine has {gpus}: give --gpus-per-worker 0 (CPU workers), or join a cluster with --address "
            "(nothing was trained)"
        )


def check_specs(strategy: str, specs, kl: float = 0.0, prefix: str = "") -> None:
    """FSDP trains what reads the forward's cache (entropy, hoyer, topk, sink); what reads weights after
    the forward (vocabulary-view and spectral regularizers: W_Q and W_K; the KL term: the
    unembedding, and a starting copy of the model) trains with ddp."""
    weights = [str(s) for s in specs if s.view in WEIGHT_VIEWS] + (["--kl"] if kl else [])
    check(
        strategy != "fsdp" or not weights,
        f"--strategy fsdp cannot train {', '.join(weights)}: it reads whole weights after the forward (W_Q and W_K, "
        "or the unembedding), which FSDP keeps sharded across the workers there; use --strategy ddp",
        prefix,
    )


def workers_offer(environ=None) -> dict | None:
    """What the Retrain page offers: Ray Train workers when Ray would see more than one GPU here
    (up to one worker per GPU) or a cluster is named (``$RAY_ADDRESS``); None on a machine with
    one device or none (the run trains in one process there, as before). ``where`` says which."""
    environ = os.environ if environ is None else environ
    address = environ.get("RAY_ADDRESS")
    if address:
        return {"where": f"the Ray cluster at {address}", "max_workers": 64, "gpus": (0, 1)}
    import torch

    gpus = torch.cuda.device_count()
    if gpus > 1:
        return {"where": f"this machine's {gpus} GPUs", "max_workers": gpus, "gpus": (1,)}
    return None
