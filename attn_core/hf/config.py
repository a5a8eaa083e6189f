"""A Hugging Face config.json as our :class:`ModelConfig`, for the families read here.

Folders come from transformers 4 and 5, so both spellings are read: ``rope_theta`` +
``rope_scaling`` (4) or ``rope_parameters`` (5); ``rotary_pct`` + ``rotary_emb_base`` (GPT-NeoX
in 4) or ``partial_rotary_factor``. Anything that changes the attention and is not supported
(another rope type, cross-attention, ...) is refused in one sentence naming it.
"""

from __future__ import annotations

from attn_core.checkpoint import CheckpointError
from attn_core.model import ModelConfig

FAMILIES = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2")
LLAMA_LIKE = ("llama", "mistral", "qwen2")
ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
}


def family(hf: dict) -> str:
    """The folder's model_type, when it is one of :data:`FAMILIES`."""
    kind = hf.get("model_type")
    if kind not in FAMILIES:
        raise CheckpointError(f"model_type {kind!r} is not supported; supported families: {', '.join(FAMILIES)}")
    return kind


def _int(hf: dict, *keys: str, default=None) -> int:
    for k in keys:
        if hf.get(k) is not None:
            v = hf[k]
            if isinstance(v, bool) or not isinstance(v, int):
                raise CheckpointError(f"config.json {k} must be an integer, got {v!r}")
            return v
    if default is None:
        raise CheckpointError(f"config.json lacks {keys[0]!r}")
    return default


def activation(hf: dict, key: str, default: str) -> str:
    """Our ``mlp_act`` for the activation a config names under ``key`` (one table for every family)."""
    act = hf.get(key, default)
    if act not in ACTIVATIONS:
        raise CheckpointError(f"activation {act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[act]


def _rope(hf: dict, d_head: int, theta_default: float, partial_default: float) -> dict:
    """rotary_dim, rope_theta and rope_scaling from either spelling."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]
    params = params if isinstance(params, dict) else {}
    scaling = hf.get("rope_scaling") if isinstance(hf.get("rope_scaling"), dict) else {}
    theta = params.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", theta_default)))
    partial = params.get(
        "partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct", partial_default))
    )
    source = params if (params.get("rope_type") or params.get("type")) else scaling
    kind = source.get("rope_type") or source.get("type") or "default"
    if not isinstance(theta, (int, float)) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise CheckpointError(f"rope_theta={theta!r} / partial rotary factor={partial!r} are not valid")
    rope_scaling = None
    if kind == "linear":
        rope_scaling = {"type": "linear", "factor": source.get("factor")}
    elif kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        rope_scaling = {"type": "llama3", **{k: source.get(k) for k in keys}}
        if rope_scaling["original_max_position_embeddings"] is None:
            rope_scaling["original_max_position_embeddings"] = hf.get("max_position_embeddings")
    elif kind != "default":
        raise CheckpointError(f"rope type {kind!r} is not supported; supported: default, linear, llama3")
    return {"rotary_dim": int(d_head * partial), "rope_theta": float(theta), "rope_scaling": rope_scaling}


def _windows(hf: dict, kind: str, n_layers: int) -> list[int] | None:
    window = hf.get("sliding_window")
    if kind == "qwen2" and not hf.get("use_sliding_window", False):
        window = None
    if not window:
        return None
    if not isinstance(window, int) or window < 1:
        raise CheckpointError(f"sliding_window={window!r} must be a positive integer")
    layer_types = hf.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == n_layers:
        return [window if t == "sliding_attention" else 0 for t in layer_types]
    if kind == "qwen2":
        first = _int(hf, "max_window_layers", default=n_layers)
        return [window if l >= first else 0 for l in range(n_layers)]
    return [window] * n_layers


def rotary_model_config(hf: dict) -> ModelConfig:
    """Our config for a config.json of a rotary family (GPT-NeoX, Llama, Mistral, Qwen2; GPT-2's
    is ``hf/gpt2.py``, and ``hf/load.model_config`` picks between them)."""
    kind = family(hf)
    if hf.get("is_encoder_decoder") or hf.get("add_cross_attention"):
        raise CheckpointError("encoder-decoder and cross-attention models are not supported")
    d, h = _int(hf, "hidden_size"), _int(hf, "num_attention_heads")
    n_layers = _int(hf, "num_hidden_layers")
    d_head = _int(hf, "head_dim", default=d // h if h > 0 and d % h == 0 else 0)
    if d_head <= 0:
        raise CheckpointError(f"hidden_size={d} is not divisible by num_attention_heads={h}")
    common = dict(
        n_layers=n_layers,
        n_heads=h,
        d_model=d,
        d_head=d_head,
        d_mlp=_int(hf, "intermediate_size"),
        n_ctx=_int(hf, "max_position_embeddings", default=2048),
        d_vocab=_int(hf, "vocab_size"),
        positional="rotary",
        qk="factored",
    )
    try:
        if kind == "gpt_neox":
            if d_head * h != d:
                raise CheckpointError("GPT-NeoX needs hidden_size = num_attention_heads x head size")
            return ModelConfig(
                **common,
                normalization="layernorm",
                attn_bias=bool(hf.get("attention_bias", True)),
                ln_eps=float(hf.get("layer_norm_eps", 1e-5)),
                mlp_act=activation(hf, "hidden_act", "gelu"),
                parallel_attn=bool(hf.get("use_parallel_residual", True)),
                **_rope(hf, d_head, 10000.0, 0.25),
            )
        bias = True if kind == "qwen2" else bool(hf.get("attention_bias", False))
        return ModelConfig(
            **common,
            normalization="rmsnorm",
            attn_bias=bias,
            ln_eps=float(hf.get("rms_norm_eps", 1e-6)),
            mlp_act=activation(hf, "hidden_act", "silu"),
            gated_mlp=True,
            n_kv_heads=_int(hf, "num_key_value_heads", default=h),
            sliding_window=_windows(hf, kind, n_layers),
            **_rope(hf, d_head, 10000.0, 1.0),
        )
    except (TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(str(e)) from None
