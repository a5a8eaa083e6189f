"""The OV circuit of every head, the full QK and OV circuits over the vocabulary, and
value-weighted attention.

Row vectors, as in docs/maths.md. A head of layer l reads key j's row X_j of the attention
input and writes, into query i's residual stream, ``A_ij (X_j W_V + b_V) W_O``. As a map of the
key's row vector its linear part is

    W_OV = W_V W_O                       d_model x d_model, rank <= d_head

held as a :class:`~attn_core.bilinear.QKForm` with ``left = W_V`` and ``right = W_O^T``, so its
spectrum comes from the QR of each factor and the SVD of the small d_head x d_head core, like
B's, never from the dense d_model^2 matrix. The bias term ``b_V W_O`` is the same for every key
and each row of A sums to 1, so it reaches every query whole (like ``b_O``): it says nothing
about *which* token is moved and is left out of the circuits.

Full circuits over the vocabulary (Elhage et al. 2021, "A Mathematical Framework for
Transformer Circuits"). With E the rows of the vocabulary view, ``x_t = ln1_l(W_E[t] + mean_p
W_pos[p])`` (``attn_core.bilinear.vocab_inputs``, V x d_model), and the unembedding read through
the final LayerNorm with its per-token scale frozen, ``U = P diag(w_f) W_U`` (``P = I - 11^T /
d_model`` centres, as LayerNorm does; its scalar 1/std only rescales a whole row):

    M_OV = E W_V W_O U      V x V: row s = the logits that attending to token s adds
    M_QK = E B E^T          V x V: the vocabulary view's scores ([E | 1] B' [E | 1]^T with biases)

Both are products ``L R^T`` of thin factors (``L = E W_V``, ``R = U^T W_O^T`` for OV;
``L = E W_Q / sqrt(d_qk)``, ``R = E W_K`` for QK), so their nonzero eigenvalues are those of the
small r x r matrix ``R^T L`` (if ``R^T L w = lambda w`` then ``L R^T (L w) = lambda (L w)``),
which is what ``QKForm.eigenvalues`` takes: the V x V matrix is never formed, even for GPT-2's
50257 tokens. Their summary is

    c = sum_i lambda_i / sum_i |lambda_i| = tr(M) / sum_i |lambda_i|      in [-1, 1]

(0 for M = 0). For M_OV it is the head's **copying score**: near 1 when M_OV is close to
positive definite, i.e. attending to a token raises that token's own logit; near -1 for a head
that suppresses what it attends to. For M_QK it is the head's **QK positivity**: near 1 when a
token attends to copies of itself. Induction and copying heads sit near (1, 1) together.

Value-weighted attention (Kobayashi et al. 2020): ``A_ij ||(X_j W_V + b_V) W_O||``, the size of
what query i actually receives from key j, beside the pattern A.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from attn_core.bilinear import (
    QKForm,
    check_heads,
    check_layer,
    check_model,
    check_tokens,
    has_bias,
    layer_form,
    vocab_inputs,
)
from attn_core.hooks import act_name
from attn_core.model import Transformer
from attn_core.regularizers import head_label

# --- OV per head --------------------------------------------------------------------------------


def ov_form(model: Transformer, layer: int) -> QKForm:
    """W_OV = W_V W_O of every head of a layer as a factored form, batch shape [n_heads]:
    ``left = W_V`` [h, d_model, d_head], ``right = W_O^T`` [h, d_model, d_head]."""
    model = check_model(model, "ov_form")
    attn = model.blocks[check_layer(model, layer)].attn
    return QKForm(left=attn.per_head("W_V"), right=attn.W_O.transpose(-1, -2))


def ov_singular_values(model: Transformer) -> torch.Tensor:
    """Singular values of W_OV, descending, [n_layers, n_heads, d_head] (the rest are zero)."""
    model = check_model(model, "ov_singular_values")
    with torch.no_grad():
        return torch.stack([ov_form(model, l).singular_values for l in range(model.cfg.n_layers)])


def ov_spectrum_frame(model: Transformer) -> pd.DataFrame:
    """Tidy singular values of W_OV: layer, head, index, singular_value, normalized (σ/σ_1)."""
    s = ov_singular_values(check_model(model, "ov_spectrum_frame"))  # [L, H, d_head]
    rows = []
    for l in range(s.shape[0]):
        for h in range(s.shape[1]):
            top = float(s[l, h, 0]) or 1.0
            rows += [
                dict(layer=l, head=h, index=i, singular_value=float(v), normalized=float(v) / top)
                for i, v in enumerate(s[l, h].tolist())
            ]
    return pd.DataFrame(rows)


# --- full circuits ------------------------------------------------------------------------------


def unembed_matrix(model: Transformer) -> torch.Tensor:
    """U = P diag(w_f) W_U, [d_model, d_vocab]: the unembedding as the residual stream sees it
    through the final LayerNorm with its scale frozen (W_U itself without a LayerNorm)."""
    model = check_model(model, "unembed_matrix")
    W_U = model.unembed.W_U
    ln = model.ln_final
    if not hasattr(ln, "w"):
        return W_U
    d = W_U.shape[0]
    P = torch.eye(d, dtype=W_U.dtype, device=W_U.device) - 1.0 / d  # [d, d], centring
    return P @ (ln.w[:, None] * W_U)


def _token_rows(model: Transformer, layer: int, tokens: Sequence[int] | None) -> torch.Tensor:
    if tokens is not None:
        tokens = check_tokens(model, tokens, max_len=model.cfg.d_vocab)
    return vocab_inputs(model, layer, tokens)  # [n, d_model]


def full_ov_form(model: Transformer, layer: int, tokens: Sequence[int] | None = None) -> QKForm:
    """M_OV = E W_V W_O U of every head of a layer, batch [n_heads], factored: ``left = E W_V``
    [h, n, d_head], ``right = U^T W_O^T`` [h, n, d_head] (``tokens`` restricts both sides)."""
    model = check_model(model, "full_ov_form")
    E = _token_rows(model, layer, tokens)  # [n, d]
    U = unembed_matrix(model)  # [d, V]
    if tokens is not None:
        U = U[:, torch.as_tensor(list(tokens), dtype=torch.long, device=U.device)]
    attn = model.blocks[layer].attn
    left = torch.einsum("nd,hde->hne", E, attn.per_head("W_V"))  # [h, n, d_head]
    right = torch.einsum("hed,dn->hne", attn.W_O, U)  # [h, n, d_head]
    return QKForm(left=left, right=right)


def full_qk_form(model: Transformer, layer: int, tokens: Sequence[int] | None = None) -> QKForm:
    """M_QK = E B E^T (with biases [E | 1] B' [E | 1]^T, what the head computes) of every head
    of a layer, batch [n_heads]: ``left = E' W_Q' / sqrt(d_qk)``, ``right = E' W_K'`` when
    factored; merged: ``left = E B``, ``right = E`` ([h, n, d_model])."""
    model = check_model(model, "full_qk_form")
    aug = has_bias(model)
    E = _token_rows(model, layer, tokens)  # [n, d]
    if aug:
        E = torch.cat([E, torch.ones_like(E[:, :1])], dim=-1)  # [n, d + 1]
    form = layer_form(model, layer, augmented=aug)
    if form.is_dense:
        return QKForm(left=E @ form.dense, right=E.expand(form.dense.shape[0], *E.shape))
    return QKForm(left=E @ form.left, right=E @ form.right)  # [h, n, w] each


def full_ov_circuit(model: Transformer, layer: int, head: int, tokens: Sequence[int] | None = None) -> torch.Tensor:
    """The dense M_OV of one head, [n, n] (rows: the attended token, columns: the logits);
    ``tokens`` (default: every token) names the rows and columns, so keep it small for a big
    vocabulary."""
    model = check_model(model, "full_ov_circuit")
    check_heads(model, head)
    with torch.no_grad():
        return full_ov_form(model, layer, tokens)[head].dense.float().cpu()


def positivity(eigenvalues: torch.Tensor) -> torch.Tensor:
    """sum(lambda) / sum(|lambda|) over the last dim of complex eigenvalues (0 when all vanish)."""
    num = eigenvalues.sum(-1).real
    den = eigenvalues.abs().sum(-1)
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), torch.zeros_like(den))


def copying_scores(model: Transformer) -> torch.Tensor:
    """The copying score of every head (positivity of M_OV over the whole vocabulary), [L, H]."""
    model = check_model(model, "copying_scores")
    with torch.no_grad():
        return torch.stack([positivity(full_ov_form(model, l).eigenvalues) for l in range(model.cfg.n_layers)])


def qk_positivities(model: Transformer) -> torch.Tensor:
    """The QK positivity of every head (positivity of M_QK over the whole vocabulary), [L, H]."""
    model = check_model(model, "qk_positivities")
    with torch.no_grad():
        return torch.stack([positivity(full_qk_form(model, l).eigenvalues) for l in range(model.cfg.n_layers)])


def head_circuits(model: Transformer) -> pd.DataFrame:
    """One row per head: layer, head, label, copying_score, qk_positivity, ov_singular_values
    (a list, descending), ov_norm (||W_OV||_F)."""
    model = check_model(model, "head_circuits")
    copy, qk = copying_scores(model), qk_positivities(model)
    sv = ov_singular_values(model)
    rows = []
    for l in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            rows.append(
                dict(
                    layer=l,
                    head=h,
                    label=head_label(l, h),
                    copying_score=float(copy[l, h]),
                    qk_positivity=float(qk[l, h]),
                    ov_singular_values=sv[l, h].tolist(),
                    ov_norm=float(sv[l, h].pow(2).sum().sqrt()),
                )
            )
    return pd.DataFrame(rows)


# --- value-weighted attention -------------------------------------------------------------------


def value_weighted(
    model: Transformer, tokens: Sequence[int], layer: int, heads: int | Sequence[int] | None = None
) -> dict[str, torch.Tensor]:
    """On a real input: ``pattern`` A [h, T, T], ``value_norms`` ||v_j W_O|| [h, T] with
    v_j = X_j W_V + b_V, and ``weighted`` A_ij ||v_j W_O|| [h, T, T], for the chosen heads."""
    model = check_model(model, "value_weighted")
    check_layer(model, layer)
    heads = check_heads(model, heads)
    ids = check_tokens(model, tokens)
    attn = model.blocks[layer].attn
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids], device=model.embed.W_E.device))
        X = cache[act_name("attn_in", layer)][0]  # [T, d]
        A = cache[act_name("pattern", layer)][0, heads]  # [h, T, T]
        v = torch.einsum("td,hde->hte", X, attn.per_head("W_V")[heads])  # [h, T, d_head]
        if model.cfg.attn_bias:
            v = v + attn.per_head("b_V")[heads][:, None, :]
        norms = torch.einsum("hte,hed->htd", v, attn.W_O[heads]).norm(dim=-1)  # [h, T]
        weighted = A * norms[:, None, :]  # [h, T, T]
    return {"pattern": A.float().cpu(), "value_norms": norms.float().cpu(), "weighted": weighted.float().cpu()}
