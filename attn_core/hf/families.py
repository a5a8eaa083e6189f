"""Tensor layouts of the families read here, mapped onto our parameter names (row vectors:
``W_Q[h]`` is [d_model, d_head], ``W_O[h]`` is [d_head, d_model]). ``nn.Linear`` stores
[out, in], so its weight is transposed; GPT-2's Conv1D is [in, out] already (``hf/gpt2.py``).

- GPT-NeoX (Pythia): ``attention.query_key_value`` is per head [q | k | v] along its output,
  i.e. [h, 3, d_head, d_model]; ``dense`` is W_O; the MLP is ``dense_h_to_4h`` / ``dense_4h_to_h``;
  the unembedding ``embed_out`` (untied unless tie_word_embeddings).
- Llama, Mistral, Qwen2: ``q_proj`` [h d_head, d], ``k_proj``/``v_proj`` [g d_head, d] (grouped),
  ``o_proj`` [d, h d_head]; biases on q/k/v when the family has them (Qwen2 always, Llama with
  attention_bias, which also biases o_proj); the MLP is gate/up/down; ``lm_head`` or the tied
  embedding. The unembedding has no bias: b_U = 0.

Every tensor is read with the shape config.json implies for it (``Get``), so a tensor of another
shape (or 1-D with as many values) is refused by name before it is used.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_core.model import ModelConfig

# get(name, shape): tensor ``name`` as float32 once its shape is checked against ``shape``, the
# shape config.json implies in the file's own layout (hf/folder.py's Tensors.get)
Get = Callable[[str, tuple[int, ...]], torch.Tensor]


def _linear_heads(W: torch.Tensor, n: int, dh: int) -> torch.Tensor:
    """A Linear weight [n dh, d] as per-head row-vector weights [n, d, dh]."""
    return W.reshape(n, dh, -1).transpose(1, 2)


def gpt_neox(cfg: ModelConfig, get: Get, has: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    h, d, dh, f, V = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp, cfg.d_vocab
    p = "gpt_neox."
    out = {"embed.W_E": get(p + "embed_in.weight", (V, d))}
    for l in range(cfg.n_layers):
        s, q = f"{p}layers.{l}.", f"blocks.{l}."
        qkv = get(s + "attention.query_key_value.weight", (3 * h * dh, d)).reshape(h, 3, dh, d)
        out[q + "attn.W_Q"], out[q + "attn.W_K"], out[q + "attn.W_V"] = (
            qkv[:, i].transpose(1, 2).contiguous() for i in range(3)
        )
        out[q + "attn.W_O"] = get(s + "attention.dense.weight", (d, h * dh)).T.reshape(h, dh, d).contiguous()
        if cfg.attn_bias:
            b = get(s + "attention.query_key_value.bias", (3 * h * dh,)).reshape(h, 3, dh)
            out[q + "attn.b_Q"], out[q + "attn.b_K"], out[q + "attn.b_V"] = (b[:, i].contiguous() for i in range(3))
            out[q + "attn.b_O"] = get(s + "attention.dense.bias", (d,))
        for ours, theirs in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
            out[q + ours + ".w"] = get(s + theirs + ".weight", (d,))
            out[q + ours + ".b"] = get(s + theirs + ".bias", (d,))
        out[q + "mlp.W_in"] = get(s + "mlp.dense_h_to_4h.weight", (f, d)).T.contiguous()
        out[q + "mlp.b_in"] = get(s + "mlp.dense_h_to_4h.bias", (f,))
        out[q + "mlp.W_out"] = get(s + "mlp.dense_4h_to_h.weight", (d, f)).T.contiguous()
        out[q + "mlp.b_out"] = get(s + "mlp.dense_4h_to_h.bias", (d,))
    out["ln_final.w"] = get(p + "final_layer_norm.weight", (d,))
    out["ln_final.b"] = get(p + "final_layer_norm.bias", (d,))
    head = "embed_out.weight" if has("embed_out.weight") else p + "embed_in.weight"
    out["unembed.W_U"] = get(head, (V, d)).T.contiguous()
    out["unembed.b_U"] = out["unembed.W_U"].new_zeros(V)
    return out


def llama(cfg: ModelConfig, get: Get, has: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """Llama, Mistral and Qwen2 share this layout."""
    h, g, d, dh, f, V = cfg.n_heads, cfg.kv_heads, cfg.d_model, cfg.d_head, cfg.d_mlp, cfg.d_vocab
    p = "model."
    out = {"embed.W_E": get(p + "embed_tokens.weight", (V, d))}
    for l in range(cfg.n_layers):
        s, q = f"{p}layers.{l}.", f"blocks.{l}."
        a = s + "self_attn."
        out[q + "attn.W_Q"] = _linear_heads(get(a + "q_proj.weight", (h * dh, d)), h, dh).contiguous()
        out[q + "attn.W_K"] = _linear_heads(get(a + "k_proj.weight", (g * dh, d)), g, dh).contiguous()
        out[q + "attn.W_V"] = _linear_heads(get(a + "v_proj.weight", (g * dh, d)), g, dh).contiguous()
        out[q + "attn.W_O"] = get(a + "o_proj.weight", (d, h * dh)).T.reshape(h, dh, d).contiguous()
        if cfg.attn_bias:
            out[q + "attn.b_Q"] = get(a + "q_proj.bias", (h * dh,)).reshape(h, dh)
            out[q + "attn.b_K"] = get(a + "k_proj.bias", (g * dh,)).reshape(g, dh)
            out[q + "attn.b_V"] = get(a + "v_proj.bias", (g * dh,)).reshape(g, dh)
            out[q + "attn.b_O"] = (
                get(a + "o_proj.bias", (d,)) if has(a + "o_proj.bias") else out[q + "attn.W_O"].new_zeros(d)
            )
        out[q + "ln1.w"] = get(s + "input_layernorm.weight", (d,))
        out[q + "ln2.w"] = get(s + "post_attention_layernorm.weight", (d,))
        m = s + "mlp."
        for ours, theirs, shape in (
            ("gate", "gate_proj", (f, d)),
            ("in", "up_proj", (f, d)),
            ("out", "down_proj", (d, f)),
        ):
            out[f"{q}mlp.W_{ours}"] = get(m + theirs + ".weight", shape).T.contiguous()
            bias = m + theirs + ".bias"
            out[f"{q}mlp.b_{ours}"] = get(bias, shape[:1]) if has(bias) else out[f"{q}mlp.W_{ours}"].new_zeros(shape[0])
    out["ln_final.w"] = get(p + "norm.weight", (d,))
    head = "lm_head.weight" if has("lm_head.weight") else p + "embed_tokens.weight"
    out["unembed.W_U"] = get(head, (V, d)).T.contiguous()
    out["unembed.b_U"] = out["unembed.W_U"].new_zeros(V)
    return out


CONVERTERS = {"gpt_neox": gpt_neox, "llama": llama, "mistral": llama, "qwen2": llama}
