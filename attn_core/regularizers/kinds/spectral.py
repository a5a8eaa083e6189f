"""The spectral norm of each head's B, sigma_1 (sigma-Reparam's view; works against concentration)."""

from __future__ import annotations

from attn_core.regularizers.kinds.base import SpectrumTerm


class Spectral(SpectrumTerm):
    name = "spectral"

    def value(self, sigma):
        return sigma[..., 0]
