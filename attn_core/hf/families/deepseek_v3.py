"""DeepSeek-V3: multi-head latent attention (attn_core/model/mla.py) and DeepSeek's mixture of
experts.

Attention: ``q_a_proj`` [q_lora_rank, d] and ``q_a_layernorm`` (the query latent), ``q_b_proj``
[h (qk_nope_head_dim + qk_rope_head_dim), q_lora_rank] (each head's no-position rows, then its
rotary rows; ``q_proj`` from x itself when q_lora_rank is null), ``kv_a_proj_with_mqa``
[kv_lora_rank + qk_rope_head_dim, d] (the key/value latent, then the rotary key every head
shares), ``kv_a_layernorm``, ``kv_b_proj`` [h (qk_nope_head_dim + v_head_dim), kv_lora_rank]
(each head's key rows, then its value rows), ``o_proj``; the scale (qk_nope + qk_rope)^-1/2,
times mscale^2 with rope scaling (YaRN): mscale = 0.1 mscale_all_dim ln(factor) + 1, as
transformers' ``yarn_apply_mscale`` (the rotary dims carry YaRN's attention factor besides).
With ``rope_interleave`` (the default) the rotary dims are rotated in adjacent pairs (x0, x1),
(x2, x3), ...: the rotary columns are taken evens first, then odds, on load (the rotate-half
layout, the same scores) and put back on export.

MLP: the first ``first_k_dense_replace`` layers are dense (width intermediate_size); the others
have ``n_routed_experts`` experts of width moe_intermediate_size and ``n_shared_experts`` of them
as one shared expert, routed by the sigmoid of ``mlp.gate``: ``e_score_correction_bias`` added to
choose (not to weigh), the choice within the best ``topk_group`` of ``n_group`` groups (a group's
score: its two best), ``norm_topk_prob``, times ``routed_scaling_factor`` (attn_core/model/moe.py).
"""

from __future__ import annotations

import torch

from attn_core.checkpoint import CheckpointError
from attn_core.hf.config import activation, decoder_config, experts, flag, integer, mapping, number, rope
from attn_core.hf.family import Experts, Family, Slot, expert_slots, out_heads, same, transposed
from attn_core.model import ModelConfig, rotary

EXPERTS = Experts(router="gate.weight", shared="shared_experts.", field="n_routed_experts")


def _rank(hf: dict, name: str, optional: bool = False) -> int:
    if optional and hf.get(name) is None:
        return 0
    value = integer(hf, name)
    if value < 1:
        raise CheckpointError(f"config.json {name} must be a positive integer, got {value}")
    return value


def mla_fields(hf: dict) -> dict:
    """The MLA fields of a DeepSeek config.json (V2 and V3 spell them alike)."""
    h = integer(hf, "num_attention_heads")
    kv = hf.get("num_key_value_heads")
    if kv is not None and integer(hf, "num_key_value_heads") != h:
        raise CheckpointError(
            f"config.json num_key_value_heads={kv} must equal num_attention_heads={h}: MLA gives every head its own key"
        )
    if flag(hf, "attention_bias", False):
        raise CheckpointError("config.json attention_bias=true: MLA with attention biases is not supported")
    r = _rank(hf, "qk_rope_head_dim")
    if r % 2:
        raise CheckpointError(f"config.json qk_rope_head_dim={r} must be even (rotary pairs)")
    rot = rope(hf, r)
    if rot.get("rotary_dim") not in (None, r):
        raise CheckpointError(
            "config.json partial_rotary_factor must be 1 for MLA (qk_rope_head_dim is the rotary part)"
        )
    n = _rank(hf, "qk_nope_head_dim")
    return dict(
        d_head=n,
        attn_scale=(n + r) ** -0.5 * softmax_gain(hf, rot["rope_scaling"]),
        kv_lora_rank=_rank(hf, "kv_lora_rank"),
        q_lora_rank=_rank(hf, "q_lora_rank", optional=True),
        d_v=_rank(hf, "v_head_dim"),
        n_kv_heads=None,
        **{**rot, "rotary_dim": r},
    )


def shared_width(hf: dict) -> int:
    """n_shared_experts * moe_intermediate_size: the one shared expert's width (0: none)."""
    n = integer(hf, "n_shared_experts", default=0)
    if n < 0:
        raise CheckpointError(f"config.json n_shared_experts must be 0 or more, got {n}")
    return n * _rank(hf, "moe_intermediate_size")


def groups(hf: dict, E: int, k: int) -> tuple[int, int]:
    """(n_group, topk_group) of the group-limited top-k: groups that divide the experts, kept groups
    that hold the top-k."""
    G, top = _rank(hf, "n_group"), _rank(hf, "topk_group")
    if E % G:
        raise CheckpointError(f"config.json n_group={G} does not divide n_routed_experts={E}")
    if top > G:
        raise CheckpointError(f"config.json topk_group={top} is more than n_group={G}")
    if k > top * (E // G):
        raise CheckpointError(
            f"config.json num_experts_per_tok={k} is more than the experts of topk_group={top} groups"
        )
    return G, top


def dense_layers(hf: dict) -> dict:
    """The first ``first_k_dense_replace`` layers' dense MLP: ``first_dense`` and its width ``d_dense``."""
    first = integer(hf, "first_k_dense_replace", default=0)
    n_layers = integer(hf, "num_hidden_layers")
    if not 0 <= first <= n_layers:
        raise CheckpointError(f"config.json first_k_dense_replace={first} must be 0..num_hidden_layers ({n_layers})")
    return dict(first_dense=first, d_dense=integer(hf, "intermediate_size") if first else 0)


def router_fields(hf: dict) -> dict:
    """DeepSeek-V3's experts and router (module doc), each refused by its config.json name."""
    routed = experts(hf, "n_routed_experts")
    E, k = routed["n_experts"], routed["experts_per_token"]
    G, top = groups(hf, E, k)
    if E // G < 2 and G > 1:
        raise CheckpointError(f"config.json n_group={G} leaves groups of one expert; a group's score needs two")
    return dict(
        d_mlp=_rank(hf, "moe_intermediate_size"),
        **routed,
        router_scoring="sigmoid",
        router_renorm=flag(hf, "norm_topk_prob", True),
        router_groups=G if G > 1 else 0,
        router_top_groups=top if G > 1 else 0,
        router_choice_bias=True,
        routed_scale=number(hf, "routed_scaling_factor", 1.0, hi=1e6),
        d_shared=shared_width(hf),
        **dense_layers(hf),
    )


def softmax_gain(hf: dict, scaling: dict | None) -> float:
    """mscale^2, mscale = 0.1 mscale_all_dim ln(factor) + 1, on the softmax scale of every score
    when the rotary is scaled and ``mscale_all_dim`` is given (nonzero); 1.0 otherwise."""
    if scaling is None:
        return 1.0
    all_dim = 0.0
    for key in ("rope_parameters", "rope_scaling"):
        found = mapping(hf, key)
        if found.get("mscale_all_dim"):
            all_dim = number(found, "mscale_all_dim", 0.0, where=f"config.json {key}")
    return rotary.yarn_mscale(scaling["factor"], all_dim) ** 2 if all_dim else 1.0


def config(hf: dict) -> ModelConfig:
    return decoder_config(
        hf,
        **mla_fields(hf),
        ln_eps=number(hf, "rms_norm_eps", 1e-6, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "silu"),
        **router_fields(hf),
    )


def interleaved(raw: dict) -> bool:
    return flag(raw, "rope_interleave", True)


def _order(r: int, interleave: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(perm, inverse): the file's rotary columns in our rotate-half order (evens, then odds); CPU
    indices, which index a tensor on any device."""
    cpu = torch.device("cpu")
    odd_last = torch.cat([torch.arange(0, r, 2, device=cpu), torch.arange(1, r, 2, device=cpu)])
    perm = odd_last if interleave else torch.arange(r, device=cpu)
    return perm, torch.argsort(perm)


def _per_head(theirs: str, ours: tuple[str, str], h: int, widths: tuple[int, int], rank: int, perm=None, hint=""):
    """A projection [h (a + b), rank] whose rows are each head's a rows then its b rows, as our
    [h, rank, a] and [h, rank, b] (the second's columns in ``perm``'s order when given)."""
    a, b = widths
    fwd, back = perm if perm is not None else (None, None)

    def split(t):
        both = t.reshape(h, a + b, rank).transpose(1, 2)
        second = both[..., a:]
        return both[..., :a], second if fwd is None else second[..., fwd]

    def join(ps):
        second = ps[1] if back is None else ps[1][..., back]
        return torch.cat([ps[0], second], -1).transpose(1, 2).reshape(h * (a + b), rank)

    return Slot(theirs, ours, (h * (a + b), rank), split, join, hint=hint)


def attention_slots(cfg: ModelConfig, raw: dict, a: str, q: str) -> list[Slot]:
    """Layer attention ``a`` (the file's prefix) as ours ``q`` + "attn." (module doc)."""
    h, d, n, r, dv = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.rotary_dims, cfg.d_v
    rq, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
    perm = _order(r, interleaved(raw))
    o = q + "attn."
    hint_q = (f"config.json q_lora_rank={rq or 'null'}, qk_nope_head_dim={n} or qk_rope_head_dim={r} "
              "disagrees with the weights")  # fmt: skip
    hint_a = f"config.json kv_lora_rank={rkv} or qk_rope_head_dim={r} disagrees with the weights"
    hint_kv = f"config.json kv_lora_rank={rkv}, qk_nope_head_dim={n} or v_head_dim={dv} disagrees with the weights"
    out = []
    if rq:
        out += [
            Slot(a + "q_a_proj.weight", (o + "W_DQ",), (rq, d), lambda t: (t.T,), lambda p: p[0].T, hint=hint_q),
            same(a + "q_a_layernorm.weight", o + "q_latent_norm.w", (rq,)),
        ]
    name = a + ("q_b_proj.weight" if rq else "q_proj.weight")
    out.append(_per_head(name, (o + "W_UQ", o + "W_QR"), h, (n, r), rq or d, perm, hint_q))

    def split_a(t):
        return t[:rkv].T, t[rkv:].T[:, perm[0]]

    def join_a(ps):
        return torch.cat([ps[0].T, ps[1][:, perm[1]].T])

    out += [
        Slot(a + "kv_a_proj_with_mqa.weight", (o + "W_DKV", o + "W_KR"), (rkv + r, d), split_a, join_a, hint=hint_a),
        same(a + "kv_a_layernorm.weight", o + "kv_latent_norm.w", (rkv,)),
        _per_head(a + "kv_b_proj.weight", (o + "W_UK", o + "W_UV"), h, (n, dv), rkv, hint=hint_kv),
        out_heads(a + "o_proj.weight", o + "W_O", h, dv, d),
    ]
    return out


def _finite(theirs: str, ours: str, n: int) -> Slot:
    """A router bias [n], refused in one sentence naming it when a value is not finite."""

    def split(t):
        if t.device.type != "meta" and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{theirs} holds a value that is not finite (NaN or infinity)")
        return (t,)

    return Slot(theirs, (ours,), (n,), split, lambda p: p[0])


def slots(cfg: ModelConfig, raw: dict, experts: Experts = EXPERTS) -> list[Slot]:
    d, V = cfg.d_model, cfg.d_vocab
    out = [same("model.embed_tokens.weight", "embed.W_E", (V, d))]
    for l in range(cfg.n_layers):
        s, q = f"model.layers.{l}.", f"blocks.{l}."
        out += attention_slots(cfg, raw, s + "self_attn.", q)
        out += [same(s + "input_layernorm.weight", q + "ln1.w", (d,)),
                same(s + "post_attention_layernorm.weight", q + "ln2.w", (d,))]  # fmt: skip
        m = s + "mlp."
        if cfg.dense_layer(l):
            f = cfg.d_dense
            out += [transposed(m + "gate_proj.weight", q + "mlp.W_gate", (f, d)),
                    transposed(m + "up_proj.weight", q + "mlp.W_in", (f, d)),
                    transposed(m + "down_proj.weight", q + "mlp.W_out", (d, f))]  # fmt: skip
            continue
        out += expert_slots(cfg, s, q, experts)
        if cfg.router_choice_bias:
            out.append(_finite(m + "gate.e_score_correction_bias", q + "mlp.b_choice", cfg.n_experts))
    out.append(same("model.norm.weight", "ln_final.w", (d,)))
    out.append(transposed("lm_head.weight", "unembed.W_U", (V, d)))
    return out


FAMILY = Family("deepseek_v3", config, slots)
