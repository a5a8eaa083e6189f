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
    return model.blocks[check_layer(model, layer)].attn.form().core(offset, augmented)


def qk_gains(model: Transformer, layer: int, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g_q, g_k), each [..., n_heads, T]: the per-token gains QK-norm puts on each side of every
    head's score for the layer's input X [..., T, d_model] (module doc), so that
    S_ij = g_q(i) g_k(j) x_i B~ x_j^T with B~ the :func:`layer_form`; ones without QK-norm.
    Across heads (OLMo 2) a token's gain is shared by its heads."""
    model = check_model(model, "qk_gains")
    return model.blocks[check_layer(model, layer)].attn.form().gains(X)


def model_form(model: Transformer, augmented: bool = False) -> QKForm:
    """Every head of every layer, batch shape [n_layers, n_heads]. Layers whose grown heads are
    wider are matched by zero columns, which change nothing."""
    model = check_model(model, "model_form")
    forms = [layer_form(model, l, augmented) for l in range(model.cfg.n_layers)]
    if forms[0].is_dense:
        return QKForm(dense=torch.stack([f.dense for f in forms]))
    w = max(f.left.shape[-1] for f in forms)
    return QKForm(
        left=torch.stack([_pad(f.left, w) for f in forms]), right=torch.stack([_pad(f.right, w) for f in forms])
    )


def layer_forms(model: Transformer, augmented: bool = False):
    """``model_form(model, augmented)[l]`` for each layer l in turn, made when asked: one layer's
    factors in memory at a time, not the whole model's (a 0.6B Qwen3's are 470 MiB)."""
    model = check_model(model, "layer_forms")
    w = max(model.cfg.qk_width(l) for l in range(model.cfg.n_layers))
    for l in range(model.cfg.n_layers):
        f = layer_form(model, l, augmented)
        yield f if f.is_dense else QKForm(left=_pad(f.left, w), right=_pad(f.right, w))


def _pad(t: torch.Tensor, w: int) -> torch.Tensor:
    return F.pad(t, (0, w - t.shape[-1]))


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
