"""attn-lab's library: the toy transformer, its tasks and zoo, and the analysis of the QK
bilinear form f_x(y) = x B y^T (row vectors, docs/maths.md) with B = W_Q W_K^T / sqrt(d_head). Importable without Streamlit.
Its layers, and where a new model family, view, regularizer or page goes: docs/architecture.md.

The front door (:mod:`attn_core.api`, docs/python.md), imported on first use so that importing
the package stays light (``attn-lab --help`` loads no torch)::

    import attn_core as al
    m = al.load("induction-2l")
    m.QK[1, 0].singular_values
    al.view(m, layer=1).plot(head=0)
    al.retrain(m, reg={"entropy": 0.1}, steps=300)
    al.edit(m, "L1H0", rank=2).compare()
    al.diff(m, "run:<id>")

A subpackage is imported on first use too (``al.bilinear.qk_form``). ``al.circuits`` and
``al.dynamics`` are also the subpackages of those names, which call the front
door's functions when called (``lazy.callable_package``)."""

import importlib
import importlib.util

__version__ = "0.1.0"

API = ("Model", "HeadView", "Retrained", "load", "spectrum", "sinks", "heads", "view", "long_view", "retrain")
SURGERY = ("EditResult", "edit", "diff")  # attn_core.api_surgery
CALLABLE_PACKAGES = ("circuits", "dynamics")


def __getattr__(name: str):
    if name in API:
        value = getattr(importlib.import_module("attn_core.api"), name)
    elif name in SURGERY:
        value = getattr(importlib.import_module("attn_core.api_surgery"), name)
    elif name in CALLABLE_PACKAGES or (name.isidentifier() and not name.startswith("_") and _is_subpackage(name)):
        value = importlib.import_module(f"attn_core.{name}")  # a subpackage: al.bilinear, al.figures ...
    else:
        raise AttributeError(f"module 'attn_core' has no attribute {name!r}")
    globals()[name] = value
    return value


def _is_subpackage(name: str) -> bool:
    return importlib.util.find_spec(f"attn_core.{name}") is not None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(API) | set(SURGERY) | set(CALLABLE_PACKAGES))
