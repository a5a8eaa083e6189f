"""Inputs whose bounds are written once: :func:`number` gives the widget and its remembered value
(``state.remember``) the same range; :func:`setting_input` takes a setting's widget, label, help,
bounds or choices and default from its one declaration (``attn_core.declarations``): in ``JobConfig``
(a retrain, a sweep's trial), ``RegSpec`` (top-k's k), ``GrowConfig`` or ``CompareConfig``."""

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
    label: str | None = None,
    **words: str,
) -> Any:
    """The page's input of the setting ``name`` as ``config`` declares it: a number input within the
    widget's ``min_value`` and ``max_value``, else the declared bounds (a default of None, "unset",
    is the widget's lowest value; ``max_value`` the page's where the bound depends on the model or
    the page allows less than the declaration; a float input where a bound or the step is a float,
    shown with ``format``), or, by the widget's ``kind``, a ``select`` (a select slider over its
    ``options``, shown with ``format`` or ``labels``), a ``choice`` (a select box over them), a
    ``radio`` (radio buttons over them), a ``multi`` (a multiselect of several of them) or a
    ``check`` (a checkbox).
    ``options`` and ``value`` are the page's where they depend on the machine (the devices present)
    or the page runs a smaller default than the CLI; ``label`` the page's own where its input is
    narrower than the setting (a sweep's steps are per trial); ``words`` fill the declared label and
    help (a regularizer's name)."""
    declaration = declared(config, name)
    widget = declaration["widget"]
    if value is None:
        value = widget.get("value", default_of(config, name))
    kind = widget.get("kind", "number")
    said, help = (widget[k].format(**words) if words else widget[k] for k in ("label", "help"))
    label = said if label is None else label
    if kind == "check":
        return container.checkbox(label, key=remember(key, value, [False, True]), help=help)
    if kind in ("select", "choice", "radio", "multi"):
        options = list(widget["options"] if options is None else options)
        shown = {"format_func": widget["format"].format} if "format" in widget else {}
        shown = {"format_func": widget["labels"].get} if "labels" in widget else shown
        if kind == "multi":  # a list of the options: kept as it is (a list is never one of them)
            return container.multiselect(label, options, key=remember(key, list(value)), help=help, **shown)
        make = {"select": container.select_slider, "choice": container.selectbox, "radio": container.radio}[kind]
        return make(label, options, key=remember(key, value, options), help=help, **shown)
    bounds = declaration["bounds"] or (None, None)  # a number's input spans them unless its widget says
    hi = widget.get("max_value", bounds[1]) if max_value is None else max_value
    lo, step = widget.get("min_value", bounds[0]), widget["step"]
    if any(isinstance(v, float) for v in (lo, hi, step)):  # a real number: no range to remember it in
        kw = dict(min_value=float(lo), max_value=float(hi), step=float(step), format=widget.get("format"))
        return container.number_input(label, key=remember(key, float(value)), help=help, **kw)
    return number(container, label, lo, hi, key, lo if value is None else value, step, help)
