"""The QK form of a model's heads (docs/maths.md): B per head, and B' for heads with biases.

For one head of layer l, with X the attention input (row vectors):

    B  = W_Q W_K^T / sqrt(d_qk)                  factored head, d_model x d_model, rank <= d_qk
    B  = W_QK                                     merged head, any rank
    B' = W_Q' W_K'^T / sqrt(d_qk),  W_Q' = [W_Q; b_Q^T]   the augmented form (query/key biases)
    S  = X' B' X'^T,  X' = [X | 1]                exactly the model's pre-softmax scores
    B(delta) = W_Q R(delta) W_K^T / sqrt(d_qk)     rotary positions: the form of a query and a
                                                   key delta = j - i positions apart

With rotary positions the form depends on the offset (``attn_core/model/rotary.py``); ``offset``
picks it, and offset 0 is the un-rotated W_Q W_K^T / sqrt(d_qk). Other models ignore ``offset``,
and so does a layer without positions (NoPE); a sliding layer with its own rotary base uses it.
With grouped-query attention each query head's form uses the key head it shares. The scale is
the model's own (``attn_scale`` where the family sets one).

With QK-norm the form is the core B~ = W_Q diag(w_q) R(delta) diag(w_k) W_K^T * scale, the norm
weights folded in: the score is S_ij = g_q(i) g_k(j) x_i B~ x_j^T with the per-token gains
g_q(i) = 1 / sqrt(mean(q_i^2) + eps) of the un-normed q_i = x_i W_Q (+ b_Q) (over the head, or
over all heads with QK-norm across heads), and g_k(j) likewise (docs/maths.md).

Everything here is differentiable (the regularizers penalise it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attn_core.bilinear.checks import check_heads, check_layer, check_model
from attn_core.bilinear.form import QKForm
from attn_core.model import Transformer
from attn_core.model.rotary import offset_rotation
from attn_core.validate import is_int, shown


def augment(x: torch.Tensor) -> torch.Tensor:
    """[x | 1] along the last dim: the token rows of the augmented form."""
    return torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)


def has_bias(model: Transformer) -> bool:
    """True when the heads have query/key biases, so that S needs the augmented form B'."""
    model = check_model(model, "has_bias")
    return model.cfg.attn_bias and model.cfg.qk == "factored"


def layer_form(model: Transformer, layer: int, augmented: bool = False, offset: int = 0) -> QKForm:
    """Every head of one layer, batch shape [n_heads]; ``augmented`` gives B' ((d_model + 1)^2),
    ``offset`` B(offset) for rotary models (module doc). Grown heads keep the layer's stored
    width; their zero columns add nothing to B."""
    model = check_model(model, "layer_form")
    if not is_int(offset) or abs(offset) > model.cfg.n_ctx:
        raise ValueError(f"offset={shown(offset)} must be an integer in -{model.cfg.n_ctx}..{model.cfg.n_ctx}")
    attn = model.blocks[check_layer(model, layer)].attn
    if model.cfg.qk == "merged":
        W = attn.W_QK  # [h, d, d]
        if augmented:  # merged heads have no query/key bias: B' = [[B, 0], [0, 0]]
            W = F.pad(W, (0, 1, 0, 1))
        return QKForm(dense=W)
    scale = attn.qk_scale.view(-1, 1, 1)  # [h, 1, 1], 1/sqrt(d_qk) of each head
    W_Q, W_K = attn.W_Q, attn.per_head("W_K")  # [h, d, w]
    if augmented:
        if model.cfg.attn_bias:
            W_Q = torch.cat([W_Q, attn.b_Q[:, None, :]], dim=1)
            W_K = torch.cat([W_K, attn.per_head("b_K")[:, None, :]], dim=1)
        else:
            W_Q, W_K = (F.pad(W, (0, 0, 0, 1)) for W in (W_Q, W_K))
    if model.cfg.qk_norm != "none":  # the norm weights, per head: diag(w_q), diag(w_k) folded in
        h, w = W_Q.shape[0], W_Q.shape[-1]
        w_q = attn.q_norm.w.reshape(-1, w).expand(h, w) if model.cfg.qk_norm == "head" else attn.q_norm.w.reshape(h, w)
        w_k = attn.k_norm.w.reshape(-1, w)
        w_k = w_k.expand(h, w) if model.cfg.qk_norm == "head" else w_k.repeat_interleave(h // w_k.shape[0], dim=0)
        W_Q, W_K = W_Q * w_q[:, None, :], W_K * w_k[:, None, :]
    if model.cfg.positional == "rotary" and offset != 0:
        W_Q = W_Q @ offset_rotation(model.cfg, offset, W_Q.shape[-1], layer=layer).to(W_Q)
    return QKForm(left=W_Q * scale, right=W_K)


def qk_gains(model: Transformer, layer: int, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g_q, g_k), each [..., n_heads, T]: the per-token gains QK-norm puts on each side of every
    head's score for the layer's input X [..., T, d_model] (module doc), so that
    S_ij = g_q(i) g_k(j) x_i B~ x_j^T with B~ the :func:`layer_form`; ones without QK-norm.
    Across heads (OLMo 2) a token's gain is shared by its heads."""
    model = check_model(model, "qk_gains")
    attn = model.blocks[check_layer(model, layer)].attn
    cfg = model.cfg
    h = cfg.n_heads
    if cfg.qk_norm == "none":
        ones = X.new_ones(*X.shape[:-2], h, X.shape[-2])
        return ones, ones
    q = torch.einsum("...pd,hde->...hpe", X, attn.W_Q)
    k = torch.einsum("...pd,hde->...hpe", X, attn.per_head("W_K"))
    if cfg.attn_bias:
        q, k = q + attn.b_Q[:, None, :], k + attn.per_head("b_K")[:, None, :]
    if cfg.qk_norm == "head":
        return tuple((t.pow(2).mean(-1) + cfg.ln_eps).rsqrt() for t in (q, k))
    kv = attn.k_norm.w.numel() // cfg.d_head  # across heads: the stored key heads, not their repeats
    mean_k = k[..., :: h // kv, :, :].pow(2).mean((-1, -3))
    g_q = (q.pow(2).mean((-1, -3)) + cfg.ln_eps).rsqrt()
    g_k = (mean_k + cfg.ln_eps).rsqrt()
    return g_q.unsqueeze(-2).expand(q.shape[:-1]), g_k.unsqueeze(-2).expand(k.shape[:-1])


def model_form(model: Transformer, augmented: bool = False) -> QKForm:
    """Every head of every layer, batch shape [n_layers, n_heads]. Layers whose grown heads are
    wider are matched by zero columns, which change nothing."""
    model = check_model(model, "model_form")
    forms = [layer_form(model, l, augmented) for l in range(model.cfg.n_layers)]
    if forms[0].is_dense:
        return QKForm(dense=torch.stack([f.dense for f in forms]))
    w = max(f.left.shape[-1] for f in forms)

    def pad(t: torch.Tensor) -> torch.Tensor:
        return F.pad(t, (0, w - t.shape[-1]))

    return QKForm(left=torch.stack([pad(f.left) for f in forms]), right=torch.stack([pad(f.right) for f in forms]))


def qk_form(model: Transformer, layer: int, head: int, augmented: bool = False, offset: int = 0) -> QKForm:
    """The form of one head (what ``model.QK[layer, head]`` is), whose :meth:`QKForm.at_offset`
    gives B(delta) of a rotary model (module doc); differentiable.

    >>> import attn_core as al
    >>> B = qk_form(al.load("induction-2l"), 1, 0)
    >>> B.shape, B.at_offset(3).shape
    (torch.Size([64, 64]), torch.Size([64, 64]))
    """
    model = check_model(model, "qk_form")
    form = layer_form(model, layer, augmented, offset)[check_heads(model, head)[0]]
    form._at_offset = lambda delta: qk_form(model, layer, head, augmented, delta)
    return form


def layer_B(model: Transformer, layer: int, augmented: bool = False) -> torch.Tensor:
    """Dense B (or B') of every head of a layer, [n_heads, d, d] (differentiable)."""
    model = check_model(model, "layer_B")
    return layer_form(model, layer, augmented).dense


def head_B(model: Transformer, layer: int, head: int, augmented: bool = False) -> torch.Tensor:
    """Dense B ([d_model, d_model]) or B' ([d_model + 1]^2) of one head (differentiable)."""
    model = check_model(model, "head_B")
    check_heads(model, head)
    return layer_form(model, layer, augmented)[head].dense
