"""``--address``, which ``retrain`` and ``sweep`` take to join a Ray cluster (a place to train, not a
setting of the run: the workers' own options are the run's declared settings)."""

from __future__ import annotations

import typer

AddressOpt = typer.Option(
    None,
    "--address",
    help="Ray cluster to join: auto, HOST:PORT or ray://HOST:PORT (default: $RAY_ADDRESS, else a local Ray "
    "with one worker per core, shut down afterwards).",
)
