"""The settings of a run that several commands take, each declared once (:data:`SHARED`: its flag,
format and bounds, and by command its default and help), and :func:`shared`, the field of one of
them in a command's config; the declarations themselves are :mod:`attn_core.declarations`'s
(:func:`~attn_core.declarations.setting`). The Retrain page's widgets, the CLI options and the
reproduce lines are built from them. Torch-free (``attn-lab --help`` reads it)."""

from __future__ import annotations

from typing import Any

from attn_core.declarations import setting
from attn_core.limits import MAX_BATCH, MAX_SAMPLES, MAX_STEPS
from attn_core.training.text_defaults import MAX_DEFAULT_BATCH, STEP_MEMORY
from attn_core.validate import MAX_SEED

# The settings that several commands take, each declared once: its flag, what is the same for every
# command (``fmt``: how the reproduce line writes it, ``bounds``), and, by command, a tuple of its
# default, help and (optionally) what only that command has (bounds, flag=None: no option), where
# they genuinely differ. The commands' configs: train TrainConfig (the recipe; its options override a
# preset's), retrain JobConfig (also the sweep's), grow GrowConfig (its fine-tuning), compare-qk
# CompareConfig.
SHARED: dict[str, dict] = {
    "steps": dict(
        flag="--steps",
        bounds=(1, MAX_STEPS),
        train=(2000, "Override the preset's number of steps."),
        retrain=(300, "Training steps."),
        grow=(100, "Fine-tuning steps after growth, the same for the three methods.", dict(bounds=(1, 100_000))),
        compare=(400, "Training steps per run.", dict(bounds=(1, 100_000))),
    ),
    "seed": dict(
        flag="--seed",
        bounds=(0, MAX_SEED),
        train=(0, "Override the preset's seed."),
        retrain=(0, "Seed of the training data (the run is deterministic under it)."),
        grow=(0, "Seed of the fitting batch, the fine-tuning data and the random baseline."),
    ),
    "lr": dict(
        flag="--lr",
        fmt="g",
        train=(3e-3, ""),
        retrain=(1e-3, "Peak learning rate (warmup, then cosine decay)."),
        grow=(1e-3, "Fine-tuning learning rate (AdamW, constant, no weight decay)."),
        compare=(3e-3, "Peak learning rate."),
    ),
    # the batch, the weight decay and the warmup: options of retrain and compare-qk only (the others'
    # flag is None); None in retrain: the parent's recipe, in retrain and compare-qk: warmup_of(steps)
    "batch_size": dict(
        flag="--batch-size",
        bounds=(1, MAX_BATCH),
        train=(128, "", dict(flag=None)),
        retrain=(
            None,
            "Sequences per training step. Default: the parent's training batch size; a model without one "
            f"(an imported model on --text) takes the most blocks, a power of two up to {MAX_DEFAULT_BATCH}, whose "
            f"step is estimated to add at most {STEP_MEMORY / 2**30:g} GiB (fp32): {MAX_DEFAULT_BATCH} for small "
            "vocabularies, 4 for GPT-2 small at --block 256 (the output says which).",
        ),
        grow=(32, "", dict(flag=None, bounds=(1, 4096))),
        compare=(64, "Sequences per step."),
    ),
    "weight_decay": dict(
        flag="--weight-decay",
        fmt="g",
        bounds=(0.0, 100.0),
        train=(0.1, "", dict(flag=None)),
        retrain=(None, "", dict(flag=None)),
        grow=(0.0, "", dict(flag=None)),
        compare=(0.1, "AdamW weight decay of every matrix but W_QK (W_Q and W_K included)."),
    ),
    "warmup_steps": dict(
        flag=None, bounds=(0, MAX_STEPS), train=(100, ""), retrain=(None, ""), grow=(0, ""), compare=(None, "")
    ),
    "device": dict(
        flag="--device",
        train=("auto", "auto, cpu or cuda (default: the preset's, auto)."),
        retrain=("auto", "auto, cpu or cuda."),
        grow=("cpu", "auto, cpu or cuda."),
        compare=("cpu", "cpu, cuda or auto (ms/step is measured on it)."),
    ),
    "precision": dict(
        flag="--precision",
        train=("fp32", ""),
        retrain=("fp32", "fp32, or bf16 (autocast: forward and loss in bfloat16, weights and AdamW in fp32)."),
        grow=("fp32", "Fine-tuning in fp32, or bf16 (autocast; the fit and the line search stay fp32)."),
        compare=("fp32", "fp32, or bf16 (autocast of the forward and loss; weights stay fp32)."),
    ),
    # the evaluation: an option of grow only (the others' flag is None: not an option, not in a reproduce line)
    "eval_every": dict(
        flag=None,
        bounds=(1, MAX_STEPS),
        train=(250, ""),
        retrain=(100, ""),
        grow=(10, "", dict(bounds=(1, 100_000))),
        compare=(25, ""),
    ),
    "eval_samples": dict(
        flag="--eval-samples",
        bounds=(1, MAX_SAMPLES),
        train=(512, "", dict(flag=None)),
        retrain=(256, "", dict(flag=None)),
        grow=(256, "Held-out sequences for every reported loss.", dict(bounds=(1, 65536))),
        compare=(256, "", dict(flag=None)),
    ),
}


COMMANDS = ("train", "retrain", "grow", "compare")  # the keys of a SHARED entry that are commands


def warmup_of(steps: int) -> int:
    """The warmup of a run that names none (retrain, compare-qk): a tenth of its steps, at most 100."""
    return min(100, steps // 10)


def shared(name: str, command: str, **extra: Any) -> Any:
    """The field of the shared setting ``name`` (:data:`SHARED`) in the config of ``command``
    (train, retrain, grow, compare): its one flag (``flag=None`` where a command takes no option of
    it), bounds and format, and that command's default and help; ``extra`` what only this command has
    (the page's widget, ``always``)."""
    entry = SHARED[name]
    if command not in entry:
        raise ValueError(f"the setting {name!r} has no declaration for the command {command!r}")
    default, help, *own = entry[command]
    common = {k: v for k, v in entry.items() if k not in COMMANDS}  # the flag, the format, the bounds
    own = {**common, **(own[0] if own else {}), **extra}
    return setting(default, own.pop("flag"), help, **own)
