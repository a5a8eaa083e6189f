"""Multi-head attention (docs/maths.md). For layer l, with X the attention input (row vectors),
per query head h and its key/value head g = kv_head(h) (g = h without grouped-query attention):

    Q = X W_Q[h] + b_Q[h],  K = X W_K[g] + b_K[g],  V = X W_V[g] + b_V[g]
    with QK-norm: Q <- rms(Q) * w_q, K <- rms(K) * w_k, per head or across the heads (before the rotation)
    with rotary positions: Q_i <- Q_i M(i), K_j <- K_j M(j) (attn_core/model/rotary.py; not in a NoPE layer)
    S = Q K^T * s (s = 1/sqrt(d_qk), or ``attn_scale``),  with a cap c: S <- c tanh(S / c)
    A = softmax_row(S + causal (and sliding-window) mask)
    with learned sinks (gpt-oss): A_ij = exp(S_ij) / (exp(z_h) + sum_j' exp(S_ij')), z_h the head's sink
    logit (``sinks``): a column no value reads, so a row sums to 1 - sigmoid(z_h - logsumexp_j S_ij)

A *merged* head stores ``W_QK = B`` (d_model x d_model) directly, so ``S = X W_QK X^T``.
Keys and values are stored once per key/value head ([n_kv_heads, ...]); ``per_head`` gives a
weight repeated per query head, which is what the hook points ``q``, ``k``, ``v`` carry too (after
the rotation), so that S = Q K^T / sqrt(d_qk) holds head by head.

The forward is given the keys each query sees as a :class:`Visibility` (causal, and a sliding
window), not as a T x T mask: the fused kernel takes the causal mask as ``is_causal`` and a
sliding window a block of :data:`WINDOW_BLOCK` queries at a time (each block's mask spans only the
keys its queries see), so a long input costs memory linear in T. The dense mask is made only
where S is formed anyway (:meth:`Attention._explicit`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from attn_core.hooks import HookRun, block_names
from attn_core.model import rotary
from attn_core.model.config import ModelConfig
from attn_core.model.form import BilinearScore, Visibility, attention_weights
from attn_core.model.layers import RMSNorm

SHARED = ("W_K", "b_K", "W_V", "b_V")  # stored per key/value head
EXPLICIT = ("attn_scores", "pattern")  # reading or changing these needs S and A formed
WINDOW_BLOCK = 512  # queries per block of a sliding-window layer's fused attention
__all__ = ["Attention", "attention_weights"]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.names = block_names(layer, cfg.d_mlp > 0, cfg.parallel_attn)
        h, g, d, dh = cfg.n_heads, cfg.kv_heads, cfg.d_model, cfg.d_head
        self.group = h // g
        if cfg.qk == "factored":
            w = cfg.qk_width(layer)
            self.W_Q = nn.Parameter(torch.empty(h, d, w))
            self.W_K = nn.Parameter(torch.empty(g, d, w))
            if cfg.attn_bias:
                self.b_Q = nn.Parameter(torch.zeros(h, w))
                self.b_K = nn.Parameter(torch.zeros(g, w))
        else:
            self.W_QK = nn.Parameter(torch.empty(h, d, d))
        if cfg.attn_sinks:  # one learned logit per head in the softmax's denominator (gpt-oss)
            self.sinks = nn.Parameter(torch.zeros(h))
        if cfg.qk_norm != "none":  # RMSNorm of q and k: over each head (d_head) or all of them
            q_w, k_w = (dh, dh) if cfg.qk_norm == "head" else (h * dh, g * dh)
            self.q_norm, self.k_norm = RMSNorm(q_w, cfg.ln_eps), RMSNorm(k_w, cfg.ln_eps)
        self.W_V = nn.Parameter(torch.empty(g, d, dh))
        self.W_O = nn.Parameter(torch.empty(h, dh, d))
        if cfg.attn_bias:
            self.b_V = nn.Parameter(torch.zeros(g, dh))
            self.b_O = nn.Parameter(torch.zeros(d))
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """(Re)make the buffers computed from the config (a model built on the meta device needs
        them made for real): 1/sqrt(d_qk) per head and the rotary frequencies. Non-persistent, so
        no checkpoint holds them, and they follow ``.to(device)``."""
        cfg = self.cfg
        if cfg.qk == "factored":
            self.register_buffer("qk_scale", self._scales(torch.get_default_dtype()), persistent=False)
        if cfg.rotary_layer(self.layer):
            self.register_buffer("inv_freq", rotary.inverse_frequencies(cfg, self.layer), persistent=False)
        self.rope_gain = rotary.attention_factor(cfg, self.layer)

    def _scales(self, dtype: torch.dtype, device=None) -> torch.Tensor:
        """1/sqrt(d_qk) (or ``attn_scale``) per head, [1, h, 1, 1], rounded once into ``dtype`` from float64."""
        fixed = self.cfg.attn_scale
        exact = torch.tensor(
            [fixed or self.cfg.head_d_qk(self.layer, i) ** -0.5 for i in range(self.cfg.n_heads)], dtype=torch.float64
        )
        return exact.to(device=device, dtype=dtype).view(1, self.cfg.n_heads, 1, 1)

    def _apply(self, fn, recurse: bool = True):
        """After ``.to`` / ``.double()`` / ``.float()``, the scales are made again in the new dtype
        (a float32 1/sqrt(d) cast to float64 would stay float32-rounded)."""
        out = super()._apply(fn, recurse)
        scale = getattr(self, "qk_scale", None)
        if scale is not None and scale.device.type != "meta":
            self.qk_scale = self._scales(scale.dtype, scale.device)
        return out

    def per_head(self, name: str) -> torch.Tensor:
        """Parameter ``name`` with one entry per query head: W_K, b_K, W_V and b_V are repeated
        over the query heads that share them (differentiable); others are returned as stored."""
        p = getattr(self, name)
        return p.repeat_interleave(self.group, dim=0) if name in SHARED and self.group > 1 else p

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """[b, kv_heads, T, e] -> [b, n_heads, T, e]."""
        return t.repeat_interleave(self.group, dim=1) if self.group > 1 else t

    def qk(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q, K) of every query head for x = X [b, T, d_model], so that S = Q K^T / sqrt(d_qk).
        Factored: Q = X W_Q + b_Q, K = X W_K + b_K, [b, h, T, w] with w the stored (padded) width,
        rotated by position with rotary positions. Merged: Q = X W_QK [b, h, T, d_model] and K = X
        for every head (a view), no scale."""
        if self.cfg.qk == "merged":
            q = torch.einsum("bpd,hde->bhpe", x, self.W_QK)
            return q, x[:, None].expand_as(q)
        q = torch.einsum("bpd,hde->bhpe", x, self.W_Q)  # [b, h, T, w]
        k = torch.einsum("bpd,gde->bgpe", x, self.W_K)  # [b, g, T, w]
        if self.cfg.attn_bias:
            q = q + self.b_Q[None, :, None, :]
            k = k + self.b_K[None, :, None, :]
        if self.cfg.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        elif self.cfg.qk_norm == "all":  # one RMS over all heads of a token: [b, n, T, w] <-> [b, T, n w]
            q, k = _across(self.q_norm, q), _across(self.k_norm, k)
        if hasattr(self, "inv_freq"):
            cos, sin = rotary.cos_sin(self.inv_freq, torch.arange(x.shape[1], device=x.device), self.rope_gain)
            q, k = rotary.rotate(q, cos, sin), rotary.rotate(k, cos, sin)
        return q, self._heads(k)

    def form(self, head: int | None = None) -> BilinearScore:
        """The layer's scores as a :class:`attn_core.model.form.BilinearScore` (every head, or
        ``head``'s): views of the parameters, differentiable."""
        cfg, has_bias = self.cfg, self.cfg.attn_bias and self.cfg.qk == "factored"
        norm = cfg.qk_norm if cfg.qk == "factored" else "none"
        form = BilinearScore(
            cfg,
            self.layer,
            left=self.W_Q if cfg.qk == "factored" else None,
            right=self.per_head("W_K") if cfg.qk == "factored" else None,
            dense=self.W_QK if cfg.qk == "merged" else None,
            bias_q=self.b_Q if has_bias else None,
            bias_k=self.per_head("b_K") if has_bias else None,
            norm=norm,
            norm_q=self.q_norm.w if norm != "none" else None,
            norm_k=self.k_norm.w if norm != "none" else None,
            eps=cfg.ln_eps,
            scale=self.qk_scale.view(-1) if cfg.qk == "factored" else self.W_QK.new_ones(cfg.n_heads),
            inv_freq=getattr(self, "inv_freq", None),
            window=cfg.window(self.layer),
            cap=cfg.attn_softcap,
            sink=getattr(self, "sinks", None),
        )
        return form if head is None else form[head]

    @torch.no_grad()
    def set_form(self, new: BilinearScore, head: int | None = None) -> None:
        """Write a form's B back into this layer: its factors and biases (or dense B), for every
        head or into ``head`` (from ``new``'s selected head, or its head ``head``), and with QK-norm
        across heads the query head's own slice of the q_norm weight (a per-head norm's weight is
        the whole layer's: not written). A key head shared by several query heads takes the factor
        of the query head written last."""
        heads = range(self.cfg.n_heads) if head is None else [head]
        if (new.dense is not None) != (self.cfg.qk == "merged"):
            raise ValueError("the new form is merged and this layer factored, or the other way round")
        for h in heads:
            src = h if new.head is None else new.head
            if new.sink is not None and self.cfg.attn_sinks:
                self.sinks[h] = new.sink[src].to(self.sinks.dtype)
            if new.dense is not None:
                self.W_QK[h] = new.dense[src].to(self.W_QK.dtype)
                continue
            g = self.cfg.kv_head(h)
            w = min(self.W_Q.shape[-1], new.left.shape[-1])
            self.W_Q[h, :, :w] = new.left[src, :, :w].to(self.W_Q.dtype)
            self.W_K[g, :, :w] = new.right[src, :, :w].to(self.W_K.dtype)
            if new.bias_q is not None and self.cfg.attn_bias:
                self.b_Q[h, :w] = new.bias_q[src, :w].to(self.b_Q.dtype)
                self.b_K[g, :w] = new.bias_k[src, :w].to(self.b_K.dtype)
            if self.cfg.qk_norm == "all" and new.norm == "all":
                dh = self.cfg.d_head
                self.q_norm.w[h * dh : (h + 1) * dh] = new.norm_q[src * dh : (src + 1) * dh].to(self.q_norm.w.dtype)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Visibility, hk: HookRun | None = None) -> torch.Tensor:
        """x = X [b, T, d_model] (the attention input), mask [T, T] True where a key is visible
        (or the :class:`Visibility` it stands for);
        the attention output [b, T, d_model]. ``hk`` sees q, k, v, S, A and z by name; S and A
        are formed only when it reads or changes them (else the fused kernel runs)."""
        v = torch.einsum("bpd,gde->bgpe", x, self.W_V)  # [b, g, T, d_head]
        if self.cfg.attn_bias:
            v = v + self.b_V[None, :, None, :]
        v = self._heads(v)
        if self._fast and (hk is None or not hk.touches(self.names[n] for n in EXPLICIT)):
            z = self._fused(x, v, mask, hk)
        else:
            z = self._explicit(x, v, mask, hk)
        out = torch.einsum("bhqe,hed->bqd", z, self.W_O)
        if self.cfg.attn_bias:
            out = out + self.b_O
        return out

    @property
    def _fast(self) -> bool:
        """Softmax heads of one scale, uncapped, without learned sinks: their Z can come from the fused
        attention kernel (a soft cap changes S before the softmax, a sink its denominator, which the
        kernel cannot)."""
        cfg = self.cfg
        return cfg.entmax_alpha == 1.0 and cfg.d_qk is None and cfg.attn_softcap is None and not cfg.attn_sinks

    def _fused(
        self, x: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | Visibility, hk: HookRun | None
    ) -> torch.Tensor:
        """Z = softmax(S + mask) V by ``scaled_dot_product_attention``, S never materialised (the
        same maths as :meth:`_explicit`, equal to float rounding). ``hk`` sees (and may replace)
        q, k, v and z, which the kernel keeps for its backward anyway: caching them costs no
        memory. A :class:`Visibility` is never made dense: causal is the kernel's ``is_causal``,
        a sliding window runs :data:`WINDOW_BLOCK` queries at a time against the keys they see."""
        q, k = self.qk(x)
        if hk is not None:
            n = self.names
            q, k, v = hk(n["q"], q), hk(n["k"], k), hk(n["v"], v)
        scale = 1.0 if self.cfg.qk == "merged" else self.cfg.attn_scale or self.cfg.d_head**-0.5
        T = x.shape[1]
        if isinstance(mask, Visibility):
            if mask.causal:
                z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
            elif T <= WINDOW_BLOCK:
                z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense(), scale=scale)
            else:
                z = _windowed(q, k, v, mask, scale)
        elif self.cfg.window(self.layer) == 0 and mask.shape == (T, T):  # the causal mask itself
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return z if hk is None else hk(self.names["z"], z)

    def _explicit(
        self, x: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | Visibility, hk: HookRun | None
    ) -> torch.Tensor:
        """Z with S and A computed (and shown to ``hk`` by name)."""
        if isinstance(mask, Visibility):
            mask = mask.dense()
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
        cap = self.cfg.attn_softcap
        if cap is not None:  # as Gemma 2 computes it: S / c, tanh, * c
            S = torch.tanh(S / cap) * cap
        if hk is not None:
            S = hk(self.names["attn_scores"], S)
        A = attention_weights(S, mask, self.cfg.entmax_alpha, getattr(self, "sinks", None))
        if hk is not None:
            A = hk(self.names["pattern"], A)
        z = A @ v  # [b, h, T, d_head]
        if hk is not None:
            z = hk(self.names["z"], z)
        return z


def _across(norm: nn.Module, t: torch.Tensor) -> torch.Tensor:
    """``norm`` over all heads of each token: t [b, n, T, w] as [b, T, n w], normed, and back."""
    b, n, T, w = t.shape
    return norm(t.transpose(1, 2).reshape(b, T, n * w)).reshape(b, T, n, w).transpose(1, 2)


def _windowed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vis: Visibility, scale: float) -> torch.Tensor:
    """Sliding-window attention a block of :data:`WINDOW_BLOCK` queries at a time: queries
    q0..q1-1 against keys q0-window+1..q1-1 only, with that block's mask (differentiable)."""
    T, out = q.shape[-2], []
    for q0 in range(0, T, WINDOW_BLOCK):
        q1 = min(T, q0 + WINDOW_BLOCK)
        k0 = max(0, q0 - vis.window + 1)
        mask = vis.block(q0, q1, k0, q1)
        out.append(
            F.scaled_dot_product_attention(
                q[..., q0:q1, :], k[..., k0:q1, :], v[..., k0:q1, :], attn_mask=mask, scale=scale
            )
        )
    return torch.cat(out, dim=-2)
