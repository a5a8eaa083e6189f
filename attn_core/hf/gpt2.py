"""Import a local Hugging Face GPT-2 checkpoint folder into attn-lab's Transformer.

A folder qualifies when its ``config.json`` says ``"model_type": "gpt2"``; its weights must be
``model.safetensors`` (only safetensors and JSON are read, never a pickled
``pytorch_model.bin``). The conversion reads the file directly, so ``transformers`` is not
needed to import a model; :func:`from_transformers` converts a model object already in memory.

GPT-2 is pre-LayerNorm with learned positions, query/key/value biases (``attn_bias``) and
gelu_new (``mlp_act="gelu_tanh"``). Its Conv1D weights are ``[in, out]``, our row-vector
convention already: ``c_attn.weight`` [d, 3d] splits into W_Q, W_K, W_V and each into heads.
The unembedding is tied (W_U = W_E^T) unless the file has its own ``lm_head.weight``, with no
bias (b_U = 0). ``scale_attn_weights=False`` and ``scale_attn_by_inverse_layer_idx`` change
the scores' scale, which is folded into W_Q and b_Q, so S (and B) stay exactly the model's.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch
from safetensors import safe_open

from attn_core.card import Card
from attn_core.checkpoint import CONFIG, WEIGHTS, CheckpointError, LoadedModel, build_checked, read_json
from attn_core.model import ModelConfig

VOCAB = "vocab.json"
MAX_WEIGHTS_BYTES = 2 * 2**30  # GPT-2 small is ~0.5 GiB
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def is_gpt2_folder(path: str | Path) -> bool:
    """True for a folder whose config.json declares ``"model_type": "gpt2"``."""
    p = Path(path)
    if not (p.is_dir() and (p / CONFIG).is_file()):
        return False
    try:
        return read_json(p / CONFIG).get("model_type") == "gpt2"
    except CheckpointError:
        return False


def model_config(hf: dict) -> ModelConfig:
    """Our ModelConfig for a GPT-2 config dict (config.json or ``GPT2Config.to_dict()``)."""
    act = hf.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"GPT-2 activation {act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    if hf.get("add_cross_attention"):
        raise CheckpointError("GPT-2 models with cross-attention are not supported")
    try:
        d, h = int(hf["n_embd"]), int(hf["n_head"])
        if h <= 0 or d % h:
            raise CheckpointError(f"n_embd={d} is not divisible by n_head={h}")
        return ModelConfig(
            n_layers=int(hf["n_layer"]),
            n_heads=h,
            d_model=d,
            d_head=d // h,
            d_mlp=int(hf.get("n_inner") or 4 * d),
            n_ctx=int(hf["n_positions"]),
            d_vocab=int(hf["vocab_size"]),
            normalization="layernorm",
            positional="learned",
            qk="factored",
            attn_bias=True,
            ln_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            mlp_act=ACTIVATIONS[act],
        )
    except KeyError as e:
        raise CheckpointError(f"the GPT-2 config.json lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(str(e)) from None


def convert_state_dict(sd: dict[str, torch.Tensor], hf: dict) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """GPT-2 tensors (with or without the ``transformer.`` prefix) -> our config and tensors."""
    cfg = model_config(hf)
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}

    def get(name: str) -> torch.Tensor:
        if name not in sd:
            raise CheckpointError(f"the GPT-2 checkpoint lacks tensor {name!r}")
        return sd[name].float()

    d, h, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    out = {"embed.W_E": get("wte.weight"), "pos_embed.W_pos": get("wpe.weight")}
    for l in range(cfg.n_layers):
        p, q = f"h.{l}.", f"blocks.{l}."
        # Scores are q k^T * c: c = 1/sqrt(dh) normally; our model applies 1/sqrt(dh) itself,
        # so any other factor goes into the query weights and bias.
        c = 1 / math.sqrt(dh) if hf.get("scale_attn_weights", True) else 1.0
        if hf.get("scale_attn_by_inverse_layer_idx"):
            c /= l + 1
        fold = c * math.sqrt(dh)
        W, b = get(p + "attn.c_attn.weight"), get(p + "attn.c_attn.bias")  # [d, 3d], [3d]
        W_Q, W_K, W_V = (w.reshape(d, h, dh).permute(1, 0, 2) for w in W.split(d, dim=1))  # [h, d, dh]
        b_Q, b_K, b_V = (v.reshape(h, dh) for v in b.split(d))
        out.update(
            {
                q + "ln1.w": get(p + "ln_1.weight"),
                q + "ln1.b": get(p + "ln_1.bias"),
                q + "attn.W_Q": W_Q * fold,
                q + "attn.W_K": W_K,
                q + "attn.W_V": W_V,
                q + "attn.b_Q": b_Q * fold,
                q + "attn.b_K": b_K,
                q + "attn.b_V": b_V,
                q + "attn.W_O": get(p + "attn.c_proj.weight").reshape(h, dh, d),
                q + "attn.b_O": get(p + "attn.c_proj.bias"),
                q + "ln2.w": get(p + "ln_2.weight"),
                q + "ln2.b": get(p + "ln_2.bias"),
                q + "mlp.W_in": get(p + "mlp.c_fc.weight"),
                q + "mlp.b_in": get(p + "mlp.c_fc.bias"),
                q + "mlp.W_out": get(p + "mlp.c_proj.weight"),
                q + "mlp.b_out": get(p + "mlp.c_proj.bias"),
            }
        )
    out["ln_final.w"], out["ln_final.b"] = get("ln_f.weight"), get("ln_f.bias")
    W_U = sd.get("lm_head.weight", sd["wte.weight"])  # tied unless the file has its own
    out["unembed.W_U"] = W_U.float().T.contiguous()
    out["unembed.b_U"] = torch.zeros(cfg.d_vocab)
    return cfg, {k: v.contiguous() for k, v in out.items()}


def _card(source: str, hf: dict, vocab: Path | None) -> Card:
    return Card(
        source=source,
        vocab_file=str(vocab) if vocab is not None else None,
        details={"architecture": "gpt2", "note": "Imported from a Hugging Face GPT-2 checkpoint; no synthetic task."},
    )


def load_gpt2(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """A local GPT-2 folder (config.json + model.safetensors [+ vocab.json for token names])."""
    path = Path(path)
    if not is_gpt2_folder(path):
        raise CheckpointError(f"{path} is not a Hugging Face GPT-2 folder (config.json with model_type gpt2)")
    hf = read_json(path / CONFIG)
    weights = path / WEIGHTS
    if not weights.is_file():
        extra = (
            " (pytorch_model.bin is a pickle and is never read; re-save with safe_serialization=True)"
            if (path / "pytorch_model.bin").exists()
            else ""
        )
        raise CheckpointError(f"{path} has no {WEIGHTS}{extra}")
    size = weights.stat().st_size
    if size > MAX_WEIGHTS_BYTES:
        raise CheckpointError(f"{WEIGHTS} is {size / 2**20:.0f} MiB; the limit is {MAX_WEIGHTS_BYTES / 2**20:.0f} MiB")
    try:
        with safe_open(str(weights), framework="pt") as f:
            sd = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # the Rust loader raises several error types
        raise CheckpointError(
            f"{WEIGHTS} is not a readable safetensors file ({str(e).splitlines()[0][:200]})"
        ) from None
    cfg, tensors = convert_state_dict(sd, hf)
    model = build_checked(cfg, tensors)
    vocab = path / VOCAB if (path / VOCAB).is_file() else None
    stamp = f"{path.resolve()}:{size}:{weights.stat().st_mtime_ns}:{json.dumps(hf, sort_keys=True)}"
    key = f"{path.name}:{hashlib.sha1(stamp.encode()).hexdigest()[:16]}"
    return LoadedModel(
        name=path.name, model=model.to(device).eval(), config=cfg, card=_card(str(path), hf, vocab), path=path, key=key
    )


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
        card=_card("transformers", hf, None),
        key=f"{name}:{id(hf_model):x}",
    )
