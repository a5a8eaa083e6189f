"""The QK form of rotary heads as a function of the offset (docs/maths.md): with rotary
positions a query at i and a key at j = i + delta meet through

    B(delta) = W_Q R(delta) W_K^T / sqrt(d_qk) = B_free + B_rot(delta),

B_free = W_Q[:, r:] W_K[:, r:]^T / sqrt(d_qk) being the part of a partially rotary head that no
offset changes (the dims past ``rotary_dims``) and B_rot(delta) the rotated dims'. Under the
causal mask delta <= 0. B(0) is the un-rotated W_Q W_K^T / sqrt(d_qk).

An MLA head's (attn_core/model/mla.py) B(delta) is B + B_R(delta): its absorbed no-position B is
B_free, its decoupled rotary term B_rot (the latent norms' per-token gains, which weigh the two
terms differently, are left out of B(delta), as QK-norm's are).
"""

from __future__ import annotations

import pandas as pd
import torch
import torch.nn.functional as F

from attn_core import linalg
from attn_core.bilinear.checks import check_heads, check_layer, check_model
from attn_core.bilinear.heads import augment, has_bias, layer_form
from attn_core.model import Transformer
from attn_core.model.qk_form import QKForm
from attn_core.model.rotary import offset_rotation

MAX_OFFSETS = 4096


def check_rotary(model: Transformer, what: str) -> None:
    model = check_model(model, "check_rotary")
    if model.cfg.positional != "rotary":
        raise ValueError(
            f"{what} needs a model with rotary positions; this one's positions are {model.cfg.positional!r}"
        )


def default_offsets(model: Transformer, n: int = 64) -> list[int]:
    """0, -1, ..., -(n - 1), then powers of two up to the context: where rotary forms change."""
    model = check_model(model, "default_offsets")
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
    model = check_model(model, "offset_form")
    check_rotary(model, "offset_form")
    offsets = _check_offsets(model, offsets)
    if model.cfg.mla:  # B + B_R(delta): the no-position term beside the rotary one (the latent gains left out)
        form = model.blocks[check_layer(model, layer)].attn.form(check_heads(model, head)[0])
        base, ropes = form.core(augmented=augmented), [form.rope_core(o) for o in offsets]
        pad = (lambda t: F.pad(t, (0, 0, 0, 1))) if augmented else (lambda t: t)
        left = torch.stack([torch.cat([base.left, pad(r.left)], -1) for r in ropes])
        right = torch.stack([torch.cat([base.right, pad(r.right)], -1) for r in ropes])
        return QKForm(left=left, right=right)
    base = layer_form(model, check_layer(model, layer), augmented)[check_heads(model, head)[0]]
    R = offset_rotation(model.cfg, torch.tensor(offsets, device="cpu"), base.left.shape[-1], layer=layer)
    R = R.to(base.left)  # [n, w, w]: the layer's own (its base; the identity in a NoPE layer)
    left = base.left[None] @ R
    return QKForm(left=left, right=base.right.expand(len(offsets), *base.right.shape))


def free_form(model: Transformer, layer: int, head: int, augmented: bool = False) -> QKForm | None:
    """B_free of a partially rotary head (None when every dim rotates)."""
    model = check_model(model, "free_form")
    check_rotary(model, "free_form")
    r = model.cfg.rotary_dims
    if model.cfg.mla:  # MLA's no-position term B is its offset-free part
        return layer_form(model, check_layer(model, layer), augmented)[check_heads(model, head)[0]]
    if r >= model.cfg.d_head:
        return None
    base = layer_form(model, check_layer(model, layer), augmented)[check_heads(model, head)[0]]
    return QKForm(left=base.left[..., r:], right=base.right[..., r:])


def offset_spectrum(model: Transformer, layer: int, head: int, offsets=None, k: int = 8) -> pd.DataFrame:
    """The top ``k`` singular values of B(delta) against delta: columns delta, index, singular_value."""
    model = check_model(model, "offset_spectrum")
    offsets = _check_offsets(model, default_offsets(model) if offsets is None else offsets)
    with torch.no_grad():
        sv = offset_form(model, layer, head, offsets).singular_values[:, :k]  # [n, k]
    rows = [
        dict(delta=delta, index=i, singular_value=s)
        for j, delta in enumerate(offsets)
        for i, s in enumerate(sv[j].tolist())
    ]
    return pd.DataFrame(rows)


@torch.no_grad()
def sigma1_offsets(model: Transformer, heads, offsets=None) -> torch.Tensor:
    """sigma_1(B(delta)) of each of ``heads`` ((layer, head) pairs) at every delta of ``offsets``
    (default :func:`default_offsets`), [len(heads), len(offsets)] float32 on the model's device.
    Batched: with W_Q / sqrt(d_qk) = Q_l R_l and W_K = Q_r R_r (one QR per layer, every head of it
    at once), B(delta) = Q_l (R_l R(delta) R_r^T) Q_r^T has the singular values of the small core
    R_l R(delta) R_r^T, and one ``svdvals`` call takes the cores of every head and offset."""
    model = check_model(model, "sigma1_offsets")
    check_rotary(model, "sigma1_offsets")
    offsets = _check_offsets(model, default_offsets(model) if offsets is None else offsets)
    heads = [(check_layer(model, l), check_heads(model, h)[0]) for l, h in heads]
    if not heads:
        return torch.empty(0, len(offsets), device=model.embed.W_E.device)
    by_layer: dict[int, list[int]] = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append(h)
    cores, order = [], []
    for layer, hs in by_layer.items():
        base = layer_form(model, layer)[hs]  # left W_Q / sqrt(d_qk), right W_K: [n, d, w]
        _, Rl = linalg.qr(base.left.float())
        _, Rr = linalg.qr(base.right.float())
        R = offset_rotation(model.cfg, torch.tensor(offsets, device="cpu"), base.left.shape[-1], layer=layer)
        R = R.to(Rl)  # [O, w, w]: the layer's own
        cores.append(Rl[:, None] @ R[None] @ Rr[:, None].transpose(-1, -2))  # [n, O, r, r]
        order += [(layer, h) for h in hs]
    r = max(c.shape[-1] for c in cores)  # grown layers are wider: zero padding adds no singular value
    cores = [torch.nn.functional.pad(c, (0, r - c.shape[-1], 0, r - c.shape[-2])) for c in cores]
    sigma1 = linalg.svdvals(torch.cat(cores))[..., 0]  # [n heads, O]
    return sigma1[torch.tensor([order.index(lh) for lh in heads], device=sigma1.device)]


def sigma1_summaries(model: Transformer, heads, offsets=None) -> list[dict]:
    """For each of ``heads``: sigma_1(B(delta)) over ``offsets`` (default :func:`default_offsets`)
    at delta = 0 (the un-rotated form) and its min, mean and max over the offsets (a run's
    measurement and live telemetry of rotary heads), from :func:`sigma1_offsets`, read in one copy."""
    model = check_model(model, "sigma1_summaries")
    offsets = default_offsets(model) if offsets is None else [int(o) for o in offsets]
    extra = [] if 0 in offsets else [0]  # B(0) is measured beside offsets that leave it out
    sigma1 = sigma1_offsets(model, heads, extra + offsets)
    at_0, sigma1 = sigma1[:, (extra + offsets).index(0)], sigma1[:, len(extra) :]
    table = torch.stack([at_0, sigma1.amin(-1), sigma1.mean(-1), sigma1.amax(-1)], -1).cpu().tolist()
    keys = ("sigma1_at_0", "sigma1_min", "sigma1_mean", "sigma1_max")
    return [{**dict(zip(keys, row)), "offsets": len(offsets)} for row in table]


def sigma1_summary(model: Transformer, layer: int, head: int, offsets=None) -> dict:
    """:func:`sigma1_summaries` of one head."""
    model = check_model(model, "sigma1_summary")
    return sigma1_summaries(model, [(layer, head)], offsets)[0]


def reference_spectra(model: Transformer, layer: int, head: int, k: int = 8) -> pd.DataFrame:
    """The spectra an offset does not change, to read B(delta)'s against: the un-rotated
    W_Q W_K^T / sqrt(d_qk) (= B(0)) and, for a partially rotary head, the offset-free part
    B_free. Columns part, index, singular_value."""
    model = check_model(model, "reference_spectra")
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
    model = check_model(model, "pair_scores")
    offsets = default_offsets(model, n=128) if offsets is None else offsets
    aug = has_bias(model)
    if model.cfg.mla:  # exact, as the vocabulary view: g_q g_kv x B y^T + g_q x B_R(delta) y^T
        return _mla_pair_scores(model, layer, head, x, y, _check_offsets(model, offsets))
    with torch.no_grad():
        form = offset_form(model, layer, head, offsets, augmented=aug)
        xx, yy = (augment(v) if aug else v for v in (x.reshape(1, -1), y.reshape(1, -1)))
        scores = form.bilinear(xx.expand(len(offsets), 1, -1), yy.expand(len(offsets), 1, -1))[:, 0, 0]
    return pd.DataFrame({"delta": _check_offsets(model, offsets), "score": scores.tolist()})


def _mla_pair_scores(model: Transformer, layer: int, head: int, x, y, offsets: list[int]) -> pd.DataFrame:
    with torch.no_grad():
        form = model.blocks[check_layer(model, layer)].attn.form(check_heads(model, head)[0])
        pair = torch.stack([x.reshape(-1), y.reshape(-1)])
        g_q, g_kv = form.gains(pair)
        base = float(form.core().bilinear(pair)[0, 1] * g_q[0] * g_kv[1])
        scores = [base + float(form.rope_core(o).bilinear(pair)[0, 1] * g_q[0]) for o in offsets]
    return pd.DataFrame({"delta": offsets, "score": scores})


def token_pair_scores(
    model: Transformer, layer: int, head: int, query_token: int, key_token: int, offsets=None
) -> pd.DataFrame:
    """:func:`pair_scores` of two tokens as the layer's norm sees their embeddings
    (``vocab_inputs``): how the score of this query token and key token varies with their offset."""
    model = check_model(model, "token_pair_scores")
    from attn_core.bilinear.views import vocab_inputs

    check_rotary(model, "token_pair_scores")
    with torch.no_grad():
        x, y = vocab_inputs(model, check_layer(model, layer), [int(query_token), int(key_token)])
    return pair_scores(model, layer, head, x, y, offsets)
