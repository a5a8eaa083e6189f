"""The parts of a block other than attention: the norms and the MLP."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from attn_core.model.config import ModelConfig


class LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.b = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w (Llama, Mistral, Qwen2): no centring, no bias."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.w, self.eps)


def norm(cfg: ModelConfig) -> nn.Module:
    """The model's norm: LayerNorm, RMSNorm or none (the identity)."""
    if cfg.normalization == "layernorm":
        return LayerNorm(cfg.d_model, cfg.ln_eps)
    if cfg.normalization == "rmsnorm":
        return RMSNorm(cfg.d_model, cfg.ln_eps)
    return nn.Identity()


_ACTS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}


class MLP(nn.Module):
    """act(X W_in + b_in) W_out + b_out; gated (SwiGLU):
    (act(X W_gate + b_gate) * (X W_in + b_in)) W_out + b_out. Its width is d_mlp unless given
    (a shared expert's). With ``glu_limit`` c (gpt-oss's clamped SwiGLU), gate g = min(X W_gate +
    b_gate, c), up u = clamp(X W_in + b_in, -c, c) and the hidden layer is (u + 1) g sigmoid(alpha g)."""

    def __init__(self, cfg: ModelConfig, width: int | None = None):
        super().__init__()
        self.act = _ACTS[cfg.mlp_act]
        f = cfg.d_mlp if width is None else width
        self.limit, self.alpha = cfg.glu_limit, cfg.glu_alpha
        if cfg.gated_mlp:
            self.W_gate = nn.Parameter(torch.empty(cfg.d_model, f))
            self.b_gate = nn.Parameter(torch.zeros(f))
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, f))
        self.b_in = nn.Parameter(torch.zeros(f))
        self.W_out = nn.Parameter(torch.empty(f, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = x @ self.W_in + self.b_in
        if self.limit is not None:
            gate = (x @ self.W_gate + self.b_gate).clamp(max=self.limit)
            hidden = (pre.clamp(-self.limit, self.limit) + 1) * gate * torch.sigmoid(gate * self.alpha)
        elif hasattr(self, "W_gate"):
            hidden = self.act(x @ self.W_gate + self.b_gate) * pre
        else:
            hidden = self.act(pre)
        return hidden @ self.W_out + self.b_out
