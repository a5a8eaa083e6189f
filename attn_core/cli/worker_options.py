"""The options that put a retrain on Ray Train workers, shared by ``retrain`` and ``sweep`` (one
help text each), and ``--address``, which both take to join a Ray cluster."""

from __future__ import annotations

import typer

from attn_core.distributed.scaling import STRATEGY_HELP
from attn_core.training.config import JobConfig
from attn_core.validate import default

WorkersOpt = typer.Option(
    default(JobConfig, "workers"),
    "--workers",
    metavar="N",
    help="Train the same run on N Ray Train workers (the batch split across them, gradients averaged; rank 0 "
    "records the one run). Default: in this process, without Ray.",
)
GpusPerWorkerOpt = typer.Option(
    default(JobConfig, "gpus_per_worker"),
    "--gpus-per-worker",
    metavar="G",
    help="GPUs of each worker (CUDA, NCCL); 0: CPU workers (gloo).",
)
StrategyOpt = typer.Option(default(JobConfig, "strategy"), "--strategy", help=STRATEGY_HELP)
AddressOpt = typer.Option(
    None,
    "--address",
    help="Ray cluster to join: auto, HOST:PORT or ray://HOST:PORT (default: $RAY_ADDRESS, else a local Ray "
    "with one worker per core, shut down afterwards).",
)
