"""The one caching rule of the dashboard (docs/architecture.md): a model is cached by its source
and its weights file's modification time (``ui.models.load_model``); anything computed from a
model by its plain inputs, the model counting by its weights key, never by object identity (an
id() is reused once the object is garbage collected)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import streamlit as st


def _is_model(value: Any) -> bool:
    # Duck-typed: after Streamlit reloads attn_core, models are instances of a new LoadedModel class.
    return hasattr(value, "key") and hasattr(value, "model") and hasattr(value, "config")


def _plain(value: Any) -> Any:
    """What a cached call is keyed by in place of ``value``: a model's weights key."""
    if _is_model(value):
        if not value.key:
            raise TypeError(f"model {value.name!r} has no weights key, so results computed from it cannot be cached")
        return ("model", value.key)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if hasattr(value, "state_dict"):
        raise TypeError(
            f"cache by plain inputs: pass the LoadedModel (keyed by its weights), not a bare {type(value).__name__}"
        )
    return value


# Pages run top to bottom on every rerun, so ``ui.cached(f)`` is called again each time; Streamlit
# reads f's source to name its cache, so the wrappers are made once per function and kept here.
_WRAPPERS: dict[tuple, Callable] = {}


def cached(fn: Callable | None = None, *, resource: bool = False, max_entries: int = 256) -> Callable:
    """Memoise a pure attn_core call by its plain inputs (numbers, strings, tokens, settings; a
    model by its weights key). The result is copied to each caller, or with ``resource=True``
    shared as is (for results that hold models, which do not pickle: nothing may mutate them)."""
    if fn is None:
        return functools.partial(cached, resource=resource, max_entries=max_entries)
    code = fn.__code__
    ident = (fn.__module__, fn.__qualname__, code.co_filename, code.co_code, resource, max_entries)
    current = [fn]  # a page's function is a new object each rerun: the wrapper calls the latest
    if ident in _WRAPPERS:
        _WRAPPERS[ident].current[0] = fn
        return _WRAPPERS[ident]

    def call(inputs, _args, _kwargs):  # keyed by ``inputs`` only: Streamlit skips _-named arguments
        return current[0](*_args, **_kwargs)

    # Streamlit names a cache by the module, qualified name and source of its function: those of fn.
    functools.update_wrapper(call, fn)
    memo = (st.cache_resource if resource else st.cache_data)(show_spinner=False, max_entries=max_entries)(call)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        inputs = (_plain(args), {k: _plain(v) for k, v in sorted(kwargs.items())})
        return memo(inputs=inputs, _args=args, _kwargs=kwargs)  # by name: fn's signature is not call's

    wrapper.clear = memo.clear
    wrapper.current = current
    _WRAPPERS[ident] = wrapper
    return wrapper
