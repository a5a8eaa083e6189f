"""gpt-oss: grouped-query attention with q/k/v/o biases (an affine form), one learned sink logit
per head in every softmax's denominator (``self_attn.sinks``), 128-token sliding layers alternating
with full ones (``layer_types``), YaRN rotary scaling (``rope_parameters``), and a routed mixture
of experts in every layer's MLP: a router with a bias (``mlp.router``) whose top
``num_experts_per_tok`` logits are softmaxed over the chosen (our softmax over all, renormalised:
the same weights), and experts stored fused (``mlp.experts.gate_up_proj`` [E, d, 2f], gate and up
interleaved column by column, with ``gate_up_proj_bias``; ``down_proj`` [E, f, d] with its bias)
computing the clamped SwiGLU ``(up + 1) * gate * sigmoid(swiglu_alpha * gate)`` (ours:
``glu_limit``, ``glu_alpha``). ``router_aux_loss_coef`` acts only on transformers' training loss.

Where config.json leaves a field out, transformers' defaults for gpt-oss are used (layer types
alternating sliding and full from layer 0, a window of 128, YaRN with factor 32 over 4096
positions, rope_theta 150000), so that the model read is the model transformers builds."""

from __future__ import annotations

import torch

from attn_core.hf.config import decoder_config, expert_count, experts, flag, head_dim, integer, number, rope, windows
from attn_core.hf.family import Family, Slot, decoder_slots, same
from attn_core.model import ModelConfig

YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096}  # fmt: skip


def _defaults(hf: dict) -> dict:
    """config.json with transformers' gpt-oss defaults where it is silent."""
    out = dict(hf)
    n = integer(hf, "num_hidden_layers")
    if out.get("layer_types") is None:
        out["layer_types"] = ["sliding_attention" if (l + 1) % 2 else "full_attention" for l in range(n)]
    if "sliding_window" not in out:
        out["sliding_window"] = 128
    if out.get("rope_parameters") is None and out.get("rope_scaling") is None:
        out["rope_parameters"] = {**YARN, "rope_theta": out.get("rope_theta", 150000.0)}
    return out


def config(hf: dict) -> ModelConfig:
    hf = _defaults(hf)
    d_head = head_dim(hf)
    count, field = expert_count(hf)
    return decoder_config(
        hf,
        d_head=d_head,
        attn_bias=flag(hf, "attention_bias", True),
        ln_eps=number(hf, "rms_norm_eps", 1e-5, hi=1.0),
        mlp_act="silu",  # the experts' own SwiGLU; hidden_act is not read by gpt-oss
        sliding_window=windows(hf, integer(hf, "num_hidden_layers")),
        **experts(hf, field, count),
        router_renorm=True,
        router_bias=True,
        glu_limit=number(hf, "swiglu_limit", 7.0),
        glu_alpha=number(hf, "swiglu_alpha", 1.702),
        attn_sinks=True,
        **rope(hf, d_head, theta_default=150000.0),
    )


def _interleaved(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return t[..., ::2], t[..., 1::2]


def _interleave(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.stack([gate, up], dim=-1).flatten(-2)


def fused_expert_slots(cfg: ModelConfig, l: int, field: str) -> list[Slot]:
    """Layer ``l``'s router (weight and bias) and its fused experts, as our per-expert MLPs."""
    d, f, E = cfg.d_model, cfg.d_mlp, cfg.n_experts
    m, q = f"model.layers.{l}.mlp.", f"blocks.{l}.mlp."
    hint = f"config.json {field}={E} disagrees with the weights"
    ex = [f"{q}experts.{e}." for e in range(E)]

    def split_pairs(t):  # [E, ..., 2f] -> gate_0, up_0, gate_1, ...
        return [p for e in range(E) for p in _interleaved(t[e])]

    def join_pairs(ps):
        return torch.stack([_interleave(ps[2 * e], ps[2 * e + 1]) for e in range(E)])

    return [
        Slot(m + "router.weight", (q + "W_router",), (E, d), lambda t: (t.T,), lambda p: p[0].T, hint=hint),
        same(m + "router.bias", q + "b_router", (E,)),
        Slot(m + "experts.gate_up_proj", tuple(o + w for o in ex for w in ("W_gate", "W_in")), (E, d, 2 * f),
             split_pairs, join_pairs, hint=f"config.json intermediate_size={f} disagrees with the weights"),
        Slot(m + "experts.gate_up_proj_bias", tuple(o + b for o in ex for b in ("b_gate", "b_in")), (E, 2 * f),
             split_pairs, join_pairs),
        Slot(m + "experts.down_proj", tuple(o + "W_out" for o in ex), (E, f, d), lambda t: t.unbind(0), torch.stack),
        Slot(m + "experts.down_proj_bias", tuple(o + "b_out" for o in ex), (E, d), lambda t: t.unbind(0),
             torch.stack),
    ]  # fmt: skip


def slots(cfg: ModelConfig, raw: dict) -> list[Slot]:
    """The Llama-shaped attention (with o_proj's bias) and norms, each layer's sinks, and
    gpt-oss's own router and experts in place of the per-expert tensors."""
    field = expert_count(raw)[1]
    out = []
    for s in decoder_slots(cfg, o_bias=True):
        if ".mlp." in s.theirs:
            continue
        out.append(s)
        if s.theirs.endswith("self_attn.o_proj.weight"):
            l = int(s.theirs.split(".")[2])
            h = cfg.n_heads
            out.append(Slot(f"model.layers.{l}.self_attn.sinks", (f"blocks.{l}.attn.sinks",), (h,),
                            lambda t: (t,), lambda p: p[0],
                            hint=f"one sink logit per head: config.json num_attention_heads={h}"))  # fmt: skip
            out += fused_expert_slots(cfg, l, field)
    return out


FAMILY = Family("gpt_oss", config, slots)
