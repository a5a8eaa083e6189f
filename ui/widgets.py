"""Inputs whose bounds are written once: :func:`number` gives the widget and its remembered value
(``state.remember``) the same range; :func:`setting_input` takes a retrain setting's widget, label, help,
bounds or choices and default from its one declaration in ``JobConfig`` (or ``RegSpec``: top-k's k)
(``attn_core.declarations``)."""

from __future__ import annotations

from typing import Any

from attn_core.declarations import declared
from attn_core.validate import default as default_of
from ui.state import remember


def number(
    container: Any,
    label: str,
    lo: int,
    hi: int,
    key: str,
    default: int,
    step: int = 1,
    help: str | None = None,
    param: str | None = None,
) -> int:
    """An integer ``number_input`` in ``lo..hi`` whose value survives page switches (and the URL
    parameter ``param``) within the same bounds."""
    return container.number_input(
        label,
        min_value=lo,
        max_value=hi,
        step=step,
        key=remember(key, default, range(lo, hi + 1), param=param),
        help=help,
    )


def setting_input(
    container: Any,
    config: type,
    name: str,
    key: str,
    max_value: int | None = None,
    options: list | None = None,
    value: Any = None,
    **words: str,
) -> Any:
    """The page's input of the setting ``name`` as ``config`` declares it: a number input (a default
    of None, "unset", is the widget's lowest value; ``max_value`` when the bound depends on the
    model), or, by the widget's ``kind``, a ``select`` (a select slider over its ``options``, shown
    with ``format`` or ``labels``), a ``choice`` (a select box over them) or a ``check`` (a checkbox).
    ``options`` and ``value`` are the page's where they depend on the machine (the devices present);
    ``words`` fill the declared label and help (a regularizer's name)."""
    widget = declared(config, name)["widget"]
    if value is None:
        value = widget.get("value", default_of(config, name))
    kind = widget.get("kind", "number")
    label, help = (widget[k].format(**words) if words else widget[k] for k in ("label", "help"))
    if kind == "check":
        return container.checkbox(label, key=remember(key, value, [False, True]), help=help)
    if kind in ("select", "choice"):
        options = list(widget["options"] if options is None else options)
        shown = {"format_func": widget["format"].format} if "format" in widget else {}
        shown = {"format_func": widget["labels"].get} if "labels" in widget else shown
        make = container.select_slider if kind == "select" else container.selectbox
        return make(label, options, key=remember(key, value, options), help=help, **shown)
    hi = widget["max_value"] if max_value is None else max_value
    lo = widget["min_value"]
    return number(container, label, lo, hi, key, lo if value is None else value, widget["step"], help)
