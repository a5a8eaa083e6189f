"""A head's score as a bilinear form: everything one attention layer's scores need, in one object.

For a layer's input X (rows x_i) and query head h (key head g = kv_head(h)), the attention module
(:class:`attn_core.model.attention.Attention`) computes

    q_i = x_i W_Q + b_Q,  k_j = x_j W_K + b_K                 (the factors ``left``, ``right``; biases)
    with QK-norm: q_i <- g_q(i) q_i * w_q, k_j <- g_k(j) k_j * w_k,  g = 1/sqrt(mean(t^2) + eps)
                  over the head (``norm = "head"``) or over all heads of the token (``"all"``)
    with rotary positions: q_i <- q_i M(i), k_j <- k_j M(j)     (``inv_freq``; None in a NoPE layer)
        (YaRN: times its attention factor a on the rotated dims of each; B~ carries a^2 there)
    S_ij = s q_i k_j^T                                          (``scale`` s per head)
    with a soft cap c: S_ij <- c tanh(S_ij / c)                 (``cap``)
    visible keys: j <= i, and i - j < window                    (``window``, 0: none)
    with a learned sink z (gpt-oss): A_ij = exp S_ij / (exp z + sum_j' exp S_ij')   (``sink``, [h])

The sink is outside B: no key carries it, so it is a share of every row's mass (1 - sum_j A_ij)
that no value reads (:meth:`BilinearScore.weights`, :meth:`BilinearScore.sink_share`).

A *merged* head stores B itself (``dense`` = W_QK) and S = X B X^T. :class:`BilinearScore`
holds these, differentiably (views of the module's parameters), for every head of a layer and,
with ``head`` set, answers for that head alone. :meth:`BilinearScore.core` is B~ as a
:class:`attn_core.model.qk_form.QKForm` (the norm weights and the scale folded in, at an offset
for rotary heads), :meth:`BilinearScore.gains` the per-token gains, :meth:`BilinearScore.scores`
the model's own pre-softmax scores. ``Attention.form(head)`` hands one out and
``Attention.set_form(new, head)`` writes one back: the only code that reads or writes the query
and key weights by name is here and in :mod:`attn_core.model.attention` (and :mod:`attn_core.hf`,
which maps them to a family's tensors).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attn_core.model import rotary
from attn_core.model.config import ModelConfig
from attn_core.model.qk_form import QKForm

QK_MATRICES = ("W_Q", "W_K", "W_QK")  # the query/key matrices, by name (weight decay, fine-tuning)
MLA_QK = ("W_DQ", "W_UQ", "W_QR", "W_KR", "W_UK")  # an MLA head's query/key side (W_DKV feeds the values too)
QK_PARAMS = ("W_Q", "W_K", "b_Q", "b_K", "W_QK", *MLA_QK)  # every parameter a form is made of, by name


def attention_weights(
    scores: torch.Tensor, mask: torch.Tensor, entmax_alpha: float = 1.0, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """Row-normalise masked scores [..., h, T, T] (or one head's [..., T, T]). ``mask`` is True where
    a key is visible. ``sinks`` (the heads' learned sink logits, [h], or one head's 0-dim) join each
    row's softmax as one more column, which is then dropped: a row sums to less than 1, the rest
    being the sink's share (:func:`sink_share`)."""
    if sinks is not None:
        z = sinks.to(scores.dtype).reshape(*sinks.shape, 1, 1).expand(*scores.shape[:-1], 1)
        full = torch.cat([scores.masked_fill(~mask, float("-inf")), z], dim=-1)
        return torch.softmax(full, dim=-1)[..., :-1]
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


@dataclass(frozen=True)
class Visibility:
    """The keys each of ``T`` queries sees: key j from query i when j <= i and, with a sliding
    ``window`` (0: none), i - j < window. :meth:`dense` is the [T, T] bool mask (True where
    visible), :meth:`block` the mask of a block of queries and keys."""

    T: int
    window: int = 0
    device: torch.device | str | None = None

    @property
    def causal(self) -> bool:
        """Whether the window hides nothing the causal mask does not (no window, or one >= T)."""
        return not self.window or self.window >= self.T

    def block(self, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        """[q1 - q0, k1 - k0] bool: which of keys k0..k1-1 queries q0..q1-1 see."""
        i = torch.arange(q0, q1, device=self.device)[:, None]
        j = torch.arange(k0, k1, device=self.device)[None, :]
        visible = j <= i
        if self.window:
            visible &= i - j < self.window
        return visible

    def dense(self) -> torch.Tensor:
        """The [T, T] mask (T x T bytes: for the paths that form S anyway)."""
        return self.block(0, self.T, 0, self.T)


@dataclass
class BilinearScore:
    """The scores of every head of one layer (``head`` None) or of one head (module doc).
    Tensors are [n_heads, ...]: ``left`` W_Q and ``right`` W_K (per query head) [h, d, w] with w
    the stored width (``widths``: each head's own), ``bias_q``/``bias_k`` [h, w], ``norm_q``/
    ``norm_k`` the QK-norm weights as stored, ``scale`` [h]; merged heads have ``dense`` [h, d, d]."""

    cfg: ModelConfig
    layer: int
    left: torch.Tensor | None = None
    right: torch.Tensor | None = None
    dense: torch.Tensor | None = None
    bias_q: torch.Tensor | None = None
    bias_k: torch.Tensor | None = None
    norm: str = "none"
    norm_q: torch.Tensor | None = None
    norm_k: torch.Tensor | None = None
    eps: float = 0.0
    scale: torch.Tensor | None = None
    inv_freq: torch.Tensor | None = None
    window: int = 0
    cap: float | None = None
    sink: torch.Tensor | None = None
    head: int | None = None

    # what it is --------------------------------------------------------------------------------
    @property
    def merged(self) -> bool:
        return self.dense is not None

    @property
    def n_heads(self) -> int:
        return self.cfg.n_heads

    @property
    def widths(self) -> list[int]:
        """Each selected head's own query/key width (d_qk), or d_model for merged heads."""
        heads = range(self.n_heads) if self.head is None else [self.head]
        return [self.cfg.d_model if self.merged else self.cfg.head_d_qk(self.layer, h) for h in heads]

    def __getitem__(self, head: int) -> BilinearScore:
        """The form of one head of the layer (the layer's tensors kept: an across-heads norm needs them)."""
        if self.head is not None:
            raise IndexError("this form is already one head's")
        if not 0 <= head < self.n_heads:
            raise IndexError(f"head {head} is outside 0..{self.n_heads - 1}")
        return dataclasses.replace(self, head=head)

    def replace(self, **changes) -> BilinearScore:
        """A copy with some fields changed (what :meth:`Attention.set_form` takes back)."""
        return dataclasses.replace(self, **changes)

    def _pick(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return t if self.head is None else t.select(dim, self.head)

    def head_scales(self) -> torch.Tensor:
        """s of the selected head(s): [h] or a 0-dim tensor (1 for merged heads)."""
        return self._pick(self.scale)

    def factors(self, own: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_Q, W_K) of the selected head(s), unscaled, [h, d, w] or [d, w]; ``own`` (one head):
        its own d_qk columns only."""
        if self.merged:
            raise ValueError("a merged head stores B itself, not its factors")
        L, R = self._pick(self.left), self._pick(self.right)
        if own:
            if self.head is None:
                raise ValueError("own columns need one head (form[head])")
            w = self.widths[0]
            L, R = L[..., :w], R[..., :w]
        return L, R

    def biases(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(b_Q, b_K) of the selected head(s), or None without query/key biases."""
        if self.bias_q is None:
            return None
        return self._pick(self.bias_q), self._pick(self.bias_k)

    def head_sinks(self) -> torch.Tensor | None:
        """The learned sink logit(s) z of the selected head(s), [h] or 0-dim; None without sinks."""
        return None if self.sink is None else self._pick(self.sink)

    def weights(self, S: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The pattern A of scores S [..., h, T, T] (or the selected head's [..., T, T]) under
        ``mask``, with the learned sink in each row's denominator (softmax heads)."""
        return attention_weights(S, mask, self.cfg.entmax_alpha, self.head_sinks())

    def sink_share(self, S: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Each row's mass on the learned sink, [..., T] (zeros without sinks): 1 - sum_j A_ij,
        computed as sigmoid(z - logsumexp_j S_ij) so that a small share keeps its digits."""
        z = self.head_sinks()
        if z is None:
            return S.new_zeros(S.shape[:-1])
        lse = torch.logsumexp(S.masked_fill(~mask, float("-inf")), dim=-1)
        return torch.sigmoid(z.to(S.dtype).reshape(*z.shape, 1) - lse)

    def visibility(self, T: int, device=None) -> Visibility:
        """The keys each of T queries sees (causal, and this layer's window)."""
        return Visibility(T, self.window, device)

    # B~ ---------------------------------------------------------------------------------------
    def _norm_weights(self, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.norm == "head":
            return self.norm_q.reshape(-1, w).expand(h, w), self.norm_k.reshape(-1, w).expand(h, w)
        w_k = self.norm_k.reshape(-1, w)
        return self.norm_q.reshape(h, w), w_k.repeat_interleave(h // w_k.shape[0], dim=0)

    def core(self, offset: int = 0, augmented: bool = False) -> QKForm:
        """B~ of the selected head(s): W_Q diag(w_q) R(offset) diag(w_k) W_K^T * s, factored with the
        scale in the left factor (B = W_QK for merged heads); ``augmented`` gives B' on [x | 1]
        (the biases as the last row). Grown heads keep the stored width (zero columns add nothing)."""
        if self.merged:
            W = F.pad(self.dense, (0, 1, 0, 1)) if augmented else self.dense
            return QKForm(dense=self._pick(W))
        W_Q, W_K = self.left, self.right
        if augmented:
            if self.bias_q is not None:
                W_Q = torch.cat([W_Q, self.bias_q[:, None, :]], dim=1)
                W_K = torch.cat([W_K, self.bias_k[:, None, :]], dim=1)
            else:
                W_Q, W_K = (F.pad(W, (0, 0, 0, 1)) for W in (W_Q, W_K))
        if self.norm != "none":
            w_q, w_k = self._norm_weights(W_Q.shape[0], W_Q.shape[-1])
            W_Q, W_K = W_Q * w_q[:, None, :], W_K * w_k[:, None, :]
        gain = rotary.attention_factor(self.cfg, self.layer)
        if gain != 1.0:  # YaRN: a on the rotated dims of q and of k, a^2 on their part of B~
            r = self.cfg.rotary_dims
            g = torch.ones(W_Q.shape[-1], dtype=W_Q.dtype, device=W_Q.device)
            g[:r] = gain**2
            W_Q = W_Q * g
        if self.cfg.positional == "rotary" and offset != 0:
            W_Q = W_Q @ rotary.offset_rotation(self.cfg, offset, W_Q.shape[-1], layer=self.layer).to(W_Q)
        form = QKForm(left=W_Q * self.scale.view(-1, 1, 1), right=W_K)
        return form if self.head is None else form[self.head]

    # per input ----------------------------------------------------------------------------------
    def _raw(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = torch.einsum("...pd,hde->...hpe", X, self.left)
        k = torch.einsum("...pd,hde->...hpe", X, self.right)
        if self.bias_q is not None:
            q, k = q + self.bias_q[:, None, :], k + self.bias_k[:, None, :]
        return q, k

    def gains(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g_q, g_k), [..., h, T] (or [..., T] for one head): the per-token gains QK-norm puts on
        each side, so that S_ij = g_q(i) g_k(j) x_i B~ x_j^T; ones without QK-norm. Across heads
        (OLMo 2) a token's gain is shared by its heads."""
        h = self.n_heads
        if self.norm == "none" or self.merged:
            ones = X.new_ones(*X.shape[:-2], h, X.shape[-2])
            return self._pick(ones, -2), self._pick(ones, -2)
        q, k = self._raw(X)
        if self.norm == "head":
            g_q, g_k = ((t.pow(2).mean(-1) + self.eps).rsqrt() for t in (q, k))
        else:
            kv = self.norm_k.numel() // self.cfg.d_head  # the stored key heads, not their repeats
            g_q = (q.pow(2).mean((-1, -3)) + self.eps).rsqrt().unsqueeze(-2).expand(q.shape[:-1])
            g_k = (k[..., :: h // kv, :, :].pow(2).mean((-1, -3)) + self.eps).rsqrt()
            g_k = g_k.unsqueeze(-2).expand(k.shape[:-1])
        return self._pick(g_q, -2), self._pick(g_k, -2)

    def queries_keys(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q, K) [..., h, T, w] for X [..., T, d_model] as the model forms them (normed, rotated;
        unscaled); for merged heads Q = X W_QK and K = X."""
        if self.merged:
            q = torch.einsum("...pd,hde->...hpe", X, self.dense)
            return q, X.unsqueeze(-3).expand_as(q)
        q, k = self._raw(X)
        if self.norm == "head":
            q = F.rms_norm(q, (q.shape[-1],), self.norm_q, self.eps)
            k = F.rms_norm(k, (k.shape[-1],), self.norm_k, self.eps)
        elif self.norm == "all":
            q, k = _across(q, self.norm_q, self.eps), _across(k, self.norm_k, self.eps)
        if self.inv_freq is not None:
            gain = rotary.attention_factor(self.cfg, self.layer)
            cos, sin = rotary.cos_sin(self.inv_freq, torch.arange(X.shape[-2], device=X.device), gain)
            q, k = rotary.rotate(q, cos, sin), rotary.rotate(k, cos, sin)
        return q, k

    def terms(self, X: torch.Tensor) -> dict[str, torch.Tensor]:
        """The affine form's four terms of the uncapped scores, each [..., h, T, T] (or one head's):
        ``xx`` s q(x_i W_Q) k(x_j W_K)^T, ``xb`` s q(x_i W_Q) k(b_K)^T, ``bx`` s q(b_Q) k(x_j W_K)^T and
        ``bb`` s q(b_Q) k(b_K)^T, where q(.) and k(.) carry QK-norm's gains and weights and the
        rotation at i and j; they sum to :meth:`scores` (``capped=False``). Without biases only ``xx``."""
        if self.merged:
            return {"xx": self.scores(X, capped=False)}
        every = self.replace(head=None)
        q_x = torch.einsum("...pd,hde->...hpe", X, self.left)
        k_x = torch.einsum("...pd,hde->...hpe", X, self.right)
        sides = {"x": (q_x, k_x)}
        if self.bias_q is not None:
            sides["b"] = (self.bias_q[:, None, :].expand_as(q_x), self.bias_k[:, None, :].expand_as(k_x))
        if self.norm != "none":
            g_q, g_k = every.gains(X)
            w_q, w_k = self._norm_weights(q_x.shape[-3], q_x.shape[-1])
            sides = {k: (q * g_q[..., None] * w_q[:, None, :], kk * g_k[..., None] * w_k[:, None, :])
                     for k, (q, kk) in sides.items()}  # fmt: skip
        if self.inv_freq is not None:
            gain = rotary.attention_factor(self.cfg, self.layer)
            cos, sin = rotary.cos_sin(self.inv_freq, torch.arange(X.shape[-2], device=X.device), gain)
            sides = {k: (rotary.rotate(q, cos, sin), rotary.rotate(kk, cos, sin)) for k, (q, kk) in sides.items()}
        s = self.scale.to(X.dtype).view(-1, 1, 1)
        return {a + b: self._pick((sides[a][0] @ sides[b][1].transpose(-1, -2)) * s, -3) for a in sides for b in sides}

    def scores(self, X: torch.Tensor, capped: bool = True) -> torch.Tensor:
        """The model's own pre-softmax scores S [..., h, T, T] (or [..., T, T] for one head) for the
        layer's input X [..., T, d_model], unmasked (:meth:`visibility` is the mask); ``capped``
        False gives them before the soft cap."""
        q, k = self.queries_keys(X)
        S = q @ k.transpose(-1, -2)
        if not self.merged:
            S = S * self.scale.to(S.dtype).view(-1, 1, 1)
        if capped and self.cap is not None:
            S = torch.tanh(S / self.cap) * self.cap
        return self._pick(S, -3)


def _across(t: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over all heads of each token of t [..., h, T, e] with weights ``w`` over the stored
    heads: keys repeated per query head are normed as stored, then repeated again."""
    h, e = t.shape[-3], t.shape[-1]
    kv = w.numel() // e
    stored = t[..., :: h // kv, :, :] if kv != h else t
    flat = stored.transpose(-2, -3).reshape(*stored.shape[:-3], stored.shape[-2], kv * e)
    normed = F.rms_norm(flat, (kv * e,), w, eps).reshape(*stored.shape[:-3], stored.shape[-2], kv, e)
    normed = normed.transpose(-2, -3)
    return normed.repeat_interleave(h // kv, dim=-3) if kv != h else normed
