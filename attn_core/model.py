"""The toy transformer: decoder-only, pre-LayerNorm, in the spirit of nanoGPT's model.py.

Conventions (shared/DESIGN.md): row vectors; for layer l the attention input is
``X = ln1(residual)`` (or the residual itself when ``normalization == "none"``) and, per head,

    Q = X W_Q + b_Q,  K = X W_K + b_K,  S = Q K^T / sqrt(d_qk),  A = softmax_row(S + mask)

A *merged* head stores ``W_QK = B`` (d_model x d_model) directly, so ``S = X W_QK X^T``.

Parameter names follow TransformerLens' state dict, so ``state_dict()`` is the checkpoint.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from attn_core.hooks import act_name

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
    d_qk: Optional[list[list[int]]] = None
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
            check(isinstance(v, int) and not isinstance(v, bool), f"{name} must be an integer, got {v!r}")
            top = MAX_VOCAB if name == "d_vocab" else MAX_DIM
            check(1 <= v <= top, f"{name}={v} is outside 1..{top}")
        check(self.n_layers <= MAX_LAYERS, f"n_layers={self.n_layers} exceeds {MAX_LAYERS}")
        check(isinstance(self.d_mlp, int) and 0 <= self.d_mlp <= 4 * MAX_DIM, f"d_mlp={self.d_mlp!r} must be 0..{4 * MAX_DIM}")
        check(self.normalization in NORMALIZATIONS, f"normalization must be one of {NORMALIZATIONS}")
        check(self.positional in POSITIONALS, f"positional must be one of {POSITIONALS}")
        check(self.qk in QK_KINDS, f"qk must be one of {QK_KINDS}")
        check(self.mlp_act in MLP_ACTS, f"mlp_act must be one of {MLP_ACTS}")
        check(isinstance(self.attn_bias, bool), "attn_bias must be true or false")
        check(isinstance(self.ln_eps, (int, float)) and 0 < self.ln_eps < 1, "ln_eps must be in (0, 1)")
        check(isinstance(self.entmax_alpha, (int, float)) and 1.0 <= self.entmax_alpha <= 2.0,
              f"entmax_alpha={self.entmax_alpha!r} must be in [1, 2]")
        if self.d_qk is not None:
            check(self.qk == "factored", "d_qk only applies to factored heads")
            check(isinstance(self.d_qk, list) and len(self.d_qk) == self.n_layers,
                  "d_qk must hold one list per layer")
            for row in self.d_qk:
                check(isinstance(row, list) and len(row) == self.n_heads, "d_qk must hold one width per head")
                for w in row:
                    check(isinstance(w, int) and 1 <= w <= MAX_DIM, f"d_qk width {w!r} is outside 1..{MAX_DIM}")
        n_params = self.n_params_estimate()
        check(n_params <= 200_000_000, f"about {n_params:,} parameters is too large for a toy model")

    def qk_width(self, layer: int) -> int:
        """Stored width of W_Q/W_K in this layer (the widest head)."""
        return max(self.d_qk[layer]) if self.d_qk is not None else self.d_head

    def head_d_qk(self, layer: int, head: int) -> int:
        return self.d_qk[layer][head] if self.d_qk is not None else self.d_head

    def n_params_estimate(self) -> int:
        d, h = self.d_model, self.n_heads
        qk = h * d * d if self.qk == "merged" else 2 * h * d * self.d_head
        per_layer = qk + 2 * h * d * self.d_head + 2 * self.d_mlp * d + 4 * d
        return self.n_layers * per_layer + 2 * self.d_vocab * d + self.n_ctx * d

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
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

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-softmax scores S, [batch, head, query, key]; x is [batch, pos, d_model]."""
        if self.cfg.qk == "merged":
            return torch.einsum("bqd,hde,bke->bhqk", x, self.W_QK, x)
        q = torch.einsum("bpd,hde->bhpe", x, self.W_Q)  # [b, h, pos, d_qk]
        k = torch.einsum("bpd,hde->bhpe", x, self.W_K)
        if self.cfg.attn_bias:
            q = q + self.b_Q[None, :, None, :]
            k = k + self.b_K[None, :, None, :]
        return (q @ k.transpose(-1, -2)) * self.qk_scale

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: Optional[dict] = None) -> torch.Tensor:
        S = self.scores(x)  # [b, h, q, k]
        A = attention_weights(S, mask, self.cfg.entmax_alpha)
        v = torch.einsum("bpd,hde->bhpe", x, self.W_V)  # [b, h, pos, d_head]
        if self.cfg.attn_bias:
            v = v + self.b_V[None, :, None, :]
        z = A @ v  # [b, h, q, d_head]
        out = torch.einsum("bhqe,hed->bqd", z, self.W_O)
        if self.cfg.attn_bias:
            out = out + self.b_O
        if cache is not None:
            cache[act_name("attn_in", self.layer)] = x
            cache[act_name("attn_scores", self.layer)] = S
            cache[act_name("pattern", self.layer)] = A
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
        self.ln1 = _norm(cfg)
        self.attn = Attention(cfg, layer)
        if cfg.d_mlp > 0:
            self.ln2 = _norm(cfg)
            self.mlp = MLP(cfg)

    def forward(self, resid: torch.Tensor, mask: torch.Tensor, cache: Optional[dict]) -> torch.Tensor:
        resid = resid + self.attn(self.ln1(resid), mask, cache)
        if hasattr(self, "mlp"):
            resid = resid + self.mlp(self.ln2(resid))
        return resid


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
        self.register_buffer("causal", torch.tril(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool)),
                             persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
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

    def forward(self, tokens: torch.Tensor, cache: Optional[dict] = None) -> torch.Tensor:
        """Logits [batch, pos, d_vocab]. Pass a dict as ``cache`` to record, per layer,
        the activations named by :func:`attn_core.hooks.act_name` (``attn_in`` = X, ``attn_scores`` = S, ``pattern`` = A)."""
        if tokens.dim() == 1:
            tokens = tokens[None]
        T = tokens.shape[-1]
        resid = self.residual_input(tokens)
        mask = self.causal[:T, :T]
        for block in self.blocks:
            resid = block(resid, mask, cache)
        return self.ln_final(resid) @ self.unembed.W_U + self.unembed.b_U

    def run_with_cache(self, tokens: torch.Tensor) -> tuple[torch.Tensor, dict]:
        cache: dict = {}
        logits = self(tokens, cache=cache)
        return logits, cache

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
