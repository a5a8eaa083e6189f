"""Which head of model A is which head of model B, from B alone (docs/maths.md, "Head diffing").

A head's factors are not its identity: ``W_Q -> W_Q M``, ``W_K -> W_K M^-T`` (M invertible)
leaves ``B = W_Q W_K^T / sqrt(d_qk)`` and every score unchanged, so W_Q or W_K cannot be compared
directly; B can. The distance between head a of A and head b of B (same layer) is the
**relative Frobenius distance**

    d(a, b) = ||B_a - B_b||_F / (||B_a||_F + ||B_b||_F)

in [0, 1] (triangle inequality): 0 exactly when the forms are equal, 1 when B_b = -B_a, blind to
how each head factors B, and (unlike a cosine) it sees scale, which sets how sharp a head's
attention is. It is computed from the factors without forming any d_model x d_model matrix:
``<L_a R_a^T, L_b R_b^T>_F = sum((L_a^T L_b) * (R_a^T R_b))``, so a layer costs two Gram
matrices of its stacked factors ([h_a w_a, h_b w_b]: heads of different widths compare too, B
being d_model x d_model whatever the width); merged heads (B stored densely) are compared densely.

**Rotary heads** have one B per offset, ``B(delta) = sum_c B_c R_c(delta)``, with plane c's part
``B_c(delta) = cos(omega_c delta) B_c + sin(omega_c delta) B_c^J`` (B_c^J: its key columns turned by
a quarter turn). Only factor changes that commute with the rotations leave every score unchanged,
and they leave each ``B_c`` and ``B_c^J`` unchanged, so the squared distance is taken as
``sum_c (||dB_c||^2 + ||dB_c^J||^2) / 2`` over the turning planes plus ``||dB_free||^2`` of the
offset-free dims: the mean over offsets (uniform phases) of ``sum_c ||dB_c(delta)||^2``.

**Matching.** Per layer, the one-to-one matching of least total distance
(``scipy.optimize.linear_sum_assignment``); heads left over (A and B with different head counts)
are named. With grouped-query attention (both models with the same groups) a permutation that
keeps the function moves whole key/value groups, so groups are matched first (the cost of a pair
of groups is the best matching of their query heads), then heads within each matched pair.

**Learned sinks** (gpt-oss) are outside B: the distance leaves them out, and each matched pair of
two models with sinks reports both sink logits and their change (``sink_a``, ``sink_b``,
``sink_change``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from attn_core.bilinear.heads import layer_form
from attn_core.checkpoint import LoadedModel
from attn_core.model import Transformer
from attn_core.surgery.modes import planes

DISTANCE = "relative Frobenius distance of B: ||B_a - B_b||_F / (||B_a||_F + ||B_b||_F)"


@dataclass
class LayerDiff:
    layer: int
    distance: np.ndarray  # [H_a, H_b]
    pairs: list[tuple[int, int]]
    unmatched_a: list[int] = field(default_factory=list)
    unmatched_b: list[int] = field(default_factory=list)
    sinks_a: np.ndarray | None = None  # [H_a]: the learned sink logits (None: a model without)
    sinks_b: np.ndarray | None = None


@dataclass
class HeadDiff:
    a: str
    b: str
    layers: list[LayerDiff]
    grouped: bool = False

    def to_json(self) -> dict:
        pairs = [
            dict(layer=ld.layer, head_a=i, head_b=j, distance=float(ld.distance[i, j]), **_sinks(ld, i, j))
            for ld in self.layers
            for i, j in ld.pairs
        ]
        unmatched = [
            dict(model=side, layer=ld.layer, head=h)
            for ld in self.layers
            for side, heads in (("a", ld.unmatched_a), ("b", ld.unmatched_b))
            for h in heads
        ]
        return dict(
            a=self.a,
            b=self.b,
            distance=DISTANCE,
            grouped_query=self.grouped,
            pairs=pairs,
            unmatched=unmatched,
            matrices={str(ld.layer): np.round(ld.distance, 6).tolist() for ld in self.layers},
        )


def _sinks(ld: LayerDiff, i: int, j: int) -> dict:
    """A matched pair's learned sink logits and their change (B leaves the sink out), when both
    models have them."""
    if ld.sinks_a is None or ld.sinks_b is None:
        return {}
    a, b = float(ld.sinks_a[i]), float(ld.sinks_b[j])
    return dict(sink_a=a, sink_b=b, sink_change=b - a)


def _factors(
    model: Transformer, layer: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(L [H, d, w], R [H, d, w], R^J or None, plane weights [w, w] or None) with B_h = L_h R_h^T, float64."""
    cfg = model.cfg
    form = layer_form(model, layer)  # the model's scale in L; QK-norm's weights folded in (the core B~)
    L, R = form.left.detach().double(), form.right.detach().double()
    w = L.shape[-1]
    if cfg.positional != "rotary" or cfg.mla:  # MLA's B is its no-position term: no planes
        return L, R, None, None
    weights = torch.zeros(w, w, dtype=torch.float64, device=L.device)
    RJ = torch.zeros_like(R)
    half = cfg.rotary_dims // 2
    for c, p in enumerate(planes(model)):
        turning = c < half
        weights[np.ix_(p, p)] = 0.5 if turning else 1.0
        if turning:
            RJ[..., p[0]], RJ[..., p[1]] = -R[..., p[1]], R[..., p[0]]
    return L, R, RJ, weights


def _inner(La, Ra, RJa, Lb, Rb, RJb, weights) -> torch.Tensor:
    """[H_a, H_b] Frobenius inner products of the heads' forms (plane-weighted for rotary heads,
    whose widths are equal); the two models' heads may differ in width (w_a, w_b) otherwise."""
    Ha, d, wa = La.shape
    Hb, wb = Lb.shape[0], Lb.shape[-1]

    def gram(X, Y):  # [H_a, w_a, H_b, w_b]
        return (X.permute(1, 0, 2).reshape(d, Ha * wa).T @ Y.permute(1, 0, 2).reshape(d, Hb * wb)).view(Ha, wa, Hb, wb)

    GL = gram(La, Lb)
    prod = GL * gram(Ra, Rb)
    if RJa is not None:
        prod = prod + GL * gram(RJa, RJb)
    return prod.sum((1, 3)) if weights is None else torch.einsum("aibj,ij->ab", prod, weights)


def _self(L, R, RJ, weights) -> torch.Tensor:
    """[H] squared norms of each head's form."""
    prod = (L.transpose(-1, -2) @ L) * (R.transpose(-1, -2) @ R)
    if RJ is not None:
        prod = prod + (L.transpose(-1, -2) @ L) * (RJ.transpose(-1, -2) @ RJ)
    return (prod if weights is None else prod * weights).sum((-1, -2))


def layer_distances(a: Transformer, b: Transformer, layer: int) -> torch.Tensor:
    """[H_a, H_b] relative Frobenius distances of the heads' B at ``layer`` (module doc)."""
    with torch.no_grad():
        if "merged" in (a.cfg.qk, b.cfg.qk):
            Ba, Bb = _dense(a, layer).flatten(1), _dense(b, layer).flatten(1).to(a.embed.W_E.device)
            ip, na, nb = Ba @ Bb.T, (Ba * Ba).sum(-1), (Bb * Bb).sum(-1)
        else:
            fa = _factors(a, layer)
            fb = tuple(t.to(fa[0].device) if t is not None else None for t in _factors(b, layer))
            ip = _inner(*fa[:3], *fb[:3], fa[3])
            na, nb = _self(*fa), _self(*fb)
        sq = (na[:, None] + nb[None, :] - 2 * ip).clamp_min(0)
        denom = na.sqrt()[:, None] + nb.sqrt()[None, :]
        return torch.where(denom > 0, sq.sqrt() / denom.clamp_min(1e-300), torch.zeros_like(sq)).cpu()


def _dense(model: Transformer, layer: int) -> torch.Tensor:
    form = model.blocks[layer].attn.form()
    if form.merged:
        return form.dense.detach().double()
    L, R, _, _ = _factors(model, layer)
    return L @ R.transpose(-1, -2)


def match(D: np.ndarray, group_a: int = 1, group_b: int = 1) -> list[tuple[int, int]]:
    """The least-total-distance one-to-one matching of the rows and columns of ``D``; with
    groups of size > 1 (the same for both), whole groups first, then heads within them."""
    if group_a > 1 and group_a == group_b and D.shape[0] == D.shape[1]:
        g, n = group_a, D.shape[0] // group_a
        inner = {}
        cost = np.zeros((n, n))
        for x in range(n):
            for y in range(n):
                block = D[x * g : (x + 1) * g, y * g : (y + 1) * g]
                r, c = linear_sum_assignment(block)
                cost[x, y] = block[r, c].sum()
                inner[x, y] = [(x * g + i, y * g + j) for i, j in zip(r, c)]
        gr, gc = linear_sum_assignment(cost)
        return sorted(p for x, y in zip(gr, gc) for p in inner[x, y])
    r, c = linear_sum_assignment(D)
    return sorted(zip(r.tolist(), c.tolist()))


def check_comparable(a: LoadedModel, b: LoadedModel) -> None:
    ca, cb = a.config, b.config
    if ca.d_model != cb.d_model:
        raise ValueError(f"{a.name} has d_model {ca.d_model}, {b.name} {cb.d_model}: their heads' B do not compare")
    if (ca.positional == "rotary") != (cb.positional == "rotary") or ca.rotary_dims != cb.rotary_dims:
        raise ValueError(f"{a.name} and {b.name} do not rotate the same dims: their heads' scores do not compare")
    if ca.positional == "rotary" and (ca.d_head, ca.rope_theta, ca.rope_scaling) != (
        cb.d_head,
        cb.rope_theta,
        cb.rope_scaling,
    ):
        raise ValueError(f"{a.name} and {b.name} turn their rotation planes at different frequencies")


def check_layers(layers: list[int] | None, a: LoadedModel, b: LoadedModel) -> list[int]:
    n = min(a.config.n_layers, b.config.n_layers)
    if layers is None:
        return list(range(n))
    bad = [l for l in layers if isinstance(l, bool) or not isinstance(l, int) or not 0 <= l < n]
    if bad or not layers:
        raise ValueError(f"--layers {bad or layers} is outside 0..{n - 1} (the layers both models have)")
    return sorted(set(layers))


def diff(a: LoadedModel, b: LoadedModel, layers: list[int] | None = None) -> HeadDiff:
    """Per layer, every head of ``a`` against every head of ``b`` and the matching (module doc)."""
    check_comparable(a, b)
    out = []
    grouped = a.config.n_heads // a.config.kv_heads > 1
    same_groups = (a.config.n_heads, a.config.kv_heads) == (b.config.n_heads, b.config.kv_heads)
    for l in check_layers(layers, a, b):
        D = layer_distances(a.model, b.model, l).numpy()
        ga = a.config.n_heads // a.config.kv_heads if same_groups else 1
        pairs = match(D, ga, ga)
        ua = [h for h in range(D.shape[0]) if h not in {i for i, _ in pairs}]
        ub = [h for h in range(D.shape[1]) if h not in {j for _, j in pairs}]
        za, zb = (m.model.blocks[l].attn.form().sink for m in (a, b))
        sinks = [None if z is None else z.detach().double().cpu().numpy() for z in (za, zb)]
        out.append(LayerDiff(l, D, pairs, ua, ub, *sinks))
    return HeadDiff(a.name, b.name, out, grouped=grouped and same_groups)
