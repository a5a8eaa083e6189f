"""A routed mixture-of-experts MLP (Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE, gpt-oss): ``n_experts`` copies of the
model's MLP (:class:`attn_core.model.layers.MLP`, gated where the model's is, with biases, and gpt-oss's clamped
SwiGLU with ``glu_limit``) and a router.

For a token x (row vector) the router's logits are ``x W_router`` ([d_model, n_experts]), plus
``b_router`` with ``router_bias``; the
scores are their softmax (over all experts) or their sigmoid (``router_scoring``), in float32;
the ``experts_per_token`` highest scores pick the experts, and with ``router_renorm`` their
scores are divided by their sum (Mixtral always; ``norm_topk_prob`` in Qwen3-MoE and OLMoE; gpt-oss's softmax
over its top logits, with its router bias, is this with ``router_renorm``). The output is
``sum_k w_k expert_k(x)``, plus, with ``d_shared``, a shared expert of that width every token
passes through (``shared``), times ``sigmoid(x W_shared_gate)`` with ``shared_gate`` (Qwen2-MoE). Ties are broken as ``torch.topk`` breaks them, as transformers does.

DeepSeek's router (V3: sigmoid scores; V2: softmax): with ``router_choice_bias`` a bias ``b_choice``
(e_score_correction_bias) is added to the scores to choose the experts, while the weights are the
scores themselves; with ``router_groups`` G the experts form G equal groups, each scored by its two
best experts' sum (``router_group_score`` "top2", V3) or its best (``"max"``, V2's
group_limited_greedy), and only the ``router_top_groups`` best groups may be chosen; the weights
(renormalised with ``router_renorm``) are multiplied by ``routed_scale``.

Every weight is trainable and the choice itself is not differentiable (as in every top-k
router): a gradient reaches the router through the chosen experts' weights w_k only.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attn_core.model.config import ModelConfig
from attn_core.model.layers import MLP


def route(
    logits: torch.Tensor, cfg: ModelConfig, choice_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts) [..., experts_per_token] of router logits [..., n_experts]. DeepSeek's
    router (module doc): ``choice_bias`` added to the scores for choosing only, the choice limited
    to the best ``router_top_groups`` of ``router_groups`` groups, the weights times ``routed_scale``."""
    x = logits.float()
    scores = torch.softmax(x, dim=-1) if cfg.router_scoring == "softmax" else torch.sigmoid(x)
    choose = scores if choice_bias is None else scores + choice_bias.float()
    if cfg.router_groups:
        grouped = choose.unflatten(-1, (cfg.router_groups, -1))
        best = grouped.topk(2, dim=-1)[0].sum(-1) if cfg.router_group_score == "top2" else grouped.amax(-1)
        kept = torch.zeros_like(best).scatter(-1, best.topk(cfg.router_top_groups, dim=-1)[1], 1.0).bool()
        choose = grouped.masked_fill(~kept[..., None], float("-inf")).flatten(-2)
    idx = torch.topk(choose, cfg.experts_per_token, dim=-1)[1]
    top = scores.gather(-1, idx)
    if cfg.router_renorm:
        top = top / top.sum(dim=-1, keepdim=True)
    if cfg.routed_scale != 1.0:
        top = top * cfg.routed_scale
    return top.to(logits.dtype), idx


class MoE(nn.Module):
    """The experts (``experts.{e}``, each an MLP) and the router ``W_router`` [d_model, n_experts]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.W_router = nn.Parameter(torch.empty(cfg.d_model, cfg.n_experts))
        if cfg.router_bias:
            self.b_router = nn.Parameter(torch.zeros(cfg.n_experts))
        if cfg.router_choice_bias:  # for choosing only: no gradient reaches it (held, not trained)
            self.b_choice = nn.Parameter(torch.zeros(cfg.n_experts))
        self.experts = nn.ModuleList(MLP(cfg) for _ in range(cfg.n_experts))
        if cfg.d_shared:
            self.shared = MLP(cfg, cfg.d_shared)
            if cfg.shared_gate:
                self.W_shared_gate = nn.Parameter(torch.empty(cfg.d_model, 1))

    def choices(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts) each token of x [..., d_model] is routed to, [..., experts_per_token]."""
        logits = x @ self.W_router
        logits = logits + self.b_router if hasattr(self, "b_router") else logits
        return route(logits, self.cfg, getattr(self, "b_choice", None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.choices(flat)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel():
                out = out.index_add(0, token, expert(flat[token]) * weights[token, slot, None])
        if hasattr(self, "shared"):
            shared = self.shared(flat)
            out = out + (
                torch.sigmoid(flat @ self.W_shared_gate) * shared if hasattr(self, "W_shared_gate") else shared
            )
        return out.reshape(x.shape)
