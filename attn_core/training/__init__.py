"""Training: the bare trainer, the live job with its snapshots, telemetry (what is measured and
how metrics are named) and recording a run in the run store. See docs/architecture.md."""
