"""What a row metric and a spectrum term are (the classes each file of this package defines one
of), and the small arithmetic they share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

EPS = 1e-12  # metrics.hoyer's


def reduce_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the rows are reduced in: float64 stays, everything else is float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def inv_log_n(n: torch.Tensor) -> torch.Tensor:
    """1 / log n, and 0 for a row with one visible key (its normalized entropy is 0)."""
    return torch.where(n > 1, 1 / n.clamp_min(2).log(), torch.zeros_like(n))


class RowMetric(ABC):
    """A per-row metric of attention rows p (lower = more concentrated, so that it can be a
    penalty), named ``name`` as in ``specs.REGULARIZERS`` (the data view; ``vocab_<name>`` is the
    same metric on the vocabulary view). Its parts, one per way the engine computes rows:

    - :meth:`dense`: the definition on dense rows ``p`` [..., n] (from ``attn_core.metrics``);
      with ``sink`` the last column is a sink logit's outcome (every query sees it);
    - :meth:`weights_grad`: d value / d p, which the engine takes through the softmax or
      alpha-entmax Jacobian (the rows it does not compute in closed form);
    - :meth:`softmax` and :meth:`softmax_grad` (``closed_form``): the value and the number x
      its gradient needs from a block's shifted scores t = s - max, e = exp t, Z = sum e, and
      d value / d s = c P from log p, p and x;
    - :meth:`from_pass` (``flash``): the value from one fused attention pass (the rows' H and
      lse, ``flash_rows``), where ``needs`` names the pass's outputs it differentiates.

    ``from_key0``: its blocks of keys start at key 0 (it reads the first key's column). A kind
    without ``closed_form`` or ``flash`` refuses those paths by name (the engine asks the flags
    first)."""

    name: str = ""
    closed_form: bool = True
    flash: bool = False
    needs: tuple[str, ...] = ()
    from_key0: bool = False

    @abstractmethod
    def dense(self, p: torch.Tensor, mask: torch.Tensor | None, k: int, sink: bool = False) -> torch.Tensor: ...

    @abstractmethod
    def weights_grad(self, p: torch.Tensor, vis, n: torch.Tensor, k: int, sink: bool = False) -> torch.Tensor: ...

    def softmax(self, e, t, Z, log_z, n, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError(f"{self.name} has no closed form on softmax rows")

    def softmax_grad(self, logp, p, n, g, x, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError(f"{self.name} has no closed form on softmax rows")

    def from_pass(self, H, lse, learned, n, first: Callable[[], torch.Tensor]) -> torch.Tensor:
        raise ValueError(f"{self.name} is not computed from a fused attention pass")


class SpectrumTerm(ABC):
    """A penalty on the singular values of each head's B, named ``name`` as in
    ``specs.REGULARIZERS`` (the spectrum view): :meth:`value` of sigma [h, r] (descending) is [h]."""

    name: str = ""

    @abstractmethod
    def value(self, sigma: torch.Tensor) -> torch.Tensor: ...
