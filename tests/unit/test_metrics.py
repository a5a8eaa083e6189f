"""Concentration metrics against hand-computed rows, masks, summaries and gradients."""

import math

import pytest
import torch

from attn_core import metrics as mt

N = 8
ONE_HOT = torch.eye(N)[3]
UNIFORM = torch.full((N,), 1 / N)


def test_one_hot_row():
    assert mt.entropy(ONE_HOT).item() == pytest.approx(0.0, abs=1e-7)
    assert mt.normalized_entropy(ONE_HOT).item() == pytest.approx(0.0, abs=1e-7)
    assert mt.hoyer(ONE_HOT).item() == pytest.approx(1.0)
    assert mt.topk_mass(ONE_HOT, 1).item() == pytest.approx(1.0)
    assert mt.participation_ratio(ONE_HOT).item() == pytest.approx(1.0)
    assert mt.gini(ONE_HOT).item() == pytest.approx(1 - 1 / N)


def test_uniform_row():
    assert mt.entropy(UNIFORM).item() == pytest.approx(math.log(N))
    assert mt.normalized_entropy(UNIFORM).item() == pytest.approx(1.0)
    assert mt.hoyer(UNIFORM).item() == pytest.approx(0.0, abs=1e-6)
    assert mt.topk_mass(UNIFORM, 3).item() == pytest.approx(3 / N)
    assert mt.participation_ratio(UNIFORM).item() == pytest.approx(N)
    assert mt.gini(UNIFORM).item() == pytest.approx(0.0, abs=1e-6)


def test_two_point_row_by_hand():
    p = torch.tensor([0.0, 0.25, 0.0, 0.75])
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert mt.entropy(p).item() == pytest.approx(h)
    assert mt.normalized_entropy(p).item() == pytest.approx(h / math.log(4))
    l1, l2 = 1.0, math.sqrt(0.25**2 + 0.75**2)
    assert mt.hoyer(p).item() == pytest.approx((2 - l1 / l2) / (2 - 1))
    assert mt.participation_ratio(p).item() == pytest.approx(1 / (0.25**2 + 0.75**2))
    # ascending 0, 0, .25, .75 -> (2i - n - 1) = -3, -1, 1, 3
    assert mt.gini(p).item() == pytest.approx((1 * 0.25 + 3 * 0.75) / 4)
    assert mt.topk_mass(p, 2).item() == pytest.approx(1.0)


def test_mask_uses_each_rows_own_length():
    """Causal rows: row i sees i + 1 keys; a uniform row over them has normalized entropy 1
    and Hoyer 0, whatever the masked entries hold."""
    T = 6
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    p = mask.float() / mask.sum(-1, keepdim=True)
    p_noisy = torch.where(mask, p, torch.full_like(p, 0.3))  # garbage in hidden cells
    ne = mt.normalized_entropy(p_noisy, mask)
    assert ne[0].item() == 0.0  # one visible key
    assert torch.allclose(ne[1:], torch.ones(T - 1), atol=1e-6)
    assert torch.allclose(mt.hoyer(p_noisy, mask)[1:], torch.zeros(T - 1), atol=1e-6)
    assert torch.allclose(mt.participation_ratio(p_noisy, mask), torch.arange(1, T + 1).float())
    assert torch.allclose(mt.gini(p_noisy, mask), torch.zeros(T), atol=1e-6)
    assert torch.allclose(mt.entropy(p_noisy, mask), torch.arange(1, T + 1).float().log(), atol=1e-6)


def test_masked_gini_matches_unmasked_subset():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(5, 9, generator=g)
    mask = torch.rand(5, 9, generator=g) > 0.4
    mask[:, 0] = True
    got = mt.gini(p, mask)
    for r in range(5):
        assert got[r].item() == pytest.approx(mt.gini(p[r][mask[r]]).item(), abs=1e-6)
        assert mt.hoyer(p, mask)[r].item() == pytest.approx(mt.hoyer(p[r][mask[r]]).item(), abs=1e-6)


def test_row_probs_and_from_scores():
    s = torch.tensor([[1.0, 2.0, 3.0], [5.0, 0.0, -1.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    p = mt.row_probs(s, mask)
    assert p[0, 2] == 0 and torch.allclose(p.sum(-1), torch.ones(2))
    assert torch.allclose(p[0, :2], torch.softmax(s[0, :2], -1))
    c = mt.concentration(s, mask, from_scores=True)
    assert set(c) == set(mt.METRICS)
    assert torch.allclose(c["entropy"], mt.entropy(p, mask))


def test_summarize_skips_invalid_rows():
    v = torch.tensor([[1.0, 2.0, 9.0], [4.0, 5.0, 6.0]])
    valid = torch.tensor([True, True, False])
    s = mt.summarize(v, valid)
    assert s["mean"].tolist() == [1.5, 4.5] and s["min"].tolist() == [1.0, 4.0] and s["max"].tolist() == [2.0, 5.0]
    empty = mt.summarize(v, torch.zeros(3, dtype=torch.bool))
    assert torch.isnan(empty["mean"]).all()
    rows = mt.informative_rows(torch.tril(torch.ones(4, 4, dtype=torch.bool)), torch.Size([2, 4, 4]))
    assert rows.shape == (2, 4) and rows[0].tolist() == [False, True, True, True]


def test_metrics_are_differentiable():
    s = torch.randn(3, 7, requires_grad=True)
    mask = torch.tril(torch.ones(3, 7, dtype=torch.bool), 4)
    c = mt.concentration(s, mask, k=2, from_scores=True)
    total = sum(v.sum() for v in c.values())
    total.backward()
    assert torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0


def test_bad_k():
    with pytest.raises(ValueError, match="k must be"):
        mt.topk_mass(UNIFORM, 0)
