"""The normalized entropy of a row, H(p) / log n (n: its outcomes; 0 with one)."""

from __future__ import annotations

import torch

from attn_core import metrics
from attn_core.regularizers.kinds.base import RowMetric, inv_log_n


class Entropy(RowMetric):
    name = "entropy"
    flash = True
    needs = ("entropy",)

    def dense(self, p, mask, k, sink=False):
        return metrics.normalized_entropy(p, mask)

    def weights_grad(self, p, vis, n, k, sink=False):  # d(-sum p log p)/dp = -(log p + 1) where p > 0
        return -(torch.where(p > 0, p, torch.ones_like(p)).log() + 1) * inv_log_n(n)[..., None]

    def softmax(self, e, t, Z, log_z, n, k):
        # H = log Z - sum e t / Z, never below 0 (a peaked row's terms cancel in rounding)
        H = (log_z - (e * t).sum(-1) / Z).clamp_min_(0)
        return H * inv_log_n(n), H

    def softmax_grad(self, logp, p, n, g, x, k):  # dH/ds = -p (log p + H)
        return logp.add_(x[..., None]).mul_(p), -g * inv_log_n(n)

    def from_pass(self, H, lse, learned, n, first):
        return H * inv_log_n(n)
