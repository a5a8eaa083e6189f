"""The sink mass of a row: the weight on the first key (where attention sinks form, Gu et al.'s
alpha_1) and, with a learned sink logit per head (gpt-oss), the weight on that logit too."""

from __future__ import annotations

import torch

from attn_core import metrics
from attn_core.regularizers.kinds.base import RowMetric


class Sink(RowMetric):
    name = "sink"
    closed_form = False  # softmax rows through the Jacobian of the weights (alpha 1)
    flash = True
    needs = ("lse",)
    from_key0 = True

    def dense(self, p, mask, k, sink=False):
        value = metrics.first_key_mass(p, mask)
        return value + p[..., -1] if sink else value

    def weights_grad(self, p, vis, n, k, sink=False):  # d p_0 / dp (the block's first column is key 0)
        v = torch.zeros_like(p)
        v[..., 0] = 1.0 if vis is None else vis[..., 0].to(p.dtype)
        if sink:  # the sink logit's share
            v[..., -1] = 1.0
        return v

    def from_pass(self, H, lse, learned, n, first):
        return first() + learned
