"""The toy transformer: decoder-only, pre-LayerNorm, in the spirit of nanoGPT's model.py.

Conventions (docs/maths.md): row vectors; for layer l the attention input is
``X = ln1(residual)`` (or the residual itself when ``normalization == "none"``) and, per head,

    Q = X W_Q + b_Q,  K = X W_K + b_K,  S = Q K^T / sqrt(d_qk),  A = softmax_row(S + mask)

A *merged* head stores ``W_QK = B`` (d_model x d_model) directly, so ``S = X W_QK X^T``.

Every activation passes through a named hook point (:mod:`attn_core.hooks`, TransformerLens
names): ``run_with_cache`` records them, ``run_with_hooks`` may replace them. A plain
``model(tokens)`` carries no hook state and does no work at the hook points.

Parameter names follow TransformerLens' state dict, so ``state_dict()`` is the checkpoint
(docs/checkpoints.md); hook points hold no parameters or buffers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from attn_core.hooks import Hook, HookRun, NamesFilter, block_names, check_names, name_filter
from attn_core.validate import is_int

NORMALIZATIONS = ("layernorm", "none")
POSITIONALS = ("learned", "none")
QK_KINDS = ("factored", "merged")
# Guards against absurd configs (a user's config.json is untrusted input).
MAX_DIM = 8192
MAX_VOCAB = 2**18  # GPT-2's 50257 tokens fit
MAX_LAYERS = 64
MLP_ACTS = ("gelu", "gelu_tanh")


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
    mlp_act: str = "gelu"  # "gelu_tanh" is GPT-2's approximation

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(f"invalid model config: {msg}")

        for name in ("n_layers", "n_heads", "d_model", "d_head", "n_ctx", "d_vocab"):
            v = getattr(self, name)
            check(is_int(v), f"{name} must be an integer, got {v!r}")
            top = MAX_VOCAB if name == "d_vocab" else MAX_DIM
            check(1 <= v <= top, f"{name}={v} is outside 1..{top}")
        check(self.n_layers <= MAX_LAYERS, f"n_layers={self.n_layers} exceeds {MAX_LAYERS}")
        check(is_int(self.d_mlp) and 0 <= self.d_mlp <= 4 * MAX_DIM, f"d_mlp={self.d_mlp!r} must be 0..{4 * MAX_DIM}")
        check(self.normalization in NORMALIZATIONS, f"normalization must be one of {NORMALIZATIONS}")
        check(self.positional in POSITIONALS, f"positional must be one of {POSITIONALS}")
        check(self.qk in QK_KINDS, f"qk must be one of {QK_KINDS}")
        check(self.mlp_act in MLP_ACTS, f"mlp_act must be one of {MLP_ACTS}")
        check(isinstance(self.attn_bias, bool), "attn_bias must be true or false")
        check(isinstance(self.ln_eps, (int, float)) and 0 < self.ln_eps < 1, "ln_eps must be in (0, 1)")
        check(
            isinstance(self.entmax_alpha, (int, float)) and 1.0 <= self.entmax_alpha <= 2.0,
            f"entmax_alpha={self.entmax_alpha!r} must be in [1, 2]",
        )
        if self.d_qk is not None:
            check(self.qk == "factored", "d_qk only applies to factored heads")
            check(isinstance(self.d_qk, list) and len(self.d_qk) == self.n_layers, "d_qk must hold one list per layer")
            for row in self.d_qk:
                check(isinstance(row, list) and len(row) == self.n_heads, "d_qk must hold one width per head")
                for w in row:
                    check(is_int(w) and 1 <= w <= MAX_DIM, f"d_qk width {w!r} is outside 1..{MAX_DIM}")
        n_params = self.n_params()
        check(n_params <= 200_000_000, f"{n_params:,} parameters is too large for a toy model")

    def qk_width(self, layer: int) -> int:
        """Stored width of W_Q/W_K in this layer (the widest head)."""
        return max(self.d_qk[layer]) if self.d_qk is not None else self.d_head

    def head_d_qk(self, layer: int, head: int) -> int:
        return self.d_qk[layer][head] if self.d_qk is not None else self.d_head

    def n_params(self) -> int:
        """The exact number of parameters of ``Transformer(self)`` (a test checks it against the
        built model). With d, V, T, h, d_head, d_mlp as in the config and w the layer's stored
        query/key width (the widest head's d_qk; narrower heads are zero-padded):

            embeddings   V d (+ T d learned positions);  unembedding  d V + V;  final LayerNorm 2d
            per layer    ln1 2d + W_Q, W_K 2 h d w (merged: W_QK h d^2) + W_V, W_O 2 h d d_head
                         (+ b_Q, b_K 2 h w if factored, + b_V, b_O h d_head + d, with biases)
                         (+ ln2 2d + W_in, W_out 2 d d_mlp + b_in, b_out d_mlp + d with an MLP)

        LayerNorms count 0 with ``normalization = "none"``."""
        d, h = self.d_model, self.n_heads
        ln = 2 * d if self.normalization == "layernorm" else 0
        total = self.d_vocab * d + (self.n_ctx * d if self.positional == "learned" else 0)
        total += d * self.d_vocab + self.d_vocab + ln
        for layer in range(self.n_layers):
            if self.qk == "merged":
                qk = h * d * d
            else:
                w = self.qk_width(layer)
                qk = 2 * h * d * w + (2 * h * w if self.attn_bias else 0)
            total += ln + qk + 2 * h * d * self.d_head + (h * self.d_head + d if self.attn_bias else 0)
            if self.d_mlp > 0:
                total += ln + 2 * d * self.d_mlp + self.d_mlp + d
        return total

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        if not isinstance(raw, dict):
            raise ValueError("invalid model config: expected a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"invalid model config: unknown keys {unknown}")
        return cls(**raw)


class LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.b = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)


def _norm(cfg: ModelConfig) -> nn.Module:
    return LayerNorm(cfg.d_model, cfg.ln_eps) if cfg.normalization == "layernorm" else nn.Identity()


def attention_weights(scores: torch.Tensor, mask: torch.Tensor, entmax_alpha: float = 1.0) -> torch.Tensor:
    """Row-normalise masked scores. ``mask`` is True where a key is visible."""
    if entmax_alpha == 1.0:
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    import entmax  # optional architecture (issue: alpha-entmax at retrain time)

    # entmax needs finite inputs; a very negative score gets exactly zero weight.
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min / 4)
    if entmax_alpha == 2.0:
        return entmax.sparsemax(filled, dim=-1)
    if entmax_alpha == 1.5:
        return entmax.entmax15(filled, dim=-1)
    return entmax.entmax_bisect(filled, alpha=entmax_alpha, dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.names = block_names(layer, cfg.d_mlp > 0)
        h, d, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        if cfg.qk == "factored":
            w = cfg.qk_width(layer)
            self.W_Q = nn.Parameter(torch.empty(h, d, w))
            self.W_K = nn.Parameter(torch.empty(h, d, w))
            if cfg.attn_bias:
                self.b_Q = nn.Parameter(torch.zeros(h, w))
                self.b_K = nn.Parameter(torch.zeros(h, w))
            # 1/sqrt(d_qk) per head, a buffer so it follows .to(device)
            scale = torch.tensor([cfg.head_d_qk(layer, i) ** -0.5 for i in range(h)])
            self.register_buffer("qk_scale", scale.view(1, h, 1, 1), persistent=False)
        else:
            self.W_QK = nn.Parameter(torch.empty(h, d, d))
        self.W_V = nn.Parameter(torch.empty(h, d, dh))
        self.W_O = nn.Parameter(torch.empty(h, dh, d))
        if cfg.attn_bias:
            self.b_V = nn.Parameter(torch.zeros(h, dh))
            self.b_O = nn.Parameter(torch.zeros(d))

    def qk(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q, K) of every head for x = X [b, T, d_model], so that S = Q K^T / sqrt(d_qk).
        Factored: Q = X W_Q + b_Q, K = X W_K + b_K, [b, h, T, w] with w the stored (padded) width.
        Merged: Q = X W_QK [b, h, T, d_model] and K = X for every head (a view), no scale."""
        if self.cfg.qk == "merged":
            q = torch.einsum("bpd,hde->bhpe", x, self.W_QK)
            return q, x[:, None].expand_as(q)
        q = torch.einsum("bpd,hde->bhpe", x, self.W_Q)  # [b, h, T, w]
        k = torch.einsum("bpd,hde->bhpe", x, self.W_K)
        if self.cfg.attn_bias:
            q = q + self.b_Q[None, :, None, :]
            k = k + self.b_K[None, :, None, :]
        return q, k

    def forward(self, x: torch.Tensor, mask: torch.Tensor, hk: HookRun | None = None) -> torch.Tensor:
        """x = X [b, T, d_model] (the attention input), mask [T, T] True where a key is visible;
        the attention output [b, T, d_model]. ``hk`` sees q, k, v, S, A and z by name."""
        v = torch.einsum("bpd,hde->bhpe", x, self.W_V)  # [b, h, T, d_head]
        if self.cfg.attn_bias:
            v = v + self.b_V[None, :, None, :]
        if hk is None and self.cfg.qk == "merged":  # S = X W_QK X^T in one contraction
            S = torch.einsum("bqd,hde,bke->bhqk", x, self.W_QK, x)
        else:
            q, k = self.qk(x)
            k_given = k
            if hk is not None:
                n = self.names
                q, k, v = hk(n["q"], q), hk(n["k"], k), hk(n["v"], v)
            if self.cfg.qk == "factored":
                S = (q @ k.transpose(-1, -2)) * self.qk_scale  # [b, h, T, T]
            elif k is k_given:  # merged, K = X for every head (not replaced): one product per batch
                S = torch.einsum("bhqe,bke->bhqk", q, x)
            else:
                S = q @ k.transpose(-1, -2)
        if hk is not None:
            S = hk(self.names["attn_scores"], S)
        A = attention_weights(S, mask, self.cfg.entmax_alpha)
        if hk is not None:
            A = hk(self.names["pattern"], A)
        z = A @ v  # [b, h, T, d_head]
        if hk is not None:
            z = hk(self.names["z"], z)
        out = torch.einsum("bhqe,hed->bqd", z, self.W_O)
        if self.cfg.attn_bias:
            out = out + self.b_O
        return out


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.approximate = "tanh" if cfg.mlp_act == "gelu_tanh" else "none"
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x @ self.W_in + self.b_in, approximate=self.approximate) @ self.W_out + self.b_out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.names = block_names(layer, cfg.d_mlp > 0)
        self.ln1 = _norm(cfg)
        self.attn = Attention(cfg, layer)
        if cfg.d_mlp > 0:
            self.ln2 = _norm(cfg)
            self.mlp = MLP(cfg)

    def forward(self, resid: torch.Tensor, mask: torch.Tensor, hk: HookRun | None = None) -> torch.Tensor:
        if hk is None:  # the plain path: no hook state, nothing extra to do
            resid = resid + self.attn(self.ln1(resid), mask)
            if hasattr(self, "mlp"):
                resid = resid + self.mlp(self.ln2(resid))
            return resid
        n = self.names
        resid = hk(n["resid_pre"], resid)
        x = hk(n["attn_in"], self.ln1(resid))
        resid = resid + hk(n["attn_out"], self.attn(x, mask, hk))
        if hasattr(self, "mlp"):
            resid = hk(n["resid_mid"], resid)
            resid = resid + hk(n["mlp_out"], self.mlp(self.ln2(resid)))
        return hk(n["resid_post"], resid)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Module()
        self.embed.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        if cfg.positional == "learned":
            self.pos_embed = nn.Module()
            self.pos_embed.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg, l) for l in range(cfg.n_layers))
        self.ln_final = _norm(cfg)
        self.unembed = nn.Module()
        self.unembed.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab))
        self.unembed.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))
        self.register_buffer("causal", torch.tril(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool)), persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 style init: N(0, 0.02), output projections scaled by 1/sqrt(2 n_layers)."""
        out_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf.startswith("b_") or leaf == "b" or name.endswith("ln1.b") or name.endswith("ln2.b"):
                p.zero_()
            elif leaf == "w":
                p.fill_(1.0)
            elif leaf in ("W_O", "W_out"):
                p.normal_(0.0, out_std, generator=generator)
            else:
                p.normal_(0.0, 0.02, generator=generator)
        if self.cfg.d_qk is not None:
            self.zero_qk_padding()

    @torch.no_grad()
    def zero_qk_padding(self) -> None:
        """Zero the stored-but-unused W_Q/W_K columns of narrower heads."""
        for l, block in enumerate(self.blocks):
            for h in range(self.cfg.n_heads):
                w = self.cfg.head_d_qk(l, h)
                for name in ("W_Q", "W_K"):
                    getattr(block.attn, name)[h, :, w:] = 0
                if self.cfg.attn_bias:
                    block.attn.b_Q[h, w:] = 0
                    block.attn.b_K[h, w:] = 0

    def residual_input(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embedding plus positions, [batch, pos, d_model]."""
        T = tokens.shape[-1]
        if T > self.cfg.n_ctx:
            raise ValueError(f"sequence of {T} tokens exceeds n_ctx={self.cfg.n_ctx}")
        x = self.embed.W_E[tokens]
        if self.cfg.positional == "learned":
            x = x + self.pos_embed.W_pos[:T]
        return x

    def forward(self, tokens: torch.Tensor, cache: dict | None = None, hk: HookRun | None = None) -> torch.Tensor:
        """Logits [batch, pos, d_vocab] of tokens [batch, pos] (or [pos]). Pass a dict as ``cache``
        to record every activation under its name (``model(tokens, cache=cache)`` is
        ``run_with_cache`` writing into your dict; gradients flow through the cached tensors)."""
        if tokens.dim() == 1:
            tokens = tokens[None]
        if cache is not None and hk is None:
            hk = HookRun(cache=cache)
        T = tokens.shape[-1]
        resid = self.residual_input(tokens)
        mask = self.causal[:T, :T]
        for block in self.blocks:
            resid = block(resid, mask, hk)
        return self.ln_final(resid) @ self.unembed.W_U + self.unembed.b_U

    def hook_names(self) -> list[str]:
        """Every hook point's name, in the order the forward reaches them."""
        return [name for block in self.blocks for name in block.names.values()]

    def run_with_cache(self, tokens: torch.Tensor, names_filter: NamesFilter = None) -> tuple[torch.Tensor, dict]:
        """(logits, cache): ``cache[name]`` is the activation the forward used at each hook point
        kept by ``names_filter`` (None: all; a name, a list of names, or a predicate on names).
        Not detached: call under ``torch.no_grad()`` when no gradient is needed."""
        cache: dict = {}
        logits = self(tokens, hk=HookRun(cache=cache, keep=name_filter(names_filter, self.hook_names())))
        return logits, cache

    def run_with_hooks(
        self, tokens: torch.Tensor, fwd_hooks: list[tuple[str, Hook]] = (), cache: dict | None = None
    ) -> torch.Tensor:
        """Logits with ``fn(tensor, name)`` run at each named hook point of ``fwd_hooks``, in order;
        a returned tensor (same shape) replaces the activation for the rest of the forward, None
        keeps it. With ``cache`` (a dict), every activation is recorded after its hooks ran."""
        hooks: dict[str, list[Hook]] = {}
        for name, fn in fwd_hooks:
            hooks.setdefault(name, []).append(fn)
        check_names(hooks, self.hook_names())
        return self(tokens, hk=HookRun(hooks=hooks, cache=cache))

    def n_params(self) -> int:
        """The number of parameters, :meth:`ModelConfig.n_params`."""
        return self.cfg.n_params()
