# TRANSITIONAL re-export: removed at integration
"""The old ``attn_core.train``: its names now live in ``attn_core.training`` (trainer, job,
telemetry, record); see docs/architecture.md."""
from attn_core.card import MEASURE_KEYS
from attn_core.training.job import FINAL_STATUSES, JOB_STATUSES, SCRATCH_PREFIX, JobConfig, Snapshot, TrainingJob
from attn_core.training.record import FLUSH_EVERY_S
from attn_core.training.telemetry import measure
from attn_core.training.trainer import (
    DIVERGENCE_FACTOR,
    EVAL_SEED_OFFSET,
    Callback,
    Diverged,
    Penalty,
    TrainConfig,
    Trainer,
    available_devices,
    evaluate,
    init_model,
    lr_factor,
    make_optimizer,
    select_device,
    train,
)

__all__ = ["DIVERGENCE_FACTOR", "EVAL_SEED_OFFSET", "FINAL_STATUSES", "FLUSH_EVERY_S", "JOB_STATUSES", "MEASURE_KEYS",
           "SCRATCH_PREFIX", "Callback", "Diverged", "JobConfig", "Penalty", "Snapshot", "TrainConfig", "Trainer",
           "TrainingJob", "available_devices", "evaluate", "init_model", "lr_factor", "make_optimizer", "measure",
           "select_device", "train"]
