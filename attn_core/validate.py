"""One way to check a setting: config dataclasses, CLI options and widgets all validate here.

JSON and Python both let ``True`` pose as the integer 1; every integer check goes through
:func:`is_int`, which refuses it. A failed check raises ``ValueError`` whose message is one
sentence that names the setting and its allowed range.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Iterable

MAX_SEED = 2**63 - 1  # torch's generators take signed 64-bit seeds
_ASCII_DIGITS = re.compile(r"[0-9]+")


def is_int(value: object) -> bool:
    """An integer that is not a bool (numpy integers count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integral(value: object) -> object:
    """``value`` as an int when it is a 0-d integer array or tensor (what ``argmax()`` of a torch
    tensor or ``np.array(1)`` gives: one integer, not a bool), else ``value`` unchanged. Every
    index check (a layer, a head, a query, a token id) takes it through here first, so such a
    value counts as the integer it holds rather than being refused as out of range."""
    if is_int(value) or isinstance(value, bool) or getattr(value, "ndim", None) != 0:
        return value
    dtype = getattr(value, "dtype", None)
    if dtype is None or getattr(dtype, "is_floating_point", False) or getattr(dtype, "is_complex", False):
        return value
    if str(dtype).rsplit(".", 1)[-1] == "bool" or getattr(dtype, "kind", "i") not in "iu":
        return value
    try:
        return int(value)
    except (TypeError, ValueError, RuntimeError):
        return value


def whole_number(text: str, max_digits: int = 19) -> int | None:
    """``text`` as an int when it is a whole number written in ASCII digits 0-9 (at most
    ``max_digits`` of them), else None. ``str.isdigit`` accepts "²" and other digits that
    ``int()`` then refuses with Python's own message; every parse of a typed number or a number
    in a name goes through here."""
    text = str(text)
    return int(text) if 0 < len(text) <= max_digits and _ASCII_DIGITS.fullmatch(text) else None


def is_number(value: object) -> bool:
    """A finite real number that is not a bool (an integer too large for a float is not one)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # 10**400: no float holds it
        return False


def is_real(value: object) -> bool:
    """A real number that is not a bool; NaN and infinities count (a measurement may be NaN)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def shown(value: object, most: int = 60) -> str:
    """``repr(value)`` for a one-line message, cut to ``most`` characters: a 5000-character string
    or a 400-digit number is named, not echoed."""
    try:
        text = repr(value)
    except ValueError:  # an int too large for repr (sys.set_int_max_str_digits)
        return f"an integer of more than {most} digits"
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters)"


def check(ok: bool, message: str, prefix: str = "") -> None:
    """Raise ``ValueError(prefix + message)`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{prefix}{message}")


def check_int(name: str, value: object, lo: int | None = None, hi: int | None = None, prefix: str = "") -> int:
    """``value`` as an int when it is an integer in ``lo..hi`` (either bound optional)."""
    span = _span(lo, hi)
    value = integral(value)
    check(
        is_int(value) and (lo is None or value >= lo) and (hi is None or value <= hi),
        f"{name} must be an integer{span}, got {shown(value)}",
        prefix,
    )
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """``value`` when it is True or False (a numpy bool too); a TypeError naming ``name`` else
    (``"no"`` is truthy, and 2 is no switch)."""
    if isinstance(value, bool) or type(value).__name__ == "bool" and type(value).__module__ == "numpy":
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {shown(value)}")


def check_seed(name: str, value: object, prefix: str = "") -> int:
    """A seed: an integer in 0..2^63-1, what torch's generators take (a larger one would fail
    deep inside torch with "Overflow when unpacking long long")."""
    return check_int(name, value, 0, MAX_SEED, prefix)


def short_list(items: Iterable, first: int = 5) -> str:
    """A list for a one-line message: every item when there are few, else the count and the
    first few (``'x', 'y', 'z' and 42997 more``)."""
    items = list(items)
    shown = ", ".join(repr(v)[:40] for v in items[:first])
    return shown if len(items) <= first else f"{shown} and {len(items) - first} more"


def check_float(
    name: str,
    value: object,
    lo: float | None = None,
    hi: float | None = None,
    prefix: str = "",
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """``value`` as a float when it is a finite number in the interval (bounds optional; open
    where ``lo_open``/``hi_open``)."""
    ok = is_number(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    span = (
        ""
        if lo is None and hi is None
        else f" in {left}{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}{right}"
    )
    check(ok, f"{name} must be a finite number{span}, got {shown(value)}", prefix)
    return float(value)


def _span(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f" in {lo}..{hi}"
    if lo is not None:
        return f" >= {lo}"
    if hi is not None:
        return f" <= {hi}"
    return ""


def default(config: type, name: str) -> object:
    """The default of field ``name`` of the dataclass ``config``: a CLI option or a widget whose
    setting lives in a config reads its default from there instead of restating it."""
    for f in dataclasses.fields(config):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise ValueError(f"{config.__name__}.{name} has no default")
    raise ValueError(f"{config.__name__} has no field {name!r}")
