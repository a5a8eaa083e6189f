"""Blocked scores of one head (``bilinear.blocked``) against the dense computation: per-row top-k,
weights, entropy, sink mass, offsets and pooled overviews, over shapes, windows and grouped
heads (hypothesis); Q and K read from a model equal its own hooks; the mode split of a key equals
``attribute``'s; on the meta device the blocks run without a host read."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from attn_core.bilinear.blocked import LayerQK, layer_qk, pooled, row_stats, tile_for
from attn_core.bilinear.long import pool_blocks
from attn_core.hooks import act_name

TOL = dict(atol=2e-5, rtol=1e-4)


def dense(q, k, kv, scale, window, head):
    T = q.shape[1]
    S = (q[head].double() @ k[kv[head]].double().T) * scale[head]
    i = torch.arange(T)
    vis = i[None, :] <= i[:, None]
    if window:
        vis &= i[:, None] - i[None, :] < window
    A = torch.softmax(S.masked_fill(~vis, -math.inf), -1)
    return S, A, vis


def check_rows(stats, S, A, vis, k):
    T = S.shape[0]
    ent = -torch.where(A > 0, A * A.log(), torch.zeros_like(A)).sum(-1)
    assert torch.allclose(stats.entropy.double(), ent, **TOL)
    assert torch.allclose(stats.sink.double(), A[:, 0], **TOL)
    lse = torch.logsumexp(S.masked_fill(~vis, -math.inf), -1)
    assert torch.allclose(stats.lse.double(), lse, **TOL)
    assert torch.equal(stats.seen, vis.sum(-1))
    top_w, _ = A.topk(k, -1)
    keys = stats.top_keys
    real = keys >= 0
    assert torch.equal(real.sum(-1), torch.clamp(vis.sum(-1), max=k))  # as many keys as the row sees, up to k
    assert torch.allclose(torch.where(real, stats.top_weights.double(), 0), torch.where(real, top_w, 0), **TOL)
    at = keys.clamp_min(0)
    assert bool(vis.gather(1, at)[real].all())  # every listed key is visible
    assert torch.allclose(A.gather(1, at)[real], stats.top_weights.double()[real], **TOL)  # and has that weight
    assert torch.allclose(S.gather(1, at)[real], stats.top_scores.double()[real], **TOL)
    P = stats.offsets.shape[1]
    for d in range(min(P, T)):
        rows = torch.arange(d, T)
        want = torch.where(vis[rows, rows - d], A[rows, rows - d], torch.full_like(A[rows, 0], math.nan))
        assert torch.allclose(stats.offsets[d:, d].double(), want, equal_nan=True, **TOL)
        assert stats.offsets[:d, d].isnan().all()


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 70),
    heads=st.sampled_from([(1, 1), (2, 1), (4, 2), (4, 4)]),
    w=st.integers(1, 8),
    window=st.integers(0, 80),
    block=st.integers(1, 40),
    k=st.integers(1, 12),
    tile=st.integers(1, 20),
    seed=st.integers(0, 2**16),
)
def test_blocked_rows_equal_the_dense_rows(T, heads, w, window, block, k, tile, seed):
    H, G = heads
    g = torch.Generator().manual_seed(seed)
    q, kk = torch.randn(H, T, w, generator=g) * 2, torch.randn(G, T, w, generator=g) * 2
    kv = tuple(h // (H // G) for h in range(H))
    scale = tuple(w**-0.5 for _ in range(H))
    qk = LayerQK(0, [0] * T, q, kk, kv, scale, window)
    head = H - 1
    k, tile = min(k, T), min(tile, T)
    stats = row_stats(qk, head, k=k, offsets=min(6, T), block=block)
    S, A, vis = dense(q, kk, kv, scale, window, head)
    check_rows(stats, S, A, vis, k)
    for pool in ("max", "mean"):
        want = pool_blocks(A, vis, tile, pool)
        got = pooled(qk, head, stats.lse, (0, T), (0, T), tile, pool)
        assert torch.allclose(got.double(), want, equal_nan=True, **TOL)
        want_s = pool_blocks(S, vis, tile, pool)
        assert torch.allclose(
            pooled(qk, head, None, (0, T), (0, T), tile, pool).double(), want_s, equal_nan=True, **TOL
        )
    r0, c0 = T // 3, T // 4  # a zoomed region, at full resolution and pooled
    got = pooled(qk, head, stats.lse, (r0, T), (c0, T), 1)
    want = A[r0:, c0:].masked_fill(~vis[r0:, c0:], math.nan)
    assert torch.allclose(got.double(), want, equal_nan=True, **TOL)


def test_bad_requests_are_one_sentence():
    qk = LayerQK(0, [0] * 10, torch.randn(2, 10, 4), torch.randn(2, 10, 4), (0, 1), (0.5, 0.5), 0)
    for call, words in [
        (lambda: row_stats(qk, 2), "head 2 is outside 0..1"),
        (lambda: row_stats(qk, 0, k=0), "k (top keys) must be an integer in 1..10"),
        (lambda: row_stats(qk, 0, k=11), "in 1..10"),
        (lambda: pooled(qk, 0, None, (0, 11), (0, 10), 2), "outside"),
        (lambda: pooled(qk, 0, None, (0, 10), (0, 10), 2, "median"), "pool must be one of"),
    ]:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            call()
    assert tile_for(8192, 800) == 11 and tile_for(100, 800) == 1


def test_layer_qk_reads_the_models_own_q_and_k(tiny_model):
    model = tiny_model("reverse", std=0.5, n_layers=2, n_heads=4, n_kv_heads=2, positional="rotary", attn_bias=True)
    T = model.cfg.n_ctx
    ids = torch.randint(0, model.cfg.d_vocab, (T,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids]))
    qk = layer_qk(model, ids, 1)
    assert qk.k.shape[0] == 2 and qk.kv_head == (0, 0, 1, 1) and qk.x is None
    for h in range(4):
        S = cache[act_name("attn_scores", 1)][0, h]
        A = cache[act_name("pattern", 1)][0, h]
        mask = model.mask(T, model.cfg.window(1))
        stats = row_stats(qk, h, k=3, block=3)
        check_rows(stats, S.double(), A.double(), mask, 3)


def test_meta_device_runs_without_a_host_read():
    q = torch.empty(2, 40, 4, device="meta")
    qk = LayerQK(0, [0] * 40, q, torch.empty(1, 40, 4, device="meta"), (0, 0), (0.5, 0.5), 7)
    stats = row_stats(qk, 1, k=4, block=16)
    assert stats.top_keys.device.type == "meta" and stats.entropy.shape == (40,) and stats.offsets.device.type == "meta"
    out = pooled(qk, 1, stats.lse, (0, 40), (0, 40), 8, "mean")
    assert out.device.type == "meta" and out.shape == (5, 5)


def test_a_pages_long_input_is_bounded_by_the_forwards_memory(tiny_model, monkeypatch):
    from attn_core import limits
    from attn_core.bilinear import blocked

    model = tiny_model("reverse", positional="rotary", n_ctx=2**20)
    limit = blocked.forward_bytes(model, 300_000)
    monkeypatch.setattr(limits, "memory_limit", lambda: limit)
    assert blocked.longest_input(model) == 300_000  # not the context of 2^20
    assert len(blocked.check_input(model, [1] * 300_000)) == 300_000
    with pytest.raises(limits.LimitError, match="the forward on 300001 tokens needs"):
        blocked.check_input(model, [1] * 300_001)


def test_the_forwards_memory_grows_linearly_in_the_tokens(tiny_model):
    from attn_core.bilinear.blocked import forward_bytes

    for config in (dict(positional="rotary", n_kv_heads=1), dict(sliding_window=[64])):
        model = tiny_model("reverse", n_ctx=2**16, **config)
        b = [forward_bytes(model, n) for n in (8192, 16384, 32768)]
        assert b[2] - b[1] == 2 * (b[1] - b[0])  # no n^2 term
    grown = tiny_model("reverse", n_ctx=2**16, d_qk=[[4, 8]])  # its attention forms S: n^2 counted
    assert forward_bytes(grown, 32768) > 3 * 2 * 32768**2 * 4


class _Shapes(TorchDispatchMode):
    """Records the largest tensor (elements) any op makes."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("config", [dict(n_kv_heads=1), dict(sliding_window=[0, 64])], ids=["gqa", "window"])
def test_the_blocked_path_never_makes_a_T_by_T_tensor(tiny_model, config):
    """The forward that feeds the blocked scores (mask included) and the blocks themselves: every
    tensor made is far below T x T elements."""
    T = 4096
    model = tiny_model("reverse", n_layers=2, positional="rotary", n_ctx=T, **config)
    ids = torch.randint(0, model.cfg.d_vocab, (T,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad(), _Shapes() as shapes:
        qk = layer_qk(model, ids, 1)
        row_stats(qk, 0, k=4)
        model(torch.tensor([ids]))  # the plain forward too
    assert 0 < shapes.largest < T * T // 8


def test_a_sliding_window_in_blocks_equals_the_dense_mask(tiny_model):
    """Past WINDOW_BLOCK queries a window layer's fused attention runs by blocks: the same output
    as the explicit path's dense mask."""
    from attn_core.model.attention import WINDOW_BLOCK

    T = 3 * WINDOW_BLOCK + 37
    model = tiny_model(
        "reverse", std=0.3, n_layers=2, n_heads=4, n_kv_heads=2, positional="rotary", n_ctx=T, sliding_window=[100, 7]
    )
    tokens = torch.randint(0, model.cfg.d_vocab, (1, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        fused = model(tokens)
        hooks = [(act_name("pattern", l), lambda t, n: None) for l in range(2)]  # reading A forms S: the dense mask
        explicit = model.run_with_hooks(tokens, hooks)
    assert torch.allclose(fused, explicit, atol=1e-5, rtol=1e-4)


def test_the_block_loops_run_on_one_thread_and_give_the_threads_back():
    """A block's ops are too small to share among threads (on a busy machine each wait costs a
    time slice): row_stats and pooled run theirs on one thread, then the count comes back."""
    T = 1100
    qk = LayerQK(0, [0] * T, torch.randn(2, T, 4), torch.randn(1, T, 4), (0, 0), (0.5, 0.5), 0)
    seen = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        stats = row_stats(qk, 0, k=4, progress=lambda done, total: seen.append(torch.get_num_threads()))
        pooled(qk, 0, stats.lse, (0, T), (0, T), 100, progress=lambda done, total: seen.append(torch.get_num_threads()))
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_one_check_count_whose_bounds_are_named():
    """One ``check_count`` in the library (limits'), its bounds never given the wrong way round:
    ``lo`` and ``hi`` are keywords, low first; a range that is no lab limit is
    ``validate.check_int(name, value, lo, hi)``."""
    from attn_core import limits
    from attn_core.bilinear import blocked

    assert not hasattr(blocked, "check_count")
    with pytest.raises(TypeError):
        limits.check_count("n", 5, 10)
    with pytest.raises(TypeError):
        limits.check_count("n", 5, 1, 10)
    assert limits.check_count("n", 5, lo=2, hi=10) == 5
