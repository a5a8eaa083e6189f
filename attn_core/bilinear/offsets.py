"""The QK form of rotary heads as a function of the offset (docs/maths.md): with rotary
positions a query at i and a key at j = i + delta meet through

    B(delta) = W_Q R(delta) W_K^T / sqrt(d_qk) = B_free + B_rot(delta),

B_free = W_Q[:, r:] W_K[:, r:]^T / sqrt(d_qk) being the part of a partially rotary head that no
offset changes (the dims past ``rotary_dims``) and B_rot(delta) the rotated dims'. Under the
causal mask delta <= 0. B(0) is the un-rotated W_Q W_K^T / sqrt(d_qk).
"""

from __future__ import annotations

import pandas as pd
import torch

from attn_core.bilinear.checks import check_heads, check_layer
from attn_core.bilinear.form import QKForm
from attn_core.bilinear.heads import augment, has_bias, layer_form
from attn_core.model import Transformer
from attn_core.model.rotary import offset_rotation

MAX_OFFSETS = 4096


def check_rotary(model: Transformer, what: str) -> None:
    if model.cfg.positional != "rotary":
        raise ValueError(
            f"{what} needs a model with rotary positions; this one's positions are {model.cfg.positional!r}"
        )


def default_offsets(model: Transformer, n: int = 64) -> list[int]:
    """0, -1, ..., -(n - 1), then powers of two up to the context: where rotary forms change."""
    far = [-(2**k) for k in range(n.bit_length(), 32) if 2**k < model.cfg.n_ctx]
    return list(range(0, -min(n, model.cfg.n_ctx), -1)) + far


def _check_offsets(model: Transformer, offsets) -> list[int]:
    offsets = [int(o) for o in offsets]
    if not offsets or len(offsets) > MAX_OFFSETS:
        raise ValueError(f"give 1..{MAX_OFFSETS} offsets")
    if any(abs(o) >= model.cfg.n_ctx for o in offsets):
        raise ValueError(f"offsets must lie within the context, |delta| < {model.cfg.n_ctx}")
    return offsets


def offset_form(model: Transformer, layer: int, head: int, offsets, augmented: bool = False) -> QKForm:
    """B(delta) of one head for every delta in ``offsets``, batch shape [len(offsets)]."""
    check_rotary(model, "offset_form")
    offsets = _check_offsets(model, offsets)
    base = layer_form(model, check_layer(model, layer), augmented)[check_heads(model, head)[0]]
    R = offset_rotation(model.cfg, torch.tensor(offsets), base.left.shape[-1]).to(base.left)  # [n, w, w]
    left = base.left[None] @ R
    return QKForm(left=left, right=base.right.expand(len(offsets), *base.right.shape))


def free_form(model: Transformer, layer: int, head: int, augmented: bool = False) -> QKForm | None:
    """B_free of a partially rotary head (None when every dim rotates)."""
    check_rotary(model, "free_form")
    r = model.cfg.rotary_dims
    if r >= model.cfg.d_head:
        return None
    base = layer_form(model, check_layer(model, layer), augmented)[check_heads(model, head)[0]]
    return QKForm(left=base.left[..., r:], right=base.right[..., r:])


def offset_spectrum(model: Transformer, layer: int, head: int, offsets=None, k: int = 8) -> pd.DataFrame:
    """The top ``k`` singular values of B(delta) against delta: columns delta, index, singular_value."""
    offsets = _check_offsets(model, default_offsets(model) if offsets is None else offsets)
    with torch.no_grad():
        sv = offset_form(model, layer, head, offsets).singular_values[:, :k]  # [n, k]
    rows = [
        dict(delta=delta, index=i, singular_value=s)
        for j, delta in enumerate(offsets)
        for i, s in enumerate(sv[j].tolist())
    ]
    return pd.DataFrame(rows)


def sigma1_summary(model: Transformer, layer: int, head: int, offsets=None) -> dict:
    """sigma_1(B(delta)) of one head over ``offsets`` (default :func:`default_offsets`): at
    delta = 0 (the un-rotated form) and its min, mean and max over the offsets (a run's
    measurement and live telemetry of rotary heads)."""
    offsets = default_offsets(model) if offsets is None else offsets
    with torch.no_grad():
        sigma1 = offset_form(model, layer, head, offsets).singular_values[:, 0].float()
    return {
        "sigma1_at_0": float(sigma1[0]),
        "sigma1_min": float(sigma1.min()),
        "sigma1_mean": float(sigma1.mean()),
        "sigma1_max": float(sigma1.max()),
        "offsets": len(offsets),
    }


def reference_spectra(model: Transformer, layer: int, head: int, k: int = 8) -> pd.DataFrame:
    """The spectra an offset does not change, to read B(delta)'s against: the un-rotated
    W_Q W_K^T / sqrt(d_qk) (= B(0)) and, for a partially rotary head, the offset-free part
    B_free. Columns part, index, singular_value."""
    with torch.no_grad():
        parts = {"un-rotated W_Q W_K^T": offset_form(model, layer, head, [0])[0]}
        free = free_form(model, layer, head)
        if free is not None:
            parts[f"offset-free (dims {model.cfg.rotary_dims}..{model.cfg.d_head - 1})"] = free
        rows = [
            dict(part=name, index=i, singular_value=s)
            for name, form in parts.items()
            for i, s in enumerate(form.singular_values[:k].tolist())
        ]
    return pd.DataFrame(rows)


def pair_scores(
    model: Transformer, layer: int, head: int, x: torch.Tensor, y: torch.Tensor, offsets=None
) -> pd.DataFrame:
    """f(delta) = x' B'(delta) y'^T for a fixed query vector x and key vector y (rows of the
    layer's attention input, e.g. ``vocab_inputs``) against the offset: columns delta, score."""
    offsets = default_offsets(model, n=128) if offsets is None else offsets
    aug = has_bias(model)
    with torch.no_grad():
        form = offset_form(model, layer, head, offsets, augmented=aug)
        xx, yy = (augment(v) if aug else v for v in (x.reshape(1, -1), y.reshape(1, -1)))
        scores = form.bilinear(xx.expand(len(offsets), 1, -1), yy.expand(len(offsets), 1, -1))[:, 0, 0]
    return pd.DataFrame({"delta": _check_offsets(model, offsets), "score": scores.tolist()})


def token_pair_scores(
    model: Transformer, layer: int, head: int, query_token: int, key_token: int, offsets=None
) -> pd.DataFrame:
    """:func:`pair_scores` of two tokens as the layer's norm sees their embeddings
    (``vocab_inputs``): how the score of this query token and key token varies with their offset."""
    from attn_core.bilinear.views import vocab_inputs

    check_rotary(model, "token_pair_scores")
    with torch.no_grad():
        x, y = vocab_inputs(model, check_layer(model, layer), [int(query_token), int(key_token)])
    return pair_scores(model, layer, head, x, y, offsets)
