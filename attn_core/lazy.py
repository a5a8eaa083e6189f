"""Lazy package exports (PEP 562): a package lists which of its submodules holds each name it
exports, and a name is imported the first time it is read. Importing a package for its light
parts (a config dataclass, a table of names) then does not load torch, which is what lets every
``attn-lab COMMAND --help`` answer without it (``benchmarks/cli_startup.py``,
``tests/unit/test_cli_manners.py``). See docs/architecture.md ("Start-up").

    __getattr__, __dir__ = lazy.exports(__name__, {"transformer": ("Block", "Transformer"), ...})

``from package import Name`` and ``package.Name`` both work, and the name is then kept on the
package, so only its first read costs the import. A name that is also its submodule's name (the
function ``composition`` of ``circuits/composition.py``) stays the function when the submodule is
imported, as it was when the package imported it eagerly (the import system sets a package's
attribute to each submodule it loads).

A package whose name is also a function of the front door (``attn_core.circuits``, and the
function ``attn_core.circuits(model)`` of :mod:`attn_core.api`) is made callable by
:func:`callable_package`: ``from attn_core import circuits`` stays the package."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Iterable, Mapping


def exports(
    package: str, modules: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``modules`` maps each submodule (relative
    to the package) to the names it defines that the package exports lazily."""
    table = {name: submodule for submodule, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:
        try:
            submodule = table[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        try:
            module = importlib.import_module(f"{package}.{submodule}")
        except AttributeError as e:  # else Python hides it behind "cannot import name" with no cause
            raise ImportError(f"importing {package}.{submodule} failed: {e}") from e
        value = getattr(module, name)
        setattr(sys.modules[package], name, value)  # later reads find it without this hook
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    class Package(types.ModuleType):
        def __reduce__(self):  # pickled (by Ray's cloudpickle, say) as the module it is, by name
            return importlib.import_module, (self.__name__,)

        def __setattr__(self, name: str, value: object) -> None:
            if (
                table.get(name) == name
                and isinstance(value, types.ModuleType)
                and value.__name__ == f"{package}.{name}"
            ):
                value = getattr(value, name)  # the exported name, not the submodule of the same name
            super().__setattr__(name, value)

    sys.modules[package].__class__ = Package
    return __getattr__, __dir__


def callable_package(package: str, target: str) -> None:
    """Make the module ``package`` callable: calling it calls ``target`` (``"module:function"``,
    imported on the first call), so that ``al.circuits(model)`` is the front door's function
    while ``attn_core.circuits`` stays the package, whichever is imported first."""
    module = sys.modules[package]
    home, _, name = target.partition(":")

    class Callable(type(module)):
        def __call__(self, *args, **kwargs):
            return getattr(importlib.import_module(home), name)(*args, **kwargs)

        def __reduce__(self):  # pickled as the module it is, by name
            return importlib.import_module, (self.__name__,)

    Callable.__call__.__doc__ = f"{target.replace(':', '.')}: see its docstring."
    module.__class__ = Callable
