"""Merged and factored QK heads, exactly: the parameters of each, the conversions between them and
the truncation of B to a rank.

Per head, with X the attention input (row vectors, docs/maths.md):

    factored   S = (X W_Q)(X W_K)^T / sqrt(d_qk)    B = W_Q W_K^T / sqrt(d_qk)    rank(B) <= d_qk
               parameters 2 d_model d_qk  (+ 2 d_qk with query/key biases)
    merged     S = X W_QK X^T                       B = W_QK                      rank(B) <= d_model
               parameters d_model^2

Without biases the two compute the same scores when W_QK = W_Q W_K^T / sqrt(d_qk)
(:func:`merged_from_factored`); conversely a merged B of rank r is a factored head with d_qk = r
(:func:`factored_from_merged`). What differs is what training finds. For any M = U diag(s) V^T,

    min over W_Q W_K^T = M of (||W_Q||_F^2 + ||W_K||_F^2) / 2  =  ||M||_*  (nuclear norm, sum s)

attained by the balanced factors W_Q = U diag(s)^{1/2}, W_K = V diag(s)^{1/2}
(:func:`balanced_factors`; >= by ||M||_* = tr(U^T W_Q W_K^T V) <= ||W_Q U||_F ||W_K V||_F <= the
mean of the squares). So an L2 penalty (lambda/2)(||W_Q||_F^2 + ||W_K||_F^2) on the factors costs,
at the best balance, lambda sqrt(d_qk) ||B||_*: weight decay on both factors penalises the nuclear
norm of B (a convex surrogate of rank), whereas weight decay on W_QK penalises ||B||_F^2, which
does not favour low rank. AdamW decays decoupled from the gradient, so for it the equivalence
holds for the decay term's fixed points, not step by step.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from attn_core import linalg
from attn_core.bilinear import layer_form
from attn_core.model import ModelConfig, Transformer
from attn_core.model.form import QK_PARAMS
from attn_core.validate import is_int


def qk_params_per_head(d_model: int, qk: str, d_qk: int | None = None, bias: bool = False) -> int:
    """Query/key parameters of one head: factored 2 d_model d_qk (+ 2 d_qk biases), merged d_model^2
    (a merged head has no query/key bias)."""
    if qk == "merged":
        return d_model * d_model
    if qk != "factored" or d_qk is None:
        raise ValueError(f"qk must be 'factored' (with d_qk) or 'merged', got {qk!r} with d_qk={d_qk!r}")
    return 2 * d_model * d_qk + (2 * d_qk if bias else 0)


# --- the two parametrisations, exactly --------------------------------------------------------------


def balanced_factors(M: torch.Tensor, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q = U_r diag(s_r)^{1/2}, W_K = V_r diag(s_r)^{1/2} from the SVD M = U diag(s) V^T, batched
    over leading dims, keeping the ``width`` largest singular values (default all, min(m, n)).
    W_Q W_K^T is the best rank-``width`` approximation of M, and (||W_Q||^2 + ||W_K||^2)/2 equals
    its nuclear norm, the least over every factorization of it."""
    U, s, Vh = linalg.svd(M)
    r = s.shape[-1] if width is None else width
    if not 1 <= r <= s.shape[-1]:
        raise ValueError(
            f"width {width!r} is outside 1..{s.shape[-1]} (the rank cap of a {M.shape[-2]} x {M.shape[-1]} matrix)"
        )
    root = s[..., :r].sqrt().unsqueeze(-2)  # [..., 1, r]
    return U[..., :r] * root, Vh[..., :r, :].transpose(-1, -2) * root


def _like(model: Transformer, cfg: ModelConfig) -> Transformer:
    """A new model of ``cfg`` on the device and in the dtype of ``model``."""
    p = next(model.parameters())
    return Transformer(cfg).to(device=p.device, dtype=p.dtype).train(model.training)


def _copy_except_qk(src: Transformer, dst: Transformer) -> None:
    own = dict(dst.named_parameters())
    for name, p in src.named_parameters():
        if name.rsplit(".", 1)[-1] not in QK_PARAMS:
            own[name].data.copy_(p.data)


def _check_no_qk_bias(model: Transformer) -> None:
    if model.cfg.attn_bias and model.cfg.qk == "factored":
        # S = X B X^T + 1 (b_Q W_K^T X^T) / sqrt(d_qk) + terms constant along a row: the key-bias
        # term depends on the key and no W_QK reproduces it.
        raise ValueError(
            "this model has query/key biases, which a merged head (S = X W_QK X^T) cannot "
            "represent; merge only models with attn_bias = false"
        )


@torch.no_grad()
def merged_from_factored(model: Transformer) -> Transformer:
    """The merged model with W_QK = W_Q W_K^T / sqrt(d_qk) per head and every other weight
    copied: it computes the same scores, patterns and logits."""
    if model.cfg.qk != "factored":
        raise ValueError("the model is already merged")
    _check_no_qk_bias(model)
    out = _like(model, replace(model.cfg, qk="merged", d_qk=None))
    _copy_except_qk(model, out)
    for l in range(model.cfg.n_layers):
        attn = out.blocks[l].attn
        attn.set_form(attn.form().replace(dense=layer_form(model, l).dense))
    return out


@torch.no_grad()
def factored_from_merged(model: Transformer, d_qk: int) -> Transformer:
    """A factored model with query/key width ``d_qk`` whose B is the best rank-d_qk approximation
    of each merged head's W_QK (balanced factors, scaled by d_qk^{1/4} each so that
    W_Q W_K^T / sqrt(d_qk) is that approximation). Exact when every rank(W_QK) <= d_qk."""
    if model.cfg.qk != "merged":
        raise ValueError("the model is not merged")
    d = model.cfg.d_model
    if not is_int(d_qk) or not 1 <= d_qk <= d:
        raise ValueError(f"d_qk={d_qk!r} is outside 1..{d} (d_model)")
    cfg = replace(model.cfg, qk="factored", d_qk=[[d_qk] * model.cfg.n_heads for _ in range(model.cfg.n_layers)])
    out = _like(model, cfg)
    _copy_except_qk(model, out)
    for l, block in enumerate(model.blocks):
        W_Q, W_K = balanced_factors(block.attn.form().dense, d_qk)
        attn = out.blocks[l].attn
        attn.set_form(attn.form().replace(left=W_Q * d_qk**0.25, right=W_K * d_qk**0.25))
    return out


@torch.no_grad()
def truncated(model: Transformer, rank: int) -> Transformer:
    """A merged copy of ``model`` whose every B is replaced by its best rank-``rank`` approximation
    (Eckart-Young: the ``rank`` largest singular triplets). ``rank >= rank(B)`` changes nothing."""
    d = model.cfg.d_model
    if not is_int(rank) or not 1 <= rank <= d:
        raise ValueError(f"rank {rank!r} is outside 1..{d} (d_model)")
    merged = merged_from_factored(model) if model.cfg.qk == "factored" else _clone(model)
    for block in merged.blocks:
        form = block.attn.form()
        W_Q, W_K = balanced_factors(form.dense, rank)
        block.attn.set_form(form.replace(dense=W_Q @ W_K.transpose(-1, -2)))
    return merged


def _clone(model: Transformer) -> Transformer:
    out = _like(model, model.cfg)
    out.load_state_dict(model.state_dict())
    return out
