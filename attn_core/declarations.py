"""Settings declared once: a dataclass field made with :func:`setting` carries, beside its default,
the CLI flag and help of its option, the bounds its check takes, how the reproduce line writes it,
and the page widget's label, help and bounds. The CLI options (``attn_core.cli.common.option``), the
pages' widgets (``ui.widgets.setting_input``), the checks (:func:`check_bounds`) and the reproduce
lines (:func:`command_args`) are built from it, so a setting cannot drift between them. The run's
settings are declared in :mod:`attn_core.training.settings`; a regularizer's ``k`` in
:mod:`attn_core.regularizers.specs`. Torch-free (``attn-lab --help`` reads it)."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from attn_core.validate import check, is_int, is_number, shown


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
    - ``widget``: the page's input (``ui.widgets.setting_input``): label, help, min_value and
      max_value (by default the ``bounds``), step (and ``format`` of a float) of a number, or a
      ``kind`` (select, choice, radio, multi, check) with its ``options`` shown by ``format`` or
      ``labels``; ``value`` a default of the page's own; ``{braces}`` in label and help are filled
      in by the page;
    - ``factory``: makes the default (a mutable one), instead of ``default``.
    """
    meta = dict(flag=flag, help=help, bounds=bounds, metavar=metavar, fmt=fmt, always=always, needs=needs)
    meta["empty"] = empty
    meta["widget"] = widget
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


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
