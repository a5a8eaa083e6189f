"""1 - Hoyer's sparsity of a row, (sqrt n - |p|_1 / |p|_2) / (sqrt n - 1)."""

from __future__ import annotations

import torch

from attn_core import metrics
from attn_core.regularizers.kinds.base import EPS, RowMetric


class Hoyer(RowMetric):
    name = "hoyer"

    def dense(self, p, mask, k, sink=False):
        return 1 - metrics.hoyer(p, mask)

    def weights_grad(self, p, vis, n, k, sink=False):
        # d(|p|_1 / |p|_2)/dp = 1/|p|_2 - |p|_1 p / |p|_2^3, over sqrt(n) - 1
        l1, l2 = p.sum(-1, keepdim=True), p.pow(2).sum(-1, keepdim=True).clamp_min(EPS * EPS).sqrt()
        scale = torch.where(n > 1, 1 / (n.sqrt() - 1).clamp_min(EPS), torch.zeros_like(n))[..., None]
        return (1 / l2 - l1 * p / l2.pow(3)) * scale

    def softmax(self, e, t, Z, log_z, n, k):  # |p|_1 = 1
        q2 = ((e * e).sum(-1) / (Z * Z)).clamp_min(EPS * EPS)
        root = n.sqrt()
        value = torch.where(n > 1, 1 - (root - q2.rsqrt()) / (root - 1).clamp_min(EPS), torch.zeros_like(q2))
        return value, q2

    def softmax_grad(self, logp, p, n, g, x, k):  # d|p|_2^2/ds = 2 p (p - |p|_2^2); |p|_1 = 1 has no gradient
        root = n.sqrt()
        coef = torch.where(n > 1, -g * x.pow(-1.5) / (root - 1).clamp_min(EPS), torch.zeros_like(x))
        return (p - x[..., None]).mul_(p), coef
