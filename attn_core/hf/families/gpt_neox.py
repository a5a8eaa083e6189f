"""GPT-NeoX (Pythia): LayerNorm with biases, partial rotary (``rotary_pct``), parallel attention
and MLP, and one ``query_key_value`` projection laid out per head as [q | k | v]:
[h, 3, d_head, d_model] along its output."""

from __future__ import annotations

import torch

from attn_core.hf.config import activation, decoder_config, flag, head_dim, number, rope
from attn_core.hf.family import Family, Slot, out_heads, same, transposed
from attn_core.model import ModelConfig


def config(hf: dict) -> ModelConfig:
    d_head = head_dim(hf, fixed=True)
    return decoder_config(
        hf,
        d_head=d_head,
        n_kv_heads=None,
        normalization="layernorm",
        gated_mlp=False,
        attn_bias=flag(hf, "attention_bias", True),
        ln_eps=number(hf, "layer_norm_eps", 1e-5, hi=1.0),
        mlp_act=activation(hf, "hidden_act", "gelu"),
        parallel_attn=flag(hf, "use_parallel_residual", True),
        **rope(hf, d_head, 10000.0, 0.25),
    )


def _qkv(theirs: str, ours: tuple[str, ...], h: int, dh: int, rows: tuple[int, ...]) -> Slot:
    """[q | k | v] per head along the output: weights [3 h dh, d] (rows (d,)) or a bias [3 h dh]."""

    def split(t: torch.Tensor):
        t = t.reshape(h, 3, dh, *rows)
        return [t[:, i].transpose(1, 2) if rows else t[:, i] for i in range(3)]

    def join(ps):
        return torch.stack([p.transpose(1, 2) if rows else p for p in ps], dim=1).reshape(3 * h * dh, *rows)

    return Slot(theirs, ours, (3 * h * dh, *rows), split, join)


def slots(cfg: ModelConfig, raw: dict) -> list[Slot]:
    h, d, dh, f, V = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp, cfg.d_vocab
    p = "gpt_neox."
    out = [same(p + "embed_in.weight", "embed.W_E", (V, d))]
    for l in range(cfg.n_layers):
        s, q = f"{p}layers.{l}.", f"blocks.{l}."
        a = s + "attention."
        out.append(_qkv(a + "query_key_value.weight", tuple(q + f"attn.W_{x}" for x in "QKV"), h, dh, (d,)))
        out.append(out_heads(a + "dense.weight", q + "attn.W_O", h, dh, d))
        if cfg.attn_bias:
            out.append(_qkv(a + "query_key_value.bias", tuple(q + f"attn.b_{x}" for x in "QKV"), h, dh, ()))
            out.append(same(a + "dense.bias", q + "attn.b_O", (d,)))
        for ours, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
            out += [
                same(s + theirs + ".weight", q + ours + ".w", (d,)),
                same(s + theirs + ".bias", q + ours + ".b", (d,)),
            ]
        out += [
            transposed(s + "mlp.dense_h_to_4h.weight", q + "mlp.W_in", (f, d)),
            same(s + "mlp.dense_h_to_4h.bias", q + "mlp.b_in", (f,)),
            transposed(s + "mlp.dense_4h_to_h.weight", q + "mlp.W_out", (d, f)),
            same(s + "mlp.dense_4h_to_h.bias", q + "mlp.b_out", (d,)),
        ]
    out += [
        same(p + "final_layer_norm.weight", "ln_final.w", (d,)),
        same(p + "final_layer_norm.bias", "ln_final.b", (d,)),
    ]
    out.append(transposed("embed_out.weight", "unembed.W_U", (V, d)))
    return out


FAMILY = Family(
    "gpt_neox", config, slots, prefix="gpt_neox.", embed="gpt_neox.embed_in.weight", head="embed_out.weight"
)
