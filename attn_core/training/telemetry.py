"""What a training run measures, and how its metrics are named.

A metric name is either a plain name (``loss``, ``accuracy``, ``entropy_data``) or a per-head
name ``<metric>:L<layer>H<head>`` with an optional index (``sigma:L0H1:3`` is the fourth
singular value of B for layer 0, head 1). :class:`MetricKey` is the one way to build and read
such names: ``str(MetricKey("sigma", 0, 1, 3)) == "sigma:L0H1:3"`` and
``MetricKey.parse("sigma:L0H1:3") == MetricKey("sigma", 0, 1, 3)``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

_NAME = re.compile(r"^(?P<metric>[a-z_0-9]+)(?::L(?P<layer>\d+)H(?P<head>\d+)(?::(?P<index>\d+))?)?$")


@dataclass(frozen=True, order=True)
class MetricKey:
    """A metric's name: ``metric``, and for a per-head metric its ``layer`` and ``head``
    (and ``index``, e.g. which singular value)."""

    metric: str
    layer: Optional[int] = None
    head: Optional[int] = None
    index: Optional[int] = None

    def __post_init__(self) -> None:
        if (self.layer is None) != (self.head is None) or (self.index is not None and self.head is None):
            raise ValueError(f"a metric key names a layer and a head together (and an index only with them), "
                             f"got {self!r}")

    @property
    def head_label(self) -> Optional[str]:
        """``L<layer>H<head>``, or None for a model-wide metric."""
        return None if self.layer is None else f"L{self.layer}H{self.head}"

    @property
    def per_head(self) -> bool:
        return self.layer is not None

    def __str__(self) -> str:
        name = self.metric if self.layer is None else f"{self.metric}:{self.head_label}"
        return name if self.index is None else f"{name}:{self.index}"

    @classmethod
    def parse(cls, name: str) -> "MetricKey":
        """The key a metric name spells; ``ValueError`` for a name no key spells."""
        m = _NAME.match(str(name))
        if m is None:
            raise ValueError(f"{name!r} is not a metric name (metric or metric:L<layer>H<head>[:<index>])")
        ints = {k: (None if m[k] is None else int(m[k])) for k in ("layer", "head", "index")}
        return cls(m["metric"], **ints)

    @classmethod
    def try_parse(cls, name: str) -> Optional["MetricKey"]:
        """:meth:`parse`, or None where ``name`` is not a metric name."""
        try:
            return cls.parse(name)
        except ValueError:
            return None
