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

from attn_core.limits import MAX_STEPS
from attn_core.validate import MAX_SEED


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
    widget: dict | None = None,
) -> Any:
    """A dataclass field whose metadata declares the setting:

    - ``flag`` (``"--penalty-rows"``; a boolean ``"--compile/--no-compile"``), ``help`` and
      ``metavar``: the CLI option (None: no option, and not in the reproduce line);
    - ``bounds`` (lo, hi): the values the check accepts (None stays allowed where it is the default);
    - ``fmt``: how the reproduce line writes the value (``"g"`` for floats), ``always``: written
      even at its default, ``needs``: written only when one of these settings is set;
    - ``widget``: the page's input (``ui.widgets.setting_input``): label, help, min_value, max_value,
      step of a number, or a ``kind`` with its ``options`` shown by ``format`` or ``labels``; ``value``
      a default of the page's own; ``{braces}`` in label and help are filled in by the page;
    - ``factory``: makes the default (a mutable one), instead of ``default``.
    """
    meta = dict(flag=flag, help=help, bounds=bounds, metavar=metavar, fmt=fmt, always=always, needs=needs)
    meta["widget"] = widget
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# The settings that several commands take, each declared once: its flag, what is the same for every
# command (``fmt``: how the reproduce line writes it), and, by command, a tuple of its default, help
# and (optionally) what only that command has (bounds, flag=None: no option), where they
# genuinely differ. The commands' configs: train TrainConfig (the recipe; its options override a
# preset's), retrain JobConfig (also the sweep's), grow GrowConfig, compare-qk CompareConfig.
SHARED: dict[str, dict] = {
    "steps": dict(
        flag="--steps",
        train=(2000, "Override the preset's number of steps."),
        retrain=(300, "Training steps.", dict(bounds=(1, MAX_STEPS))),
        grow=(100, "Fine-tuning steps after growth, the same for the three methods."),
        compare=(400, "Training steps per run."),
    ),
    "seed": dict(
        flag="--seed",
        train=(0, "Override the preset's seed."),
        retrain=(0, "Seed of the training data (the run is deterministic under it).", dict(bounds=(0, MAX_SEED))),
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
    "eval_every": dict(flag=None, train=(250, ""), retrain=(100, ""), grow=(10, ""), compare=(25, "")),
    "eval_samples": dict(
        flag="--eval-samples",
        train=(512, "", dict(flag=None)),
        retrain=(256, "", dict(flag=None)),
        grow=(256, "Held-out sequences for every reported loss."),
        compare=(256, "", dict(flag=None)),
    ),
}


def shared(name: str, command: str, **extra: Any) -> Any:
    """The field of the shared setting ``name`` (:data:`SHARED`) in the config of ``command``
    (train, retrain, grow, compare): its one flag (``flag=None`` where a command takes no option of
    it), bounds and format, and that command's default and help; ``extra`` what only this command has
    (the page's widget, ``always``)."""
    entry = SHARED[name]
    if command not in entry:
        raise ValueError(f"the setting {name!r} has no declaration for the command {command!r}")
    default, help, *own = entry[command]
    common = {k: v for k, v in entry.items() if not isinstance(v, tuple)}  # the flag, the format
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
        if not meta["always"] and (empty or value == f.default):
            continue
        flag = meta["flag"].split("/")[0]
        if isinstance(value, bool):
            parts += [flag] if value else []
        elif isinstance(value, (list, tuple)):
            parts += [flag, ",".join(map(str, value))]
        else:
            said = shown.get(value, value) if isinstance(value, str) else value
            parts += [flag, shlex.quote(format(said, meta["fmt"]))]
    return parts
