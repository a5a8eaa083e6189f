"""Head diffing from B alone (attn_core.surgery.diff): the distance against a dense computation
(rotary heads: plane by plane, averaged over offsets), and a model against the same model with
its heads permuted inside each layer and each head's factors mixed by a random invertible M
(W_Q -> W_Q M, W_K -> W_K M^-T; rotary: M commuting with the rotations; grouped-query attention:
whole key/value groups moved): the logits are unchanged and the heads are matched back exactly
with distance ~0 (1e-6)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_core.checkpoint import LoadedModel
from attn_core.surgery import diff, layer_distances, match, planes
from tests.conftest import make_tiny_model


def loaded_of(model, name) -> LoadedModel:
    return LoadedModel(name=name, model=model, config=model.cfg)


def dense_B(model, layer, head, offset=None):
    attn = model.blocks[layer].attn
    Q = attn.W_Q[head].detach().double()
    K = attn.per_head("W_K")[head].detach().double()
    return Q @ K.T / Q.shape[-1] ** 0.5


def plane_M(model, g):
    """An invertible M that commutes with every rotation: a random complex scalar per plane,
    any invertible block on the offset-free dims."""
    d = model.cfg.d_head
    M = torch.zeros(d, d, dtype=torch.float64)
    for p in planes(model):
        if len(p) == 2 and p[1] - p[0] == model.cfg.rotary_dims // 2:
            a, b = torch.randn(2, generator=g, dtype=torch.float64)
            M[p[0], p[0]], M[p[0], p[1]], M[p[1], p[0]], M[p[1], p[1]] = a + 2, -b, b, a + 2
        else:
            M[np.ix_(p, p)] = torch.randn(len(p), len(p), generator=g, dtype=torch.float64) + 3 * torch.eye(len(p))
    return M


@torch.no_grad()
def scrambled(model, seed=0):
    """The same function: heads permuted inside each layer (whole groups under GQA) and each
    head's factors mixed by M; returns (model, permutation per layer: new head -> old head)."""
    g = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    cfg = model.cfg
    group = cfg.n_heads // cfg.kv_heads
    perms = []
    for block in out.blocks:
        attn = block.attn
        gp = torch.randperm(cfg.kv_heads, generator=g)
        inner = [torch.randperm(group, generator=g) for _ in range(cfg.kv_heads)]
        perm = torch.tensor([int(gp[x]) * group + int(inner[x][i]) for x in range(cfg.kv_heads) for i in range(group)])
        perms.append(perm.tolist())
        for n in ("W_Q", "W_O") + (("b_Q",) if cfg.attn_bias else ()):
            getattr(attn, n).data = getattr(attn, n).data[perm].clone()
        for n in ("W_K", "W_V") + (("b_K", "b_V") if cfg.attn_bias else ()):
            getattr(attn, n).data = getattr(attn, n).data[gp].clone()
        for x in range(cfg.kv_heads):  # one M per key/value group (W_K is shared)
            if cfg.positional == "rotary":
                M = plane_M(model, g)
            else:
                M = torch.randn(cfg.d_head, cfg.d_head, generator=g, dtype=torch.float64) + 3 * torch.eye(cfg.d_head)
            Minv_T = torch.linalg.inv(M).T
            attn.W_K.data[x] = (attn.W_K.data[x].double() @ Minv_T).float()
            if cfg.attn_bias:
                attn.b_K.data[x] = (attn.b_K.data[x].double() @ Minv_T).float()
            for h in range(x * group, (x + 1) * group):
                attn.W_Q.data[h] = (attn.W_Q.data[h].double() @ M).float()
                if cfg.attn_bias:
                    attn.b_Q.data[h] = (attn.b_Q.data[h].double() @ M).float()
    return out, perms


CASES = {
    "plain": dict(n_layers=2, n_heads=4, d_model=16, d_head=8, attn_bias=True),
    "rotary-gqa": dict(n_layers=2, n_heads=6, n_kv_heads=2, d_model=24, d_head=8, rotary_dim=6, positional="rotary"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_permuted_and_mixed_heads_are_matched_back_with_distance_zero(case):
    model = make_tiny_model("reverse", seed=0, std=0.4, **CASES[case])
    other, perms = scrambled(model)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(other(tokens), model(tokens), atol=1e-4)
    result = diff(loaded_of(other, "b"), loaded_of(model, "a"))
    assert result.grouped == (case == "rotary-gqa")
    for ld, perm in zip(result.layers, perms):
        assert ld.pairs == [(new, old) for new, old in enumerate(perm)]
        assert max(ld.distance[i, j] for i, j in ld.pairs) < 1e-6
        off = ld.distance + np.eye(len(perm))[perm] * 9  # every other pair is far
        assert off.min() > 0.05
    js = result.to_json()
    assert {"layer", "head_a", "head_b", "distance"} <= set(js["pairs"][0]) and js["unmatched"] == []


def test_distance_against_dense_B():
    a = make_tiny_model("reverse", seed=1, std=0.4, n_heads=3)
    b = make_tiny_model("reverse", seed=2, std=0.4, n_heads=3)
    D = layer_distances(a, b, 0)
    for i in range(3):
        for j in range(3):
            Ba, Bb = dense_B(a, 0, i), dense_B(b, 0, j)
            ref = ((Ba - Bb).norm() / (Ba.norm() + Bb.norm())).detach()
            assert abs(float(D[i, j]) - float(ref)) < 1e-6


def test_rotary_distance_is_the_offset_mean_over_planes():
    kw = dict(n_heads=2, d_model=16, d_head=8, rotary_dim=6, positional="rotary")
    a, b = (make_tiny_model("reverse", seed=s, std=0.4, **kw) for s in (1, 2))
    D = layer_distances(a, b, 0)

    def parts(m, h):
        Q = m.blocks[0].attn.W_Q[h].detach().double() / 8**0.5
        K = m.blocks[0].attn.W_K[h].detach().double()
        out = []
        for p in planes(m):
            out.append((Q[:, p] @ K[:, p].T, 1.0 if len(p) != 2 or p[1] - p[0] != 3 else 0.5))
            if len(p) == 2 and p[1] - p[0] == 3:
                J = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)
                out.append((Q[:, p] @ J @ K[:, p].T, 0.5))
        return out

    for i in range(2):
        for j in range(2):
            pa, pb = parts(a, i), parts(b, j)
            sq = sum(w * ((x - y) ** 2).sum() for (x, w), (y, _) in zip(pa, pb))
            na = sum(w * (x**2).sum() for x, w in pa).sqrt()
            nb = sum(w * (y**2).sum() for y, w in pb).sqrt()
            assert abs(float(D[i, j]) - float(sq.sqrt() / (na + nb))) < 1e-6


def test_different_head_counts_name_the_heads_left_over_and_merged_heads_compare_densely():
    a = make_tiny_model("reverse", seed=1, std=0.4, n_heads=4, d_model=16, d_head=4)
    b = copy.deepcopy(a)
    b_small = make_tiny_model("reverse", seed=2, std=0.4, n_heads=2, d_model=16, d_head=4)
    js = diff(loaded_of(a, "a"), loaded_of(b_small, "b")).to_json()
    assert len(js["pairs"]) == 2 and len(js["unmatched"]) == 2 and {u["model"] for u in js["unmatched"]} == {"a"}
    merged = make_tiny_model("reverse", seed=3, std=0.4, n_heads=4, d_model=16, qk="merged")
    with torch.no_grad():
        for h in range(4):
            merged.blocks[0].attn.W_QK[h] = dense_B(b, 0, h).float()
    res = diff(loaded_of(a, "a"), loaded_of(merged, "merged"))
    assert [p for p in res.layers[0].pairs] == [(h, h) for h in range(4)]
    assert res.layers[0].distance.diagonal().max() < 1e-6
    with pytest.raises(ValueError, match="d_model"):
        diff(loaded_of(a, "a"), loaded_of(make_tiny_model("reverse", d_model=8), "c"))
    with pytest.raises(ValueError, match="--layers"):
        diff(loaded_of(a, "a"), loaded_of(b, "b"), layers=[3])


def test_heads_of_different_widths_compare_in_b_space():
    """One d_model, heads of different widths (4 heads x 8 against 8 heads x 4, as GPT-2 folders
    of d_model 32 have): every pair's distance is that of the dense d_model x d_model forms, and
    a head whose B the other model holds exactly is matched to it with distance ~0."""
    a = make_tiny_model("reverse", seed=1, std=0.4, n_layers=1, n_heads=4, d_model=32, d_head=8)
    b = make_tiny_model("reverse", seed=2, std=0.4, n_layers=1, n_heads=8, d_model=32, d_head=4)
    with torch.no_grad():  # b's head 5 carries a's head 2's form at rank 4: W_Q W_K^T / sqrt(w), w 8 -> 4
        U, S, Vh = torch.linalg.svd(dense_B(a, 0, 2))
        a.blocks[0].attn.W_Q[2] = (U[:, :8] * S[:8]).float() * 8**0.5
        a.blocks[0].attn.W_K[2] = Vh[:8].T.float()
        a.blocks[0].attn.W_Q[2, :, 4:] = 0.0
        b.blocks[0].attn.W_Q[5] = a.blocks[0].attn.W_Q[2, :, :4] / 8**0.5 * 4**0.5
        b.blocks[0].attn.W_K[5] = a.blocks[0].attn.W_K[2, :, :4]
    D = layer_distances(a, b, 0)
    assert D.shape == (4, 8)
    for i in range(4):
        for j in range(8):
            Ba, Bb = dense_B(a, 0, i), dense_B(b, 0, j)
            assert abs(float(D[i, j]) - float((Ba - Bb).norm() / (Ba.norm() + Bb.norm()))) < 1e-6
    res = diff(loaded_of(a, "a"), loaded_of(b, "b"))
    assert (2, 5) in res.layers[0].pairs and res.layers[0].distance[2, 5] < 1e-6
    assert len(res.layers[0].unmatched_b) == 4 and res.layers[0].unmatched_a == []
    js = diff(loaded_of(b, "b"), loaded_of(a, "a")).to_json()
    assert len(js["pairs"]) == 4 and {u["model"] for u in js["unmatched"]} == {"a"}


def test_grouped_matching_moves_whole_groups():
    """Heads 1 and 2 would swap across key/value groups in a plain matching; the grouped one
    keeps each group of A on one group of B."""
    D = np.array([[0.0, 1, 1, 1], [1, 0.5, 0, 1], [1, 0, 0.5, 1], [1, 1, 1, 0]])
    assert match(D) == [(0, 0), (1, 2), (2, 1), (3, 3)]
    grouped = match(D, 2, 2)
    assert grouped == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert all(len({j // 2 for i, j in grouped if i // 2 == x}) == 1 for x in range(2))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n_heads=st.integers(1, 4), scale=st.floats(0.05, 5.0))
def test_the_distance_is_symmetric_factor_free_and_sees_scale(seed, n_heads, scale):
    a = make_tiny_model("reverse", seed=seed, std=0.4, n_heads=n_heads, d_model=12, d_head=4)
    b = make_tiny_model("reverse", seed=seed + 1, std=0.4, n_heads=n_heads, d_model=12, d_head=4)
    D, Dt = layer_distances(a, b, 0), layer_distances(b, a, 0)
    assert torch.allclose(D, Dt.T, atol=1e-9) and bool((D >= 0).all()) and bool((D <= 1 + 1e-9).all())
    mixed, _ = scrambled(a, seed)
    assert float(layer_distances(a, mixed, 0).min(1).values.max()) < 1e-6
    scaled = copy.deepcopy(a)
    with torch.no_grad():
        scaled.blocks[0].attn.W_Q.mul_(scale)
    ref = abs(scale - 1) / (1 + scale)  # ||B - sB|| / (||B|| + ||sB||)
    assert torch.allclose(
        layer_distances(a, scaled, 0).diagonal(), torch.full((n_heads,), ref, dtype=torch.float64), atol=1e-6
    )
