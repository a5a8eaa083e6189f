"""The architecture of a model: :class:`ModelConfig`, validated on construction (a user's
config.json is untrusted input), with its exact parameter count.

One config covers the toys we train and the Hugging Face families we import
(``attn_core/hf/``): LayerNorm or RMSNorm, learned or rotary positions (full or partial,
``rope_theta``, linear, llama3 and YaRN scaling), grouped-query attention (``n_kv_heads``), q/k/v
biases, sequential or parallel attention and MLP, plain or gated (SwiGLU, GeGLU) MLPs, and sliding
windows per layer; and the features of the newer families (:data:`FEATURES`): QK-norm per head or
across the heads, a score scale other than 1/sqrt(d_head), logit soft-capping of the scores and of
the logits, a second rotary base for the sliding layers, layers without positions (NoPE),
sandwich or post norms, the embedding, residual and logit multipliers, a routed mixture of
experts in place of the MLP (Mixtral, Qwen3-MoE, OLMoE, Qwen2-MoE, gpt-oss), gpt-oss's clamped
SwiGLU and its learned sink logits (one per head, in each softmax's denominator), and an
unembedding tied to the embedding. Each defaults to "absent": a model without them computes, and
saves, exactly what it did before they existed
(:meth:`ModelConfig.to_dict` leaves out a feature at its default).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from attn_core.validate import is_int

NORMALIZATIONS = ("layernorm", "rmsnorm", "none")
POSITIONALS = ("learned", "rotary", "none")
QK_KINDS = ("factored", "merged")
MLP_ACTS = ("gelu", "gelu_tanh", "silu", "relu")
QK_NORMS = ("none", "head", "all")  # RMSNorm of q and k per head (Qwen3, Gemma 3) or over all heads (OLMo 2)
BLOCK_NORMS = ("pre", "sandwich", "post")  # norms before, before and after (Gemma), after only (OLMo 2)
ROPE_SCALINGS = ("linear", "llama3", "yarn")
ROUTER_SCORINGS = ("softmax", "sigmoid")  # of the router's logits, before the top-k
ROUTER_GROUP_SCORES = ("top2", "max")  # a group's score: its two best experts' sum (DeepSeek-V3), its best (V2)
MAX_EXPERTS = 4096
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# YaRN (gpt-oss, DeepSeek): attention_factor is resolved when a config is read (from mscale, or the factor)
YARN_KEYS = ("factor", "beta_fast", "beta_slow", "original_max_position_embeddings", "truncate", "attention_factor")
# Guards against absurd configs (a user's config.json is untrusted input). Whether a model of
# a valid shape fits in memory is checked by the loader (attn_core/hf/), before it is built.
MAX_DIM = 16384
MAX_CTX = 2**20  # rotary models name long contexts; only learned positions cost parameters
MAX_VOCAB = 2**18  # GPT-2's 50257 and Qwen2's 151936 tokens fit
MAX_LAYERS = 128
MAX_PARAMS = 10**12  # an absurdity guard; the loader checks what fits


@dataclass
class ModelConfig:
    n_layers: int = 1
    n_heads: int = 4
    d_model: int = 64
    d_head: int = 16
    d_mlp: int = 0  # 0 = attention-only
    n_ctx: int = 32
    d_vocab: int = 32
    normalization: str = "layernorm"
    positional: str = "learned"
    qk: str = "factored"
    attn_bias: bool = False
    ln_eps: float = 1e-5
    # Query/key width per layer and head; None means d_head everywhere. Heads grown by
    # attn_core.grow get more columns; W_Q/W_K are stored padded to the layer's widest head
    # with zero columns, which contribute nothing to the scores and stay zero under training.
    d_qk: list[list[int]] | None = None
    # 1.0 = softmax; otherwise alpha-entmax (1.5 = entmax15, 2.0 = sparsemax).
    entmax_alpha: float = 1.0
    mlp_act: str = "gelu"  # "gelu_tanh" is GPT-2's approximation, "silu" Llama's
    # Grouped-query attention: query head h reads key/value head h // (n_heads // n_kv_heads).
    n_kv_heads: int | None = None
    # Rotary positions (positional == "rotary"): the first rotary_dim dims of each query/key
    # head are rotated (None: all of d_head), in the rotate-half layout of GPT-NeoX and Llama.
    rotary_dim: int | None = None
    rope_theta: float = 10000.0
    # None, {"type": "linear", "factor": f} or {"type": "llama3", "factor", "low_freq_factor",
    # "high_freq_factor", "original_max_position_embeddings"} or {"type": "yarn", YARN_KEYS}.
    rope_scaling: dict | None = None
    gated_mlp: bool = False  # act(X W_gate + b_gate) * (X W_in + b_in), then W_out (SwiGLU)
    parallel_attn: bool = False  # GPT-NeoX: resid + attn(ln1(resid)) + mlp(ln2(resid))
    # Per layer, keys further back than this many positions are masked (0 = the whole context).
    sliding_window: list[int] | None = None
    # --- the newer families' features (FEATURES); each default is "absent" ---
    qk_norm: str = "none"  # QK_NORMS: RMSNorm (weights attn.q_norm.w, attn.k_norm.w) before the rotation
    attn_scale: float | None = None  # the scores' scale; None: 1/sqrt(d_qk) (Gemma: query_pre_attn_scalar^-1/2)
    attn_softcap: float | None = None  # S -> c tanh(S / c) before the mask (Gemma 2)
    final_softcap: float | None = None  # the same on the logits
    rope_theta_local: float | None = None  # the rotary base of the sliding-window layers (Gemma 3)
    nope_layers: list[int] | None = None  # layers whose queries and keys are not rotated (SmolLM3)
    block_norms: str = "pre"  # BLOCK_NORMS; "sandwich" adds ln1_post/ln2_post on each output, "post" has only those
    embed_scale: float = 1.0  # the embedding is multiplied by it (Gemma: sqrt(d_model); Granite)
    residual_scale: float = 1.0  # each attention and MLP output is multiplied by it (Granite)
    logits_scaling: float = 1.0  # the logits are divided by it (Granite)
    tied_embed: bool = False  # W_U is W_E^T, one tensor (a file's tie_word_embeddings), not a parameter of its own
    # a routed mixture of experts in place of each MLP (attn_core/model/moe.py): n_experts MLPs of
    # width d_mlp, the top experts_per_token of the router's scores (ROUTER_SCORINGS), renormalised
    n_experts: int = 0  # 0: a dense MLP
    experts_per_token: int = 0
    router_scoring: str = "softmax"
    router_renorm: bool = False  # the chosen experts' scores divided by their sum
    router_bias: bool = False  # the router's logits get a bias b_router (gpt-oss)
    d_shared: int = 0  # a shared expert of this width that every token passes through (0: none)
    shared_gate: bool = False  # the shared expert's output times sigmoid(x W_shared_gate) (Qwen2-MoE)
    # one learned sink logit per head (``attn.sinks`` [n_heads]) in each softmax's denominator (gpt-oss)
    attn_sinks: bool = False
    # gpt-oss's clamped SwiGLU: gate <- min(gate, c), up <- clamp(up, -c, c), (up + 1) * gate sigmoid(glu_alpha gate)
    glu_limit: float | None = None
    glu_alpha: float = 1.0
    # DeepSeek's router (moe.py): groups of experts (n_group), the top router_top_groups groups by
    # ROUTER_GROUP_SCORES kept before the top-k, a bias b_choice added to the scores for choosing only
    # (e_score_correction_bias), the chosen weights times routed_scale (routed_scaling_factor)
    router_groups: int = 0  # 0: no groups
    router_top_groups: int = 0
    router_group_score: str = "top2"
    router_choice_bias: bool = False
    routed_scale: float = 1.0
    first_dense: int = 0  # the first first_dense layers have a dense gated MLP of width d_dense (DeepSeek)
    d_dense: int = 0
    # multi-head latent attention (DeepSeek-V2/V3, attn_core/model/mla.py) when kv_lora_rank > 0: keys and
    # values from a kv_lora_rank latent, queries from a q_lora_rank latent (0: from x itself); d_head is
    # the no-position query/key width (qk_nope_head_dim), rotary_dim the decoupled rotary part's
    # (qk_rope_head_dim), d_v the value width (v_head_dim)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    d_v: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"invalid model config: {msg}")

        for name, top in (
            ("n_layers", MAX_LAYERS),
            ("n_heads", MAX_DIM),
            ("d_model", MAX_DIM),
            ("d_head", MAX_DIM),
            ("n_ctx", MAX_CTX),
            ("d_vocab", MAX_VOCAB),
        ):
            v = getattr(self, name)
            check(is_int(v), f"{name} must be an integer, got {v!r}")
            check(1 <= v <= top, f"{name}={v} is outside 1..{top}")
        check(is_int(self.d_mlp) and 0 <= self.d_mlp <= 8 * MAX_DIM, f"d_mlp={self.d_mlp!r} must be 0..{8 * MAX_DIM}")
        check(self.normalization in NORMALIZATIONS, f"normalization must be one of {NORMALIZATIONS}")
        check(self.positional in POSITIONALS, f"positional must be one of {POSITIONALS}")
        check(self.qk in QK_KINDS, f"qk must be one of {QK_KINDS}")
        check(self.mlp_act in MLP_ACTS, f"mlp_act must be one of {MLP_ACTS}")
        for flag in ("attn_bias", "gated_mlp", "parallel_attn", "tied_embed"):
            check(isinstance(getattr(self, flag), bool), f"{flag} must be true or false")
        check(isinstance(self.ln_eps, (int, float)) and 0 < self.ln_eps < 1, "ln_eps must be in (0, 1)")
        check(
            isinstance(self.entmax_alpha, (int, float)) and 1.0 <= self.entmax_alpha <= 2.0,
            f"entmax_alpha={self.entmax_alpha!r} must be in [1, 2]",
        )
        if self.n_kv_heads is not None:
            kv = self.n_kv_heads
            check(is_int(kv) and 1 <= kv <= self.n_heads, f"n_kv_heads={kv!r} must be 1..n_heads")
            check(self.n_heads % kv == 0, f"n_heads={self.n_heads} is not a multiple of n_kv_heads={kv}")
            check(self.qk == "factored", "grouped-query attention needs factored heads")
        self._validate_rotary(check)
        if self.sliding_window is not None:
            w = self.sliding_window
            check(isinstance(w, list) and len(w) == self.n_layers, "sliding_window must hold one window per layer")
            check(all(is_int(x) and 0 <= x <= MAX_CTX for x in w), f"sliding windows must be 0..{MAX_CTX}")
        if self.d_qk is not None:
            check(self.qk == "factored", "d_qk only applies to factored heads")
            check(self.n_kv_heads is None and self.positional != "rotary", "d_qk (grown heads) needs plain heads")
            check(isinstance(self.d_qk, list) and len(self.d_qk) == self.n_layers, "d_qk must hold one list per layer")
            for row in self.d_qk:
                check(isinstance(row, list) and len(row) == self.n_heads, "d_qk must hold one width per head")
                for w in row:
                    check(is_int(w) and 1 <= w <= MAX_DIM, f"d_qk width {w!r} is outside 1..{MAX_DIM}")
        self._validate_features(check)
        n_params = self.n_params()
        check(n_params <= MAX_PARAMS, f"{n_params:,} parameters is more than {MAX_PARAMS:,}")

    def _validate_rotary(self, check) -> None:
        if self.positional != "rotary":
            check(
                self.rotary_dim is None and self.rope_scaling is None, "rotary_dim/rope_scaling need rotary positions"
            )
            return
        check(self.qk == "factored", "rotary positions need factored heads")
        r = self.rotary_dims
        top = MAX_DIM if self.mla else self.d_head  # MLA's rotary part is its own width
        check(is_int(r) and 2 <= r <= top and r % 2 == 0, f"rotary_dim={r!r} must be even and 2..{top}")
        theta = self.rope_theta
        check(isinstance(theta, (int, float)) and 1 < theta < 1e12, f"rope_theta={theta!r} must be in (1, 1e12)")
        s = self.rope_scaling
        if s is None:
            return
        check(
            isinstance(s, dict) and s.get("type") in ROPE_SCALINGS, f"rope_scaling type must be one of {ROPE_SCALINGS}"
        )
        keys = {"linear": ("factor",), "llama3": LLAMA3_KEYS, "yarn": YARN_KEYS}[s["type"]]
        check(set(s) == {"type", *keys}, f"{s['type']} rope_scaling takes exactly {', '.join(keys)}")
        for k in keys:
            if k == "truncate":
                check(isinstance(s[k], bool), f"rope_scaling truncate must be true or false, got {s[k]!r}")
                continue
            ok = isinstance(s[k], (int, float)) and not isinstance(s[k], bool) and 0 < s[k] < 1e9
            check(ok, f"rope_scaling {k}={s[k]!r} must be positive")
        if s["type"] == "llama3":
            check(s["high_freq_factor"] > s["low_freq_factor"], "llama3 high_freq_factor must exceed low_freq_factor")

    def _validate_features(self, check) -> None:
        check(self.qk_norm in QK_NORMS, f"qk_norm must be one of {QK_NORMS}, got {self.qk_norm!r}")
        check(self.block_norms in BLOCK_NORMS, f"block_norms must be one of {BLOCK_NORMS}, got {self.block_norms!r}")
        if self.qk_norm != "none" or self.block_norms != "pre":
            check(self.normalization == "rmsnorm", "qk_norm and block_norms other than pre need normalization rmsnorm")
        if self.parallel_attn:
            check(self.block_norms == "pre" and self.residual_scale == 1.0, "parallel_attn needs block_norms pre")
        if self.qk_norm != "none":
            check(self.qk == "factored" and self.d_qk is None, "qk_norm needs factored heads of width d_head")
        for name in ("attn_scale", "attn_softcap", "final_softcap", "rope_theta_local"):
            v = getattr(self, name)
            ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0)
            check(ok, f"{name} must be a positive finite number (or null), got {v!r}")
        for name in ("embed_scale", "residual_scale", "logits_scaling"):
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            check(ok, f"{name} must be a positive finite number, got {v!r}")
        if self.rope_theta_local is not None:
            check(self.positional == "rotary", "rope_theta_local needs rotary positions")
            check(self.rope_theta_local > 1, f"rope_theta_local={self.rope_theta_local!r} must be above 1")
        if self.nope_layers is not None:
            n = self.nope_layers
            check(self.positional == "rotary", "nope_layers needs rotary positions")
            check(isinstance(n, list) and all(is_int(x) and 0 <= x < self.n_layers for x in n) and len(set(n)) == len(n),
                  f"nope_layers must list distinct layers 0..{self.n_layers - 1}")  # fmt: skip
        self._validate_experts(check)
        check(isinstance(self.attn_sinks, bool), "attn_sinks must be true or false")
        check(
            not self.attn_sinks or self.entmax_alpha == 1.0,
            "attn_sinks (learned sinks) need softmax attention (entmax_alpha 1)",
        )
        lim, alpha = self.glu_limit, self.glu_alpha
        ok = lim is None or (
            isinstance(lim, (int, float)) and not isinstance(lim, bool) and math.isfinite(lim) and lim > 0
        )
        check(ok, f"glu_limit must be a positive finite number (or null), got {lim!r}")
        ok = isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and math.isfinite(alpha) and alpha > 0
        check(ok, f"glu_alpha must be a positive finite number, got {alpha!r}")
        check(lim is not None or alpha == 1.0, "glu_alpha needs glu_limit (the clamped SwiGLU)")
        check(lim is None or (self.gated_mlp and self.mlp_act == "silu"), "glu_limit needs a gated silu MLP")
        self._validate_mla(check)

    def _validate_mla(self, check) -> None:
        names = ("kv_lora_rank", "q_lora_rank", "d_v", "first_dense", "d_dense")
        for name in names:
            v = getattr(self, name)
            check(is_int(v) and 0 <= v <= MAX_DIM, f"{name}={v!r} must be an integer 0..{MAX_DIM}")
        check(
            self.first_dense <= self.n_layers, f"first_dense={self.first_dense} is more than n_layers={self.n_layers}"
        )
        check((self.first_dense > 0) == (self.d_dense > 0), "first_dense and d_dense go together")
        check(not self.first_dense or self.n_experts, "first_dense (dense layers before the experts) needs n_experts")
        if not self.mla:
            check(self.q_lora_rank == 0 and self.d_v == 0, "q_lora_rank and d_v need kv_lora_rank (MLA)")
            return
        check(self.positional == "rotary" and self.qk == "factored", "MLA (kv_lora_rank) needs rotary factored heads")
        check(self.rotary_dim is not None and self.d_v > 0, "MLA needs rotary_dim (qk_rope_head_dim) and d_v")
        for name in ("n_kv_heads", "d_qk", "sliding_window", "nope_layers"):
            check(getattr(self, name) is None, f"MLA does not take {name}")
        check(self.qk_norm == "none" and not self.attn_bias and self.attn_softcap is None and not self.attn_sinks,
              "MLA takes no qk_norm, attention biases, soft cap or learned sinks (attn_sinks)")  # fmt: skip

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention (``kv_lora_rank`` > 0)."""
        return self.kv_lora_rank > 0

    def dense_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` has the dense MLP of width ``d_dense`` among experts (DeepSeek)."""
        return layer < self.first_dense

    def _validate_experts(self, check) -> None:
        E, k = self.n_experts, self.experts_per_token
        check(is_int(E) and 0 <= E <= MAX_EXPERTS, f"n_experts={E!r} must be an integer 0..{MAX_EXPERTS}")
        check(self.router_scoring in ROUTER_SCORINGS, f"router_scoring must be one of {ROUTER_SCORINGS}")
        check(isinstance(self.router_renorm, bool), "router_renorm must be true or false")
        check(isinstance(self.router_bias, bool), "router_bias must be true or false")
        s = self.d_shared
        check(is_int(s) and 0 <= s <= 8 * MAX_DIM, f"d_shared={s!r} must be 0..{8 * MAX_DIM}")
        check(isinstance(self.shared_gate, bool), "shared_gate must be true or false")
        check(s > 0 or not self.shared_gate, "shared_gate needs a shared expert (d_shared > 0)")
        if E == 0:
            check(k == 0 and self.router_scoring == "softmax" and not self.router_renorm and s == 0 and not self.router_bias,
                  "experts_per_token, router_scoring, router_renorm, router_bias and d_shared need n_experts")  # fmt: skip
            check(not (self.router_groups or self.router_choice_bias) and self.routed_scale == 1.0,
                  "router_groups, router_choice_bias and routed_scale need n_experts")  # fmt: skip
            return
        check(is_int(k) and 1 <= k <= E, f"experts_per_token={k!r} must be 1..n_experts ({E})")
        check(self.d_mlp > 0, "n_experts needs an MLP (d_mlp > 0)")
        check(isinstance(self.router_choice_bias, bool), "router_choice_bias must be true or false")
        s = self.routed_scale
        ok = isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s > 0
        check(ok, f"routed_scale must be a positive finite number, got {s!r}")
        check(
            self.router_group_score in ROUTER_GROUP_SCORES, f"router_group_score must be one of {ROUTER_GROUP_SCORES}"
        )
        G, top = self.router_groups, self.router_top_groups
        check(is_int(G) and 0 <= G <= E and (G == 0 or E % G == 0), f"router_groups={G!r} must divide n_experts ({E})")
        if G:
            check(is_int(top) and 1 <= top <= G, f"router_top_groups={top!r} must be 1..router_groups ({G})")
            check(k <= top * (E // G), f"experts_per_token={k} is more than the experts of the top groups")

    def rotary_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` rotates its queries and keys (rotary, and not a NoPE layer)."""
        return self.positional == "rotary" and layer not in (self.nope_layers or ())

    def layer_rope_theta(self, layer: int) -> float:
        """Layer ``layer``'s rotary base: ``rope_theta_local`` in a sliding-window layer when set."""
        return self.rope_theta_local if self.rope_theta_local and self.window(layer) else self.rope_theta

    @property
    def kv_heads(self) -> int:
        """Key/value heads per layer (n_heads without grouped-query attention)."""
        return self.n_kv_heads or self.n_heads

    def kv_head(self, head: int) -> int:
        """The key/value head that query head ``head`` reads."""
        return head // (self.n_heads // self.kv_heads)

    @property
    def rotary_dims(self) -> int:
        """Rotated dims per query/key head (0 without rotary positions)."""
        if self.positional != "rotary":
            return 0
        return self.d_head if self.rotary_dim is None else self.rotary_dim

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding window (0: every earlier key is visible)."""
        return self.sliding_window[layer] if self.sliding_window is not None else 0

    def qk_width(self, layer: int) -> int:
        """Stored width of W_Q/W_K in this layer (the widest head)."""
        return max(self.d_qk[layer]) if self.d_qk is not None else self.d_head

    def head_d_qk(self, layer: int, head: int) -> int:
        return self.d_qk[layer][head] if self.d_qk is not None else self.d_head

    def n_params(self) -> int:
        """The exact number of parameters of ``Transformer(self)`` (a test checks it against the
        built model). With d, V, T, h, d_head, d_mlp as in the config, g = kv_heads and w the
        layer's stored query/key width (the widest head's d_qk; narrower heads are zero-padded):

            embeddings   V d (+ T d learned positions);  unembedding  d V + V (V when tied);  final norm n
            per layer    norm n + W_Q h d w, W_K g d w (merged: W_QK h d^2) + W_V g d d_head,
                         W_O h d_head d (+ b_Q h w, b_K g w if factored, + b_V g d_head, b_O d,
                         with biases) (+ norm n + W_in, W_out 2 d d_mlp + b_in, b_out d_mlp + d,
                         + W_gate, b_gate d d_mlp + d_mlp when gated, with an MLP; with
                         experts, n_experts such MLPs + the router's d n_experts (+ n_experts), + a shared
                         one of width d_shared + its gate's d) (+ h sink logits with attn_sinks)

        A norm n is 2d for LayerNorm, d for RMSNorm and 0 with ``normalization = "none"``. Sandwich
        norms add 2 norms a layer, post norms move both after; QK-norm adds 2 d_head (per head) or
        (h + g) d_head (across the heads) a layer."""
        d, h, g = self.d_model, self.n_heads, self.kv_heads
        ln = {"layernorm": 2 * d, "rmsnorm": d, "none": 0}[self.normalization]
        total = self.d_vocab * d + (self.n_ctx * d if self.positional == "learned" else 0)
        total += (0 if self.tied_embed else d * self.d_vocab) + self.d_vocab + ln
        for layer in range(self.n_layers):
            if self.mla:
                total += ln + self._mla()
                if self.d_mlp > 0:
                    total += ln + (self._mlp(self.d_dense) if self.dense_layer(layer) else self._experts(d))
                continue
            if self.qk == "merged":
                qk = h * d * d
            else:
                w = self.qk_width(layer)
                qk = (h + g) * d * w + ((h + g) * w if self.attn_bias else 0)
            norms = 2 if self.block_norms == "sandwich" else 1
            total += norms * ln + qk + (g + h) * d * self.d_head + (g * self.d_head + d if self.attn_bias else 0)
            total += h if self.attn_sinks else 0
            total += {"none": 0, "head": 2 * self.d_head, "all": (h + g) * self.d_head}[self.qk_norm]
            if self.d_mlp > 0:
                dense = not self.n_experts or self.dense_layer(layer)
                total += norms * ln + (
                    self._mlp(self.d_dense if self.n_experts else self.d_mlp) if dense else self._experts(d)
                )
        return total

    def _mla(self) -> int:
        """One MLA layer: W_DQ d r_q + its norm r_q + W_UQ, W_QR r_q h (d_head + r) (r_q = d without
        the query latent, no norm), W_DKV d r_kv + its norm r_kv + W_KR d r, W_UK, W_UV r_kv h
        (d_head + d_v), W_O h d_v d."""
        d, h, r, rq, rkv = self.d_model, self.n_heads, self.rotary_dims, self.q_lora_rank, self.kv_lora_rank
        q = (d * rq + rq + rq * h * (self.d_head + r)) if rq else d * h * (self.d_head + r)
        return q + d * rkv + rkv + d * r + rkv * h * (self.d_head + self.d_v) + h * self.d_v * d

    def _mlp(self, f: int) -> int:
        d = self.d_model
        return 2 * d * f + f + d + ((d * f + f) if self.gated_mlp else 0)

    def _experts(self, d: int) -> int:
        shared = (self._mlp(self.d_shared) + (d if self.shared_gate else 0)) if self.d_shared else 0
        per = self._mlp(self.d_mlp) + d + (1 if self.router_bias else 0) + (1 if self.router_choice_bias else 0)
        return self.n_experts * per + shared

    def to_dict(self) -> dict:
        """Every field, but a feature (:data:`FEATURES`) only when it is not at its default: a
        model without the newer features saves the config it always did."""
        out = asdict(self)
        for name, default in FEATURES.items():
            if out[name] == default:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        if not isinstance(raw, dict):
            raise ValueError("invalid model config: expected a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"invalid model config: unknown keys {unknown}")
        return cls(**raw)


_NAMES = [f.name for f in fields(ModelConfig)]
# the newer families' fields, with their defaults ("absent"): from qk_norm on
FEATURES = {f.name: f.default for f in fields(ModelConfig)[_NAMES.index("qk_norm") :]}
