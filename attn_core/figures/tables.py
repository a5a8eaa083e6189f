"""How a table writes its cells (the dashboard's tables and the figures' tables alike): a
number with at most four significant digits (``6e-14``, never ``0.00000000000006``), a missing
value as a dash (never ``None``). Numbers stay numbers where a column has no missing value, so
that it still sorts as numbers."""

from __future__ import annotations

import math
import numbers

import pandas as pd

MISSING = "—"
DIGITS = 4
NUMBER_FORMAT = f"%.{DIGITS}g"  # printf, as Streamlit's number columns take it


def missing(value) -> bool:
    """None, NaN and pandas' NA (a value a table has not got)."""
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float) and math.isnan(value)


def cell_text(value) -> str:
    """One cell as text: :data:`MISSING` for a missing value, a number with at most
    :data:`DIGITS` significant digits (an integer as it is), anything else as ``str``."""
    if missing(value):
        return MISSING
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        v = float(value)
        if math.isinf(v):
            return "∞" if v > 0 else "−∞"
        return f"{v:.{DIGITS}g}".replace("e-0", "e-").replace("e+0", "e+")
    return str(value)


def readable(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """(the table to show, its number columns to write with :data:`NUMBER_FORMAT`). A column
    with a missing value becomes text (:func:`cell_text`: numbers rounded, missing values a
    dash); a column of non-integer numbers stays numeric and is named in the list."""
    out = frame.copy()
    formatted = []
    for col in out.columns:
        values = out[col]
        if values.map(missing).any() or (values.dtype == object and values.map(_real).any()):
            out[col] = values.map(cell_text)
        elif pd.api.types.is_float_dtype(values) and not (values % 1 == 0).all():
            formatted.append(col)
    return out, formatted


def _real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
