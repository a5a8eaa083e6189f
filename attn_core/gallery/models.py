"""The models a gallery draws: a zoo model, and an imported Hugging Face folder, by default a tiny
random Llama (rotary positions, grouped-query attention, a 1024-token context for the long-input
views) written here as config.json + model.safetensors, without transformers."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

LLAMA = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, intermediate_size=48)
LLAMA_VOCAB, LLAMA_CONTEXT = 100, 1024


def tiny_llama(folder: Path, seed: int = 0, **shape: int) -> Path:
    """A random Llama folder (2 layers, 4 query heads sharing 2 key/value heads, d_model 32,
    100 tokens, 1024 positions, unless ``shape`` says otherwise), weights drawn far from uniform
    attention; returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    shape = {**LLAMA, **shape}
    d, h, g, f = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"], 48
    dh = d // h
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **shape,
        "vocab_size": LLAMA_VOCAB,
        "max_position_embeddings": LLAMA_CONTEXT,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    gen = torch.Generator().manual_seed(seed)

    def w(*shape: int, std: float = 0.3) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cpu") * std  # weights written to a file

    tensors = {"model.embed_tokens.weight": w(LLAMA_VOCAB, d, std=1.0), "model.norm.weight": 1 + 0.1 * w(d)}
    for layer in range(shape["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors |= {
            p + "self_attn.q_proj.weight": w(h * dh, d),
            p + "self_attn.k_proj.weight": w(g * dh, d),
            p + "self_attn.v_proj.weight": w(g * dh, d),
            p + "self_attn.o_proj.weight": w(d, h * dh),
            p + "input_layernorm.weight": 1 + 0.1 * w(d),
            p + "post_attention_layernorm.weight": 1 + 0.1 * w(d),
            p + "mlp.gate_proj.weight": w(f, d),
            p + "mlp.up_proj.weight": w(f, d),
            p + "mlp.down_proj.weight": w(d, f),
        }
    tensors["lm_head.weight"] = w(LLAMA_VOCAB, d)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


WORDS = 99  # a word-level tokenizer's words w0 .. w98, and [UNK]


def wide_llama_on_text(folder: Path) -> tuple[Path, Path]:
    """A random Llama with 24 heads in one layer (d_model 48, 24 key/value heads) and a
    word-level tokenizer.json, and a small text of its words to retrain it on; returns (model
    folder, text file). The Retrain page's charts of many heads on text are drawn from it."""
    import random

    from tokenizers import Tokenizer, models, pre_tokenizers

    tiny_llama(folder, num_hidden_layers=1, hidden_size=48, num_attention_heads=24, num_key_value_heads=24)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(WORDS)} | {"[UNK]": WORDS}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    rng = random.Random(0)
    text = folder.parent / "text.txt"
    text.write_text("\n".join(" ".join(f"w{rng.randrange(WORDS)}" for _ in range(12)) * 2 for _ in range(300)))
    return folder, text


DEEPSEEK = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, q_lora_rank=16, kv_lora_rank=12,
                qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)  # fmt: skip


def tiny_deepseek(folder: Path, seed: int = 0) -> Path:
    """A random DeepSeek-V3 folder with multi-head latent attention (query latent 16, key/value
    latent 12, no-position dims 8, rotary dims 4, value dims 6, 4 heads, d_model 32) and dense MLPs
    (``first_k_dense_replace`` = every layer), 100 tokens, 64 positions; returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    s = DEEPSEEK
    d, h, L, f = s["hidden_size"], s["num_attention_heads"], s["num_hidden_layers"], 48
    rq, rkv, n, r, dv = (
        s[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    )
    config = {
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        **s,
        "num_key_value_heads": h,
        "intermediate_size": f,
        "moe_intermediate_size": 16,
        "n_routed_experts": 2,
        "num_experts_per_tok": 1,
        "n_group": 1,
        "topk_group": 1,
        "n_shared_experts": 0,
        "first_k_dense_replace": L,
        "vocab_size": LLAMA_VOCAB,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    gen = torch.Generator().manual_seed(seed)

    def w(*shape: int, std: float = 0.3) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cpu") * std  # weights written to a file

    tensors = {"model.embed_tokens.weight": w(LLAMA_VOCAB, d, std=1.0), "model.norm.weight": 1 + 0.1 * w(d)}
    for layer in range(L):
        p, a = f"model.layers.{layer}.", f"model.layers.{layer}.self_attn."
        tensors |= {
            a + "q_a_proj.weight": w(rq, d),
            a + "q_a_layernorm.weight": 1 + 0.1 * w(rq),
            a + "q_b_proj.weight": w(h * (n + r), rq),
            a + "kv_a_proj_with_mqa.weight": w(rkv + r, d),
            a + "kv_a_layernorm.weight": 1 + 0.1 * w(rkv),
            a + "kv_b_proj.weight": w(h * (n + dv), rkv),
            a + "o_proj.weight": w(d, h * dv),
            p + "input_layernorm.weight": 1 + 0.1 * w(d),
            p + "post_attention_layernorm.weight": 1 + 0.1 * w(d),
            p + "mlp.gate_proj.weight": w(f, d),
            p + "mlp.up_proj.weight": w(f, d),
            p + "mlp.down_proj.weight": w(d, f),
        }
    tensors["lm_head.weight"] = w(LLAMA_VOCAB, d)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder
