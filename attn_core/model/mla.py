"""Multi-head latent attention (MLA: DeepSeek-V2 and V3) and the form of its heads (docs/maths.md).

For a layer's input X (rows x_i), with r_q = ``q_lora_rank``, r_kv = ``kv_lora_rank``, n = d_head
(qk_nope_head_dim), r = rotary_dim (qk_rope_head_dim) and per head h:

    c_q(i)  = RMSNorm(x_i W_DQ) = g_q(i) (x_i W_DQ) diag(w_q)     the query latent [r_q]
              (x_i itself, g_q = 1, without a query latent: V2-Lite)
    c_kv(j) = RMSNorm(x_j W_DKV) = g_kv(j) (x_j W_DKV) diag(w_kv)  the key/value latent [r_kv]
    q_i = [c_q(i) W_UQ^h,  a c_q(i) W_QR^h M(i)],  k_j = [c_kv(j) W_UK^h,  a x_j W_KR M(j)]
    v_j = c_kv(j) W_UV^h,  S_ij = s q_i k_j^T,  s = (n + r)^-1/2 (or ``attn_scale``)

(W_KR is one key for every head, rotated, not normed; M the rotation of ``rotary``, here on all r
dims, in the rotate-half layout: a family whose file interleaves the pairs permutes the columns on
load; a = YaRN's attention factor on cos and sin, 1 without YaRN.) So every head's score splits in
two terms:

    S_ij = g_q(i) g_kv(j) x_i B^h x_j^T + g_q(i) x_i B_R^h(j - i) x_j^T
    B^h        = s W_DQ diag(w_q) W_UQ^h (W_UK^h)^T diag(w_kv) W_DKV^T    (d x d, rank <= n)
    B_R^h(dt)  = a^2 s W_DQ diag(w_q) W_QR^h R(dt) W_KR^T                 (d x d, rank <= r)

B^h is the absorbed B in residual-stream terms (``core``), the latent gains as QK-norm's
(``gains``); on the latents it is B_lat^h = s W_UQ^h (W_UK^h)^T (r_q x r_kv: ``latent``), what
inference multiplies; B_R the rotary term (``rope_core``). :class:`MLAScore` is the
:class:`attn_core.model.form.BilinearScore` of such a layer: its ``left``/``right`` are B^h's
residual-stream factors, its ``scores`` the model's own. An edit of B^h (:meth:`MLAScore.edited`)
is written into the head's own up-projection W_UQ^h (q_b_proj's rows of that head), so no other
head's B changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from attn_core.hooks import HookRun, block_names
from attn_core.model import rotary
from attn_core.model.config import ModelConfig
from attn_core.model.form import BilinearScore, Visibility
from attn_core.model.layers import RMSNorm

LATENT_EPS = 1e-6  # the latent norms' epsilon (DeepSeek's q_a_layernorm, kv_a_layernorm)
EXPLICIT = ("attn_scores", "pattern")
UP = ("W_UQ", "W_QR", "W_UK")  # each head's own rows of the up-projections (a form writes these)


def _latent(x: torch.Tensor, down: torch.Tensor | None, w: torch.Tensor | None) -> torch.Tensor:
    return x if down is None else F.rms_norm(x @ down, (down.shape[-1],), w, LATENT_EPS)


def _gain(x: torch.Tensor, down: torch.Tensor | None) -> torch.Tensor:
    """The latent norm's per-token gain [..., T] (ones without a latent)."""
    if down is None:
        return x.new_ones(x.shape[:-1])
    t = x @ down.to(x.dtype)
    return (t.pow(2).mean(-1) + LATENT_EPS).rsqrt()


@dataclass
class MLAScore(BilinearScore):
    """The form of an MLA layer (module doc): the down-projections and latent norm weights
    (``down_q``/``w_q`` None without a query latent), each head's up-projections ``up_q``
    [h, r_q, n], ``rope_q`` [h, r_q, r], ``up_k`` [h, r_kv, n], and the shared rotary key
    ``rope_k`` [d, r]; ``left``/``right`` are B's residual-stream factors [h, d, n]."""

    down_q: torch.Tensor | None = None
    w_q: torch.Tensor | None = None
    up_q: torch.Tensor | None = None
    rope_q: torch.Tensor | None = None
    down_kv: torch.Tensor | None = None
    w_kv: torch.Tensor | None = None
    up_k: torch.Tensor | None = None
    rope_k: torch.Tensor | None = None

    def _query_down(self) -> torch.Tensor | None:
        return None if self.down_q is None else self.down_q * self.w_q

    def core(self, offset: int = 0, augmented: bool = False):
        """B of the selected head(s) in residual-stream terms (the no-position term, the same at
        every offset); ``augmented`` adds a zero row (MLA has no query/key biases)."""
        from attn_core.bilinear.form import QKForm

        L, R = self.left * self.scale.view(-1, 1, 1), self.right
        if augmented:
            L, R = F.pad(L, (0, 0, 0, 1)), F.pad(R, (0, 0, 0, 1))
        form = QKForm(left=L, right=R)
        return form if self.head is None else form[self.head]

    def latent(self):
        """B_lat = s W_UQ W_UK^T on the latents (r_q x r_kv; d x r_kv without a query latent)."""
        from attn_core.bilinear.form import QKForm

        form = QKForm(left=self.up_q * self.scale.view(-1, 1, 1), right=self.up_k)
        return form if self.head is None else form[self.head]

    def rope_core(self, offset: int = 0):
        """B_R(offset), the rotary term, in residual-stream terms (its gain: g_q on the query side
        only), YaRN's attention factor squared included."""
        from attn_core.bilinear.form import QKForm

        down = self._query_down()
        left = self.rope_q if down is None else torch.einsum("dr,hre->hde", down, self.rope_q)
        R = rotary.offset_rotation(self.cfg, offset, self.cfg.rotary_dims, layer=self.layer).to(left)
        right = self.rope_k.expand(self.n_heads, *self.rope_k.shape)
        a2 = rotary.attention_factor(self.cfg, self.layer) ** 2
        form = QKForm(left=(left @ R) * (self.scale.view(-1, 1, 1) * a2), right=right)
        return form if self.head is None else form[self.head]

    def gains(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g_q, g_kv) [..., h, T] (or [..., T] for one head): the latent norms' per-token gains, the
        same for every head of a token."""
        shape = (*X.shape[:-2], self.n_heads, X.shape[-2])
        g_q = _gain(X, self.down_q).unsqueeze(-2).expand(shape)
        g_kv = _gain(X, self.down_kv).unsqueeze(-2).expand(shape)
        return self._pick(g_q, -2), self._pick(g_kv, -2)

    def queries_keys(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q, K) [..., h, T, n + r] as the model forms them: [no-position | rotated] parts."""
        c_q, c_kv = _latent(X, self.down_q, self.w_q), _latent(X, self.down_kv, self.w_kv)
        gain = rotary.attention_factor(self.cfg, self.layer)
        return mla_qk(X, c_q, c_kv, self.up_q, self.rope_q, self.up_k, self.rope_k, self.inv_freq, gain)

    def edited(self, delta: torch.Tensor) -> MLAScore:
        """This one head's form with B changed by ``delta`` [d, d], a matrix within B's column and
        row spaces (a change of its singular values): written into W_UQ^h only, as
        W_UQ^h + pinv(W_DQ diag(w_q)) delta pinv(R^T) / s, R = W_DKV diag(w_kv) W_UK^h (float64)."""
        if self.head is None:
            raise ValueError("an edit needs one head (form[head])")
        h, s = self.head, float(self.scale[self.head])
        R = self.right[h].detach().double()
        change = delta.double() @ torch.linalg.pinv(R.T) / s  # [d, n]
        down = self._query_down()
        if down is not None:
            change = torch.linalg.pinv(down.detach().double()) @ change  # [r_q, n]
        up = self.up_q.detach().clone()
        up[h] = (up[h].double() + change).to(up.dtype)
        return self.replace(up_q=up)


def mla_qk(x, c_q, c_kv, up_q, rope_q, up_k, rope_k, inv_freq, gain=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, K) [..., h, T, n + r] from the latents c_q, c_kv of x [..., T, d] (module doc; ``gain``:
    YaRN's attention factor on cos and sin)."""
    q_n = torch.einsum("...pr,hre->...hpe", c_q, up_q)
    q_r = torch.einsum("...pr,hre->...hpe", c_q, rope_q)
    k_n = torch.einsum("...pr,hre->...hpe", c_kv, up_k)
    k_r = (x @ rope_k).unsqueeze(-3)  # one rotary key for every head
    cos, sin = rotary.cos_sin(inv_freq, torch.arange(x.shape[-2], device=x.device), gain)
    q_r, k_r = rotary.rotate(q_r, cos, sin), rotary.rotate(k_r, cos, sin)
    return torch.cat([q_n, q_r], -1), torch.cat([k_n, k_r.expand(*k_n.shape[:-1], k_r.shape[-1])], -1)


class MLAttention(nn.Module):
    """An MLA layer (module doc). Parameters: ``W_DQ`` [d, r_q] and ``q_latent_norm`` (with a query
    latent), ``W_UQ`` [h, r_q, n], ``W_QR`` [h, r_q, r] (r_q = d without a query latent),
    ``W_DKV`` [d, r_kv], ``kv_latent_norm``, ``W_KR`` [d, r], ``W_UK`` [h, r_kv, n], ``W_UV``
    [h, r_kv, d_v], ``W_O`` [h, d_v, d]. Hook points as :class:`attn_core.model.attention.Attention`'s
    (q and k [b, h, T, n + r], v [b, h, T, d_v])."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.names = block_names(layer, cfg.d_mlp > 0, cfg.parallel_attn)
        h, d, n, r = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.rotary_dims
        rq, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
        if rq:
            self.W_DQ = nn.Parameter(torch.empty(d, rq))
            self.q_latent_norm = RMSNorm(rq, LATENT_EPS)
        self.W_UQ = nn.Parameter(torch.empty(h, rq or d, n))
        self.W_QR = nn.Parameter(torch.empty(h, rq or d, r))
        self.W_DKV = nn.Parameter(torch.empty(d, rkv))
        self.kv_latent_norm = RMSNorm(rkv, LATENT_EPS)
        self.W_KR = nn.Parameter(torch.empty(d, r))
        self.W_UK = nn.Parameter(torch.empty(h, rkv, n))
        self.W_UV = nn.Parameter(torch.empty(h, rkv, cfg.d_v))
        self.W_O = nn.Parameter(torch.empty(h, cfg.d_v, d))
        self.reset_buffers()

    @property
    def scale(self) -> float:
        return self.cfg.attn_scale or (self.cfg.d_head + self.cfg.rotary_dims) ** -0.5

    def reset_buffers(self) -> None:
        """The rotary frequencies (non-persistent, made again on a model built on the meta device)."""
        self.register_buffer("inv_freq", rotary.inverse_frequencies(self.cfg, self.layer), persistent=False)

    def _down_q(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return (self.W_DQ, self.q_latent_norm.w) if self.cfg.q_lora_rank else (None, None)

    def form(self, head: int | None = None) -> MLAScore:
        """The layer's :class:`MLAScore` (views of the parameters, differentiable)."""
        cfg = self.cfg
        down_q, w_q = self._down_q()
        up_q = self.W_UQ
        left = up_q if down_q is None else torch.einsum("dr,hre->hde", down_q * w_q, up_q)
        right = torch.einsum("dr,hre->hde", self.W_DKV * self.kv_latent_norm.w, self.W_UK)
        form = MLAScore(
            cfg,
            self.layer,
            left=left,
            right=right,
            norm="latent",
            eps=LATENT_EPS,
            scale=self.W_UK.new_full((cfg.n_heads,), self.scale),
            inv_freq=self.inv_freq,
            down_q=down_q,
            w_q=w_q,
            up_q=up_q,
            rope_q=self.W_QR,
            down_kv=self.W_DKV,
            w_kv=self.kv_latent_norm.w,
            up_k=self.W_UK,
            rope_k=self.W_KR,
        )
        return form if head is None else form[head]

    @torch.no_grad()
    def set_form(self, new: BilinearScore, head: int | None = None) -> None:
        """Write a form's per-head up-projections (W_UQ^h, W_QR^h, W_UK^h) back, for every head or
        ``head`` (from ``new``'s selected head, or its head ``head``); the down-projections, the
        latent norms and the shared rotary key are every head's and stay as they are."""
        if not isinstance(new, MLAScore):
            raise ValueError("an MLA layer takes an MLA form back (its heads' up-projections)")
        for h in range(self.cfg.n_heads) if head is None else [head]:
            src = h if new.head is None else new.head
            for name, t in zip(UP, (new.up_q, new.rope_q, new.up_k)):
                getattr(self, name)[h] = t[src].to(getattr(self, name).dtype)

    def per_head(self, name: str) -> torch.Tensor:
        """``W_V`` [h, d, d_v]: each head's value map in residual-stream terms, W_DKV diag(w_kv) W_UV^h
        (a key's latent gain g_kv(j) multiplies it, as a norm's does; OV circuits leave it out);
        ``W_O`` as stored."""
        if name == "W_V":
            return torch.einsum("dr,hre->hde", self.W_DKV * self.kv_latent_norm.w, self.W_UV)
        if name == "W_O":
            return self.W_O
        raise KeyError(f"an MLA layer has no per-head {name}")

    def qk(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q, K) [b, h, T, n + r] of x [b, T, d] (unscaled)."""
        down_q, w_q = self._down_q()
        c_q, c_kv = _latent(x, down_q, w_q), _latent(x, self.W_DKV, self.kv_latent_norm.w)
        gain = rotary.attention_factor(self.cfg, self.layer)
        return mla_qk(x, c_q, c_kv, self.W_UQ, self.W_QR, self.W_UK, self.W_KR, self.inv_freq, gain)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Visibility, hk: HookRun | None = None) -> torch.Tensor:
        """The attention output [b, T, d] of x [b, T, d] (as :meth:`Attention.forward`)."""
        c_kv = _latent(x, self.W_DKV, self.kv_latent_norm.w)
        v = torch.einsum("bpr,hre->bhpe", c_kv, self.W_UV)
        q, k = self.qk(x)
        n = self.names
        if hk is not None:
            q, k, v = hk(n["q"], q), hk(n["k"], k), hk(n["v"], v)
        if self.cfg.entmax_alpha == 1.0 and (hk is None or not hk.touches(n[e] for e in EXPLICIT)):
            if isinstance(mask, Visibility) and mask.causal:
                z = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
            else:
                dense = mask.dense() if isinstance(mask, Visibility) else mask
                z = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=self.scale)
        else:
            from attn_core.model.attention import attention_weights

            dense = mask.dense() if isinstance(mask, Visibility) else mask
            S = (q @ k.transpose(-1, -2)) * self.scale
            if hk is not None:
                S = hk(n["attn_scores"], S)
            A = attention_weights(S, dense, self.cfg.entmax_alpha)
            if hk is not None:
                A = hk(n["pattern"], A)
            z = A @ v
        if hk is not None:
            z = hk(n["z"], z)
        return torch.einsum("bhqe,hed->bqd", z, self.W_O)
