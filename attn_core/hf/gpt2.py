"""GPT-2's config and tensor layout, mapped onto ours (the folder itself is read by
``hf/load.py``); :func:`from_transformers` converts a GPT-2 model object already in memory.

GPT-2 is pre-LayerNorm with learned positions, query/key/value biases (``attn_bias``) and
gelu_new (``mlp_act="gelu_tanh"``). Its Conv1D weights are ``[in, out]``, our row-vector
convention already: ``c_attn.weight`` [d, 3d] splits into W_Q, W_K, W_V and each into heads.
The unembedding is tied (W_U = W_E^T) unless the file has its own ``lm_head.weight``, with no
bias (b_U = 0). ``scale_attn_weights=False`` and ``scale_attn_by_inverse_layer_idx`` change
the scores' scale, which is folded into W_Q and b_Q, so S (and B) stay exactly the model's.
"""

from __future__ import annotations

import math

import torch

from attn_core.card import Card
from attn_core.checkpoint import CheckpointError, LoadedModel, build_checked
from attn_core.hf.config import activation, flag, integer, number
from attn_core.hf.folder import check_shape
from attn_core.model import ModelConfig

IMPORTED = "Imported from a Hugging Face checkpoint; no synthetic task."


def config_from_gpt2(hf: dict) -> ModelConfig:
    """Our ModelConfig for a GPT-2 config dict (config.json or ``GPT2Config.to_dict()``); every
    field read by type (``hf/config.py``: 32.7, "32" or 1e400 for n_embd are refused)."""
    act = activation(hf, "activation_function", "gelu_new")
    if hf.get("add_cross_attention"):
        raise CheckpointError("GPT-2 models with cross-attention are not supported")
    d, h = integer(hf, "n_embd"), integer(hf, "n_head")
    if h <= 0 or d % h:
        raise CheckpointError(f"n_embd={d} is not divisible by n_head={h}")
    for key in ("scale_attn_weights", "scale_attn_by_inverse_layer_idx"):
        flag(hf, key, False)  # read by convert; a wrong type is refused here, before any tensor
    try:
        return ModelConfig(
            n_layers=integer(hf, "n_layer"),
            n_heads=h,
            d_model=d,
            d_head=d // h,
            d_mlp=integer(hf, "n_inner", default=4 * d),
            n_ctx=integer(hf, "n_positions"),
            d_vocab=integer(hf, "vocab_size"),
            normalization="layernorm",
            positional="learned",
            qk="factored",
            attn_bias=True,
            ln_eps=number(hf, "layer_norm_epsilon", 1e-5, hi=1.0),
            mlp_act=act,
        )
    except (TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(str(e)) from None


def convert_state_dict(sd: dict[str, torch.Tensor], hf: dict) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """GPT-2 tensors (with or without the ``transformer.`` prefix) -> our config and tensors."""
    cfg = config_from_gpt2(hf)
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}

    def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in sd:
            raise CheckpointError(f"the GPT-2 checkpoint lacks tensor {name!r}")
        check_shape(name, sd[name].shape, shape)
        return sd[name].float()

    return cfg, tensors_from_gpt2(cfg, hf, get, sd.__contains__)


def tensors_from_gpt2(cfg: ModelConfig, hf: dict, get, has) -> dict[str, torch.Tensor]:
    """Our tensors from GPT-2's, read by name (without the ``transformer.`` prefix) with
    ``get(name, shape)`` (float32, its shape checked against the config's); ``has(name)`` says
    whether the file holds a tensor."""
    d, h, dh, f, V = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp, cfg.d_vocab
    out = {"embed.W_E": get("wte.weight", (V, d)), "pos_embed.W_pos": get("wpe.weight", (cfg.n_ctx, d))}
    for l in range(cfg.n_layers):
        p, q = f"h.{l}.", f"blocks.{l}."
        # Scores are q k^T * c: c = 1/sqrt(dh) normally; our model applies 1/sqrt(dh) itself,
        # so any other factor goes into the query weights and bias.
        c = 1 / math.sqrt(dh) if flag(hf, "scale_attn_weights", True) else 1.0
        if flag(hf, "scale_attn_by_inverse_layer_idx", False):
            c /= l + 1
        fold = c * math.sqrt(dh)
        W, b = get(p + "attn.c_attn.weight", (d, 3 * d)), get(p + "attn.c_attn.bias", (3 * d,))
        W_Q, W_K, W_V = (w.reshape(d, h, dh).permute(1, 0, 2) for w in W.split(d, dim=1))  # [h, d, dh]
        b_Q, b_K, b_V = (v.reshape(h, dh) for v in b.split(d))
        out.update(
            {
                q + "ln1.w": get(p + "ln_1.weight", (d,)),
                q + "ln1.b": get(p + "ln_1.bias", (d,)),
                q + "attn.W_Q": W_Q * fold,
                q + "attn.W_K": W_K,
                q + "attn.W_V": W_V,
                q + "attn.b_Q": b_Q * fold,
                q + "attn.b_K": b_K,
                q + "attn.b_V": b_V,
                q + "attn.W_O": get(p + "attn.c_proj.weight", (d, d)).reshape(h, dh, d),
                q + "attn.b_O": get(p + "attn.c_proj.bias", (d,)),
                q + "ln2.w": get(p + "ln_2.weight", (d,)),
                q + "ln2.b": get(p + "ln_2.bias", (d,)),
                q + "mlp.W_in": get(p + "mlp.c_fc.weight", (d, f)),
                q + "mlp.b_in": get(p + "mlp.c_fc.bias", (f,)),
                q + "mlp.W_out": get(p + "mlp.c_proj.weight", (f, d)),
                q + "mlp.b_out": get(p + "mlp.c_proj.bias", (d,)),
            }
        )
    out["ln_final.w"], out["ln_final.b"] = get("ln_f.weight", (d,)), get("ln_f.bias", (d,))
    # tied unless the file has its own
    W_U = get("lm_head.weight", (V, d)) if has("lm_head.weight") else out["embed.W_E"]
    out["unembed.W_U"] = W_U.T.contiguous()
    out["unembed.b_U"] = W_U.new_zeros(V)
    return {k: v.contiguous() for k, v in out.items()}


def from_transformers(hf_model, name: str = "gpt2", device: str | torch.device = "cpu") -> LoadedModel:
    """Convert an in-memory ``transformers`` GPT-2 model (GPT2Model or GPT2LMHeadModel)."""
    hf = hf_model.config.to_dict()
    if hf.get("model_type") != "gpt2":
        raise CheckpointError(f"expected a GPT-2 model, got model_type {hf.get('model_type')!r}")
    sd = {k: v.detach().cpu() for k, v in hf_model.state_dict().items()}
    cfg, tensors = convert_state_dict(sd, hf)
    model = build_checked(cfg, tensors)
    return LoadedModel(
        name=name,
        model=model.to(device).eval(),
        config=cfg,
        card=Card(source="transformers", details={"architecture": "gpt2", "note": IMPORTED}),
        key=f"{name}:{id(hf_model):x}",
    )
