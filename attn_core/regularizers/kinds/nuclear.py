"""The nuclear norm of each head's B, sum_i sigma_i (a convex surrogate of its rank)."""

from __future__ import annotations

from attn_core.regularizers.kinds.base import SpectrumTerm


class Nuclear(SpectrumTerm):
    name = "nuclear"

    def value(self, sigma):
        return sigma.sum(-1)
