"""One declaration per retrain setting. A :class:`attn_core.training.config.JobConfig` field made
with :func:`setting` carries, beside its default, the CLI flag and help of its option, the
bounds its check takes, how the reproduce line writes it, and the page widget's label, help and
bounds; the CLI options (``attn_core.cli.common.option``), the Retrain page's widgets
(``ui.settings``) and ``JobConfig.command()`` are built from it, so a setting cannot drift between
them. Torch-free (``attn-lab --help`` reads it)."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from attn_core.limits import MAX_BATCH, MAX_SAMPLES, MAX_STEPS
from attn_core.training.text_defaults import MAX_DEFAULT_BATCH, STEP_MEMORY
from attn_core.validate import MAX_SEED, check, is_int, is_number, shown


def setting(
    default: Any = None,
    flag: str | None = None,
    help: str = "",
    *,
    factory: Any = None,
    bounds: tuple[float, float] | None = None,
    metavar: str | None = None,
    fmt: str = "",
    always: bool = False,
    needs: tuple[str, ...] = (),
    empty: str | None = None,
    widget: dict | None = None,
) -> Any:
    """A dataclass field whose metadata declares the setting:

    - ``flag`` (``"--penalty-rows"``; a boolean ``"--compile/--no-compile"``), ``help`` and
      ``metavar``: the CLI option (None: no option, and not in the reproduce line);
    - ``bounds`` (lo, hi): the values the check accepts (:func:`check_bounds`; None stays allowed
      where it is the default): whole numbers where both bounds are ints, else finite numbers;
    - ``fmt``: how the reproduce line writes the value (``"g"`` for floats), ``always``: written
      even at its default, ``needs``: written only when one of these settings is set, ``empty``: how
      it writes an empty list that is not the default (None: leaves it out);
    - ``widget``: the page's input (``ui.widgets.setting_input``): label, help, min_value, max_value,
      step of a number, or a ``kind`` with its ``options`` shown by ``format`` or ``labels``; ``value``
      a default of the page's own; ``{braces}`` in label and help are filled in by the page;
    - ``factory``: makes the default (a mutable one), instead of ``default``.
    """
    meta = dict(flag=flag, help=help, bounds=bounds, metavar=metavar, fmt=fmt, always=always, needs=needs)
    meta["empty"] = empty
    meta["widget"] = widget
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


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


def declared(config: type | object, name: str) -> dict:
    """The metadata :func:`setting` declared for field ``name`` of ``config``."""
    for f in dataclasses.fields(config):
        if f.name == name:
            if "flag" not in f.metadata:
                raise ValueError(f"{type(config).__name__}.{name} is not declared with setting()")
            return dict(f.metadata)
    raise ValueError(f"no setting named {name!r}")


def flagged(config: type) -> tuple[str, ...]:
    """The settings of ``config`` that a command takes as options (declared with a flag), in
    declaration order: the order of the options and of the reproduce line."""
    return tuple(f.name for f in dataclasses.fields(config) if f.metadata.get("flag"))


def in_bounds(config: type | object, name: str, value: Any) -> bool:
    """Whether ``value`` lies in the declared bounds of ``name`` (inclusive)."""
    lo, hi = declared(config, name)["bounds"]
    return lo <= value <= hi


def check_bounds(cfg: object, names: tuple[str, ...], prefix: str = "") -> None:
    """One sentence (a ValueError naming the setting, after ``prefix``) for the first of ``names``
    whose value lies outside its declared bounds: a whole number in lo..hi where both bounds are
    ints, else a finite number in [lo, hi]; None passes where it is the default (unset)."""
    for name in names:
        lo, hi = declared(cfg, name)["bounds"]
        value = getattr(cfg, name)
        unset = next(f.default for f in dataclasses.fields(cfg) if f.name == name) is None
        if value is None and unset:
            continue
        whole = is_int(lo) and is_int(hi)
        ok = (is_int(value) if whole else is_number(value)) and lo <= value <= hi
        span = f"{_said(lo)}..{_said(hi)} (a whole number" if whole else f"in [{lo:g}, {hi:g}] (a number"
        check(ok, f"{name} must be {span}{', or unset' if unset else ''}), got {shown(value)}", prefix)


def _said(bound: int) -> str:
    """A bound as a message writes it: 2^63-1 (a power of two less one, from 2^32 on), 1,000,000
    (separators from six digits on), 4096."""
    if bound >= 2**32 and bound & (bound + 1) == 0:
        return f"2^{bound.bit_length()}-1"
    return f"{bound:,}" if bound >= 100_000 else str(bound)


def command_args(cfg: object, shown: dict[str, str] | None = None) -> list[str]:
    """The options that reproduce ``cfg``, in declaration order: each declared setting with a
    flag whose value is neither its default nor empty (or ``always``), written as its CLI option
    takes it; a string value found in ``shown`` is written as ``shown`` names it."""
    shown = shown or {}
    parts: list[str] = []
    for f in dataclasses.fields(cfg):
        meta = f.metadata
        if not meta.get("flag"):
            continue
        value = getattr(cfg, f.name)
        if meta["needs"] and not any(getattr(cfg, n) for n in meta["needs"]):
            continue
        empty = value is None or (isinstance(value, (str, list, tuple)) and not value)
        if not meta["always"] and ((empty and meta["empty"] is None) or value == f.default):
            continue
        flag = meta["flag"].split("/")[0]
        if isinstance(value, bool):
            parts += [flag] if value else []
        elif isinstance(value, (list, tuple)):  # one comma-separated option, quoted as the shell reads it back
            parts += [flag, shlex.quote(",".join(map(str, value)) or meta["empty"])]
        else:
            said = shown.get(value, value) if isinstance(value, str) else value
            parts += [flag, shlex.quote(format(said, meta["fmt"]))]
    return parts
