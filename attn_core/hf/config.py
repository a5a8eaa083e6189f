"""A Hugging Face config.json as our :class:`ModelConfig`, for the families read here.

Folders come from transformers 4 and 5, so both spellings are read: ``rope_theta`` +
``rope_scaling`` (4) or ``rope_parameters`` (5); ``rotary_pct`` + ``rotary_emb_base`` (GPT-NeoX
in 4) or ``partial_rotary_factor``. When a folder carries both spellings of one setting and they
disagree, it is refused naming both. Anything that changes the attention and is not supported
(another rope type, cross-attention, ...) is refused in one sentence naming it.

Every field is read by type (:func:`integer`, :func:`number`, :func:`flag`, :func:`mapping`): an
integer written as 32.7, ``"32"`` or 1e400, an activation given as a list, a ``layer_types``
entry that is not a layer type, a ``rope_scaling`` that is a list: each is one sentence naming
the field, never coerced or dropped.
"""

from __future__ import annotations

import math

from attn_core.checkpoint import CheckpointError
from attn_core.model import ModelConfig
from attn_core.model.config import MAX_EXPERTS
from attn_core.model.rotary import inverse_frequencies, yarn_attention_factor
from attn_core.validate import is_int, is_number

ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
}
LAYER_TYPES = ("full_attention", "sliding_attention")
_MISSING = object()


def _show(v) -> str:
    return repr(v) if not isinstance(v, float) or math.isfinite(v) else f"{v} (not a finite number)"


def _present(hf: dict, key: str):
    v = hf.get(key, _MISSING)
    return _MISSING if v is None else v


def integer(hf: dict, key: str, default=_MISSING) -> int:
    """``hf[key]`` when it is an integer (not a bool, not 32.7, not "32", not 1e400)."""
    v = _present(hf, key)
    if v is _MISSING:
        if default is _MISSING:
            raise CheckpointError(f"config.json lacks {key!r}")
        return default
    if not is_int(v):
        raise CheckpointError(f"config.json {key} must be an integer, got {_show(v)}")
    return int(v)


def number(
    hf: dict, key: str, default: float, lo: float = 0.0, hi: float = math.inf, where: str = "config.json"
) -> float:
    """``hf[key]`` when it is a finite number in (lo, hi) (not a bool, not a string)."""
    v = _present(hf, key)
    if v is _MISSING:
        return default
    if not (is_number(v) and lo < v < hi):
        span = f"({lo:g}, {hi:g})" if math.isfinite(hi) else f"> {lo:g}"
        raise CheckpointError(f"{where} {key} must be a finite number {span}, got {_show(v)}")
    return float(v)


def flag(hf: dict, key: str, default: bool) -> bool:
    """``hf[key]`` when it is true or false (``"false"``, 0 or 1 are refused)."""
    v = _present(hf, key)
    if v is _MISSING:
        return default
    if not isinstance(v, bool):
        raise CheckpointError(f"config.json {key} must be true or false, got {_show(v)}")
    return v


def mapping(hf: dict, key: str, where: str = "config.json") -> dict:
    """``hf[key]`` when it is a JSON object ({} when absent or null; a list or a string is refused)."""
    v = _present(hf, key)
    if v is _MISSING:
        return {}
    if not isinstance(v, dict):
        raise CheckpointError(f"{where} {key} must be a JSON object (or null), got {type(v).__name__} {v!r:.60}")
    return v


def activation(hf: dict, key: str, default: str) -> str:
    """Our ``mlp_act`` for the activation a config names under ``key`` (one table for every family)."""
    act = hf.get(key, default)
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise CheckpointError(f"activation {act!r:.60} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[act]


def _one(what: str, spellings: list[tuple[str, object]], default):
    """The value of a setting written under several spellings (transformers 4 and 5): the one
    given (``_MISSING``: not given), or the default; two that disagree are refused naming both."""
    given = [(name, v) for name, v in spellings if v is not _MISSING]
    for name, v in given[1:]:
        if v != given[0][1]:
            raise CheckpointError(
                f"config.json gives {what} twice and they disagree: {given[0][0]} = {given[0][1]!r:.80} "
                f"and {name} = {v!r:.80}; keep one"
            )
    return given[0][1] if given else default


def _scaling(source: dict, where: str, hf: dict) -> dict | None:
    """Our rope_scaling for a rope_scaling / rope_parameters object (None: no scaling)."""
    kind = source.get("rope_type", source.get("type")) or "default"
    if kind == "default":
        return None
    if kind == "linear":
        return {"type": "linear", "factor": number(source, "factor", math.nan, where=where)}
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor")
        out = {"type": "llama3", **{k: number(source, k, math.nan, where=where) for k in keys}}
        old = integer(source, "original_max_position_embeddings", default=None)
        out["original_max_position_embeddings"] = old if old is not None else integer(hf, "max_position_embeddings")
        return out
    if kind == "yarn":
        return _yarn(source, where, hf)
    raise CheckpointError(f"rope type {kind!r:.60} is not supported; supported: default, linear, llama3, yarn")


def _yarn(source: dict, where: str, hf: dict) -> dict:
    """Our YaRN rope_scaling, each field read as transformers reads it (its defaults; the factor
    from max_position_embeddings / original_max_position_embeddings when absent; the attention
    factor from ``mscale`` / ``mscale_all_dim`` or the factor when not given)."""
    old = integer(source, "original_max_position_embeddings", default=None)
    old = old if old is not None else integer(hf, "max_position_embeddings")
    if old <= 0:
        raise CheckpointError(f"{where} original_max_position_embeddings must be positive, got {old}")
    factor = number(source, "factor", math.nan, where=where)
    if math.isnan(factor):
        factor = integer(hf, "max_position_embeddings") / old
    out = {"type": "yarn", "factor": factor, "original_max_position_embeddings": old}
    for k, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):
        out[k] = number(source, k, default, where=where) if source.get(k) else default  # 0 or null: the default
    out["truncate"] = flag(source, "truncate", True)
    mscale, all_dim = (number(source, k, 0.0, where=where) for k in ("mscale", "mscale_all_dim"))
    given = number(source, "attention_factor", math.nan, where=where)
    out["attention_factor"] = given if not math.isnan(given) else yarn_attention_factor(factor, mscale, all_dim)
    return out


def _rope_parameter_sets(hf: dict) -> list[tuple[str, dict]]:
    """(name, object) of each rope_parameters a config gives: the one object, or (transformers 5)
    one per layer type, ``{"full_attention": {...}, "sliding_attention": {...}}``."""
    params = mapping(hf, "rope_parameters")
    typed = [k for k in LAYER_TYPES if k in params]
    if not typed:
        return [("rope_parameters", params)]
    other = [k for k in params if k not in LAYER_TYPES]
    if other:
        raise CheckpointError(
            f"config.json rope_parameters mixes per-layer-type entries ({typed[0]}) with {other[0]!r:.60}; "
            "give one or the other"
        )
    return [(f"rope_parameters.{k}", mapping(params, k, where="config.json rope_parameters")) for k in typed]


def rope(
    hf: dict, d_head: int, theta_default: float = 10000.0, partial_default: float = 1.0, local: bool = False
) -> dict:
    """rotary_dim, rope_theta and rope_scaling from either spelling (both, when they agree). One
    rotary for every layer: rope_parameters given per layer type must agree, except, with
    ``local`` (Gemma 3), in the sliding layers' base, which becomes ``rope_theta_local``."""
    found = dict((name, _rope_of(hf, params, name, d_head, theta_default, partial_default))
                 for name, params in _rope_parameter_sets(hf))  # fmt: skip
    sliding = found.pop("rope_parameters.sliding_attention", None) if local else None
    first_name, first = next(iter(found.items())) if found else ("rope_parameters.sliding_attention", sliding)
    for name, other in found.items():
        if other != first:
            raise CheckpointError(
                f"config.json gives the layer types different rotary settings: {first_name} = {first!r:.100} and "
                f"{name} = {other!r:.100}; one rotary for every layer is supported"
            )
    if sliding is not None:
        if sliding["rope_scaling"] is not None or sliding["rotary_dim"] != first["rotary_dim"]:
            raise CheckpointError(
                "config.json rope_parameters.sliding_attention may differ from the full layers' only in rope_theta "
                f"(no scaling), got {sliding!r:.100}"
            )
        return {**first, "rope_theta_local": sliding["rope_theta"]}
    return first


def _rope_of(hf: dict, params: dict, name: str, d_head: int, theta_default: float, partial_default: float) -> dict:
    """:func:`_rope` for one rope_parameters object ``params`` (called ``name``)."""
    v4 = mapping(hf, "rope_scaling")
    theta = _one(
        "the rope base",
        [
            (f"{name}.rope_theta", _present(params, "rope_theta")),
            ("rope_theta", _present(hf, "rope_theta")),
            ("rotary_emb_base", _present(hf, "rotary_emb_base")),
        ],
        theta_default,
    )
    partial = _one(
        "the partial rotary factor",
        [
            (f"{name}.partial_rotary_factor", _present(params, "partial_rotary_factor")),
            ("partial_rotary_factor", _present(hf, "partial_rotary_factor")),
            ("rotary_pct", _present(hf, "rotary_pct")),
        ],
        partial_default,
    )
    theta = number({"rope_theta": theta}, "rope_theta", theta_default, lo=1.0)
    if not (is_number(partial) and 0 < partial <= 1):
        raise CheckpointError(f"config.json partial rotary factor must be a number in (0, 1], got {_show(partial)}")
    scaling = _one(
        "the rope scaling",
        [
            (name, _scaling(params, name, hf) if params else _MISSING),
            ("rope_scaling", _scaling(v4, "rope_scaling", hf) if v4 else _MISSING),
        ],
        None,
    )
    return {"rotary_dim": int(d_head * partial), "rope_theta": theta, "rope_scaling": scaling}


def windows(hf: dict, n_layers: int, use_flag: str | None = None, max_window_layers: bool = False) -> list[int] | None:
    """Each layer's sliding window (None: no layer has one) from sliding_window and layer_types;
    ``use_flag`` names a switch that must be true for any window (Qwen2's use_sliding_window), and
    ``max_window_layers`` (Qwen2) gives the first windowed layer when layer_types is absent."""
    window = integer(hf, "sliding_window", default=0)
    if window < 0:
        raise CheckpointError(f"config.json sliding_window must be a positive integer, got {window}")
    if use_flag is not None and not flag(hf, use_flag, False):
        window = 0
    kinds = layer_types(hf, n_layers)
    if kinds is not None:
        found = [window if t == "sliding_attention" else 0 for t in kinds]
    elif max_window_layers:
        first = integer(hf, "max_window_layers", default=n_layers)
        found = [window if l >= first else 0 for l in range(n_layers)]
    else:
        found = [window] * n_layers
    return found if any(found) else None


def layer_types(hf: dict, n_layers: int) -> list[str] | None:
    """config.json's layer_types (one of :data:`LAYER_TYPES` per layer), or None when absent."""
    kinds = hf.get("layer_types")
    if kinds is None:
        return None
    if not isinstance(kinds, list) or len(kinds) != n_layers:
        got = f"{len(kinds)} entries" if isinstance(kinds, list) else type(kinds).__name__
        raise CheckpointError(
            f"config.json layer_types must list one of {LAYER_TYPES} per layer ({n_layers} layers), got {got}"
        )
    bad = [t for t in kinds if not isinstance(t, str) or t not in LAYER_TYPES]
    if bad:
        raise CheckpointError(f"config.json layer_types holds {bad[0]!r:.60}; each entry is one of {LAYER_TYPES}")
    return kinds


def head_dim(hf: dict, fixed: bool = False) -> int:
    """config.json's head_dim, hidden_size / num_attention_heads by default; with ``fixed`` (a
    family whose heads split hidden_size evenly) a head_dim that disagrees is refused."""
    d, h = integer(hf, "hidden_size"), integer(hf, "num_attention_heads")
    even = d // h if h > 0 and d % h == 0 else 0
    d_head = integer(hf, "head_dim", default=even)
    if d_head <= 0:
        raise CheckpointError(f"hidden_size={d} is not divisible by num_attention_heads={h}")
    if fixed and d_head * h != d:
        raise CheckpointError(
            f"config.json head_dim={d_head} disagrees with hidden_size / num_attention_heads = {d} / {h}; "
            "this family splits hidden_size evenly into its heads"
        )
    return d_head


def expert_count(hf: dict) -> tuple[int, str]:
    """(count, the field it is read from): num_experts (the Hub's spelling) or num_local_experts
    (transformers 5 saves this one); both present must agree."""
    found = {k: integer(hf, k) for k in ("num_experts", "num_local_experts") if hf.get(k) is not None}
    if not found:
        raise CheckpointError("config.json lacks 'num_experts'")
    if len(set(found.values())) > 1:
        raise CheckpointError(f"config.json num_experts={found['num_experts']} disagrees with "
                              f"num_local_experts={found['num_local_experts']}")  # fmt: skip
    return next(iter(found.values())), next(iter(found))


def sparse_every_layer(hf: dict) -> None:
    """Refuse dense MLP layers among the experts (Qwen's ``mlp_only_layers``, a
    ``decoder_sparse_step`` above 1), by name."""
    dense = hf.get("mlp_only_layers") or []
    if dense != []:
        raise CheckpointError(
            f"config.json mlp_only_layers={dense!r}: dense layers among the experts are not supported"
        )
    if integer(hf, "decoder_sparse_step", default=1) != 1:
        raise CheckpointError(
            "config.json decoder_sparse_step must be 1: dense layers among the experts are not supported"
        )


def experts(hf: dict, count: str, count_value: int | None = None) -> dict:
    """The routed experts' fields: ``count`` (the family's name for the number of experts, its
    value read already when given) and ``num_experts_per_tok``, each refused by its config.json name."""
    n = integer(hf, count) if count_value is None else count_value
    if not 1 <= n <= MAX_EXPERTS:
        raise CheckpointError(f"config.json {count} must be 1..{MAX_EXPERTS}, got {n}")
    k = integer(hf, "num_experts_per_tok")
    if not 1 <= k <= n:
        raise CheckpointError(f"config.json num_experts_per_tok={k} must be 1..{count} ({n})")
    return dict(n_experts=n, experts_per_token=k)


def decoder_config(hf: dict, *, d_head: int | None = None, **features) -> ModelConfig:
    """Our config for a Llama-shaped config.json (RMSNorm, gated MLP, rotary, grouped-query):
    the fields every such family spells alike, then ``features`` (a family's own settings, which
    replace these). A ValueError of the config becomes one CheckpointError sentence."""
    if hf.get("is_encoder_decoder") or hf.get("add_cross_attention"):
        raise CheckpointError("encoder-decoder and cross-attention models are not supported")
    d_head = head_dim(hf) if d_head is None else d_head
    h = integer(hf, "num_attention_heads")
    fields = dict(
        n_layers=integer(hf, "num_hidden_layers"),
        n_heads=h,
        d_model=integer(hf, "hidden_size"),
        d_head=d_head,
        d_mlp=integer(hf, "intermediate_size"),
        n_ctx=integer(hf, "max_position_embeddings", default=2048),
        d_vocab=integer(hf, "vocab_size"),
        positional="rotary",
        qk="factored",
        normalization="rmsnorm",
        attn_bias=False,
        gated_mlp=True,
        n_kv_heads=integer(hf, "num_key_value_heads", default=h),
    )
    return checked_config({**fields, **features})


def checked_config(fields: dict) -> ModelConfig:
    """``ModelConfig(**fields)`` with its rotary frequencies checked, every refusal one CheckpointError."""
    try:
        cfg = ModelConfig(**fields)
        if cfg.positional == "rotary":
            for layer in {cfg.layer_rope_theta(l): l for l in range(cfg.n_layers)}.values():
                inverse_frequencies(cfg, layer)  # finite and positive, or refused here, before any weight is read
        return cfg
    except (TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(str(e)) from None
