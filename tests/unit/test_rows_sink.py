"""A learned sink logit per head (gpt-oss: p_ij = exp(s_ij) / (exp(sink_h) + sum_j' exp(s_ij'))) in
the row engine, against a dense float64 computation where the sink is one more key every query
sees: values and gradients in q, k and the sink of every row kind, on both paths (query blocks
and the fused attention pass), every mask, all rows or a subset; the blocked long-input rows'
entropy, weights and the two shares of the sink mass."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_core import metrics
from attn_core.bilinear.blocked import LayerQK, pooled, row_stats
from attn_core.regularizers.rows import head_means, row_values
from tests.unit.test_penalty_blocked import dense_mask


def dense_sink_values(q, k, sink, kind, window, lengths, topk):
    """Every row's penalty from the [b, h, T, T + 1] softmax whose last column is the sink's."""
    b, h, T = q.shape[0], q.shape[1], k.shape[2]
    mask = dense_mask(T, window, lengths).expand(b, h, T, T)
    S = (q @ k.transpose(-1, -2)).masked_fill(~mask, -math.inf)
    S = torch.cat([S, sink.view(1, h, 1, 1).expand(b, h, T, 1)], -1)
    full = torch.cat([mask, torch.ones(b, h, T, 1, dtype=torch.bool)], -1)
    p = torch.softmax(S, -1)
    seen = mask.sum(-1) > 0
    if kind == "entropy":
        value = metrics.normalized_entropy(p, full)
    elif kind == "hoyer":
        value = 1 - metrics.hoyer(p, full)
    elif kind == "topk":
        value = 1 - metrics.topk_mass(p, topk, full)
    else:  # the learned share and key 0's
        value = p[..., -1] + torch.where(mask[..., 0], p[..., 0], torch.zeros_like(p[..., 0]))
    return value, seen


@st.composite
def problems(draw):
    b, h, T, w = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 16)), draw(st.integers(1, 4))
    subset = draw(st.none() | st.lists(st.integers(0, T - 1), min_size=1, max_size=T, unique=True))
    return dict(
        b=b,
        h=h,
        T=T,
        w=w,
        window=draw(st.sampled_from([None, 0, 1, 3])),
        lengths=draw(st.none() | st.lists(st.integers(1, T), min_size=b, max_size=b)),
        positions=None if subset is None else sorted(subset),
        kind=draw(st.sampled_from(["entropy", "hoyer", "topk", "sink"])),
        topk=draw(st.integers(1, 3)),
        block=draw(st.integers(1, T + 2)),
        scale=draw(st.sampled_from([0.3, 1.0, 3.0])),
        sink_scale=draw(st.sampled_from([0.1, 1.0, 5.0])),
        seed=draw(st.integers(0, 2**16)),
        path=draw(st.sampled_from(["auto", "blocked"])),
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_rows_with_a_sink_logit_equal_the_dense_softmax(p):
    g = torch.Generator().manual_seed(p["seed"])
    shape = (p["b"], p["h"], p["T"], p["w"])
    q = (p["scale"] * torch.randn(shape, generator=g, dtype=torch.float64)).requires_grad_()
    k = torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_()
    sink = (p["sink_scale"] * torch.randn(p["h"], generator=g, dtype=torch.float64)).requires_grad_()
    key_mask = None
    if p["lengths"] is not None:
        key_mask = torch.arange(p["T"])[None, :] < torch.tensor(p["lengths"])[:, None]
    rows = None if p["positions"] is None else torch.tensor(p["positions"])
    got = row_values(
        q if rows is None else q[:, :, rows],
        k,
        p["kind"],
        window=p["window"],
        key_mask=key_mask,
        positions=rows,
        topk=p["topk"],
        block=p["block"],
        path=p["path"],
        sink=sink,
    )
    want, seen = dense_sink_values(q, k, sink, p["kind"], p["window"], p["lengths"], p["topk"])
    if rows is not None:
        want, seen = want[:, :, rows], seen[:, :, rows]
    torch.testing.assert_close(got[seen], want[seen], atol=1e-10, rtol=0)
    weights = torch.randn(want.shape, generator=g, dtype=torch.float64) * seen
    g_got = torch.autograd.grad((got * weights).sum(), (q, k, sink))
    g_want = torch.autograd.grad((want * weights).sum(), (q, k, sink))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("kind", ["entropy", "sink"])
def test_the_fused_pass_with_a_sink_equals_the_blocks(kind):
    """Every row, no padding: the fused attention pass (CPU kernel) and the query blocks agree
    in value and in the gradient of the sink, in float32 too."""
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 4, 40, 8, generator=g), torch.randn(2, 4, 40, 8, generator=g)
    sink = torch.randn(4, generator=g).requires_grad_()
    for window in (0, 7, None):
        fused = head_means(q, k, kind, window=window, sink=sink, path="flash")
        blocked = head_means(q, k, kind, window=window, sink=sink, path="blocked")
        torch.testing.assert_close(fused, blocked, atol=1e-5, rtol=1e-5)
        (a,) = torch.autograd.grad(fused.sum(), sink)
        (b,) = torch.autograd.grad(blocked.sum(), sink)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_a_very_negative_sink_is_no_sink():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 2, 12, 4, generator=g), torch.randn(1, 2, 12, 4, generator=g)
    for kind in ("entropy", "hoyer", "topk", "sink"):
        plain = row_values(q, k, kind, path="blocked")
        gone = row_values(q, k, kind, path="blocked", sink=torch.full((2,), -1e4))
        # the count of outcomes is n + 1 with a sink: the entropy normalizes by log(n + 1)
        if kind == "entropy":
            n = torch.arange(1, 13, dtype=torch.float32)
            plain = plain * torch.where(n > 1, n.clamp_min(2).log(), 1) / (n + 1).log()
        if kind == "hoyer":
            continue  # its normalization moves with n too
        torch.testing.assert_close(gone, plain, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "sink, alpha, message",
    [
        (torch.zeros(3), 1.0, r"sink must be a float tensor of one logit per head, shape \(2,\); got \(3,\)"),
        ([0.0, 0.0], 1.0, r"sink must be a float tensor of one logit per head, shape \(2,\); got list"),
        (torch.zeros(2, dtype=torch.long), 1.0, "sink must be a float tensor"),
        (torch.zeros(2), 1.5, r"a sink logit joins softmax rows; these are alpha-entmax rows \(alpha 1.5\)"),
    ],
)
def test_a_bad_sink_is_one_sentence(sink, alpha, message):
    q = torch.randn(1, 2, 5, 3)
    with pytest.raises(ValueError, match=message) as e:
        row_values(q, q, "entropy", alpha=alpha, sink=sink)
    assert "\n" not in str(e.value)


@settings(max_examples=30, deadline=None)
@given(
    T=st.integers(1, 50),
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2)]),
    window=st.integers(0, 60),
    block=st.integers(1, 30),
    seed=st.integers(0, 2**16),
)
def test_blocked_long_rows_with_a_sink_equal_the_dense_rows(T, heads, window, block, seed):
    H, G = heads
    g = torch.Generator().manual_seed(seed)
    q, kk = torch.randn(H, T, 4, generator=g) * 2, torch.randn(G, T, 4, generator=g) * 2
    kv = tuple(h // (H // G) for h in range(H))
    sink = torch.randn(H, generator=g) * 3
    qk = LayerQK(0, [0] * T, q, kk, kv, (0.5,) * H, window, sink=sink)
    head = H - 1
    stats = row_stats(qk, head, k=min(3, T), offsets=min(4, T), block=block)
    i = torch.arange(T)
    vis = i[None, :] <= i[:, None]
    if window:
        vis &= i[:, None] - i[None, :] < window
    S = (q[head].double() @ kk[kv[head]].double().T) * 0.5
    S = torch.cat([S.masked_fill(~vis, -math.inf), torch.full((T, 1), float(sink[head]), dtype=torch.float64)], -1)
    P = torch.softmax(S, -1)
    tol = dict(atol=2e-5, rtol=1e-4)
    ent = -torch.where(P > 0, P * P.log(), torch.zeros_like(P)).sum(-1)
    torch.testing.assert_close(stats.entropy.double(), ent, **tol)
    torch.testing.assert_close(stats.lse.double(), torch.logsumexp(S, -1), **tol)
    torch.testing.assert_close(stats.learned.double(), P[:, -1], **tol)
    torch.testing.assert_close(stats.sink.double(), P[:, 0], **tol)
    top = P[:, :-1].topk(min(3, T), -1).values
    real = stats.top_keys >= 0
    torch.testing.assert_close(stats.top_weights.double()[real], top[real], **tol)
    want = P[:, :-1].masked_fill(~vis, math.nan)
    torch.testing.assert_close(pooled(qk, head, stats.lse, (0, T), (0, T), 1).double(), want, equal_nan=True, **tol)
    assert [r["learned_sink"] for r in stats.queries()] == pytest.approx(stats.learned.tolist())


def fused_on_the_cpu(monkeypatch):
    """The accelerator's fused block kernels (softmax_rows.Fused) on the CPU, compiled by aot_eager."""
    from attn_core.regularizers import softmax_rows

    for fused in (softmax_rows.fused_forward, softmax_rows.fused_backward):
        monkeypatch.setattr(fused, "devices", ["cpu"])
        monkeypatch.setattr(fused, "backend", "aot_eager")
        monkeypatch.setattr(fused, "compiled", None)
        monkeypatch.setattr(fused, "failed", False)
    return softmax_rows.fused_forward, softmax_rows.fused_backward


@pytest.mark.parametrize("kind", ["entropy", "hoyer", "topk"])
def test_the_fused_blocks_with_a_sink_equal_the_dense_softmax(kind, monkeypatch):
    forward, backward = fused_on_the_cpu(monkeypatch)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 14, 4, generator=g, dtype=torch.float64).requires_grad_()
    k = torch.randn(2, 3, 14, 4, generator=g, dtype=torch.float64).requires_grad_()
    sink = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
    torch._dynamo.reset()
    got = row_values(q, k, kind, window=3, topk=2, block=5, path="blocked", sink=sink)
    want, seen = dense_sink_values(q, k, sink, kind, 3, None, 2)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    g_got = torch.autograd.grad(got.sum(), (q, k, sink))
    g_want = torch.autograd.grad(want.sum(), (q, k, sink))
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)
    assert forward.compiled is not None and not forward.failed and not backward.failed


def test_a_compiled_penalty_with_a_sink_equals_eager():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 16, 8, generator=g).requires_grad_()
    k = torch.randn(2, 3, 16, 8, generator=g).requires_grad_()
    sink = torch.randn(3, generator=g).requires_grad_()

    def f(q, k, sink):
        return head_means(q, k, "topk", window=0, block=6, topk=2, sink=sink).sum()

    torch._dynamo.reset()
    eager, compiled = f(q, k, sink), torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, sink)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(compiled, (q, k, sink)), torch.autograd.grad(eager, (q, k, sink))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_head_summaries_with_a_sink_equal_the_dense_softmax():
    from attn_core.regularizers.summaries import head_summaries

    g = torch.Generator().manual_seed(2)
    q, k = (
        torch.randn(2, 3, 10, 4, generator=g, dtype=torch.float64),
        torch.randn(2, 3, 10, 4, generator=g, dtype=torch.float64),
    )
    sink = torch.randn(3, generator=g, dtype=torch.float64)
    entropy, top1 = head_summaries(q, k, window=0, sink=sink)
    want_entropy, seen = dense_sink_values(q, k, sink, "entropy", 0, None, 1)
    want_top1 = 1 - dense_sink_values(q, k, sink, "topk", 0, None, 1)[0]
    rows = torch.arange(10) >= 1  # the rows with at least two visible keys
    torch.testing.assert_close(entropy, want_entropy[..., rows].mean((0, 2)), atol=1e-10, rtol=0)
    torch.testing.assert_close(top1, want_top1[..., rows].mean((0, 2)), atol=1e-10, rtol=0)
