"""1 - the mass of a row's k largest weights."""

from __future__ import annotations

import torch

from attn_core import metrics
from attn_core.regularizers.kinds.base import RowMetric


def _top(p: torch.Tensor, k: int) -> torch.Tensor:
    """1 at each row's k largest entries of ``p``, 0 elsewhere."""
    return torch.zeros_like(p).scatter_(-1, p.topk(min(k, p.shape[-1]), dim=-1).indices, 1.0)


class TopK(RowMetric):
    name = "topk"

    def dense(self, p, mask, k, sink=False):
        return 1 - metrics.topk_mass(p, k, mask)

    def weights_grad(self, p, vis, n, k, sink=False):  # d(1 - top-k mass)/dp
        return -_top(p, k)

    def softmax(self, e, t, Z, log_z, n, k):
        mass = e.topk(min(k, e.shape[-1]), dim=-1).values.sum(-1) / Z
        return torch.where(n > 0, 1 - mass, torch.zeros_like(mass)), mass

    def softmax_grad(self, logp, p, n, g, x, k):  # d(top-k mass)/ds = p (1[top] - mass); the places found again
        return _top(p, k).sub_(x[..., None]).mul_(p), torch.where(n > 0, -g, torch.zeros_like(g))
