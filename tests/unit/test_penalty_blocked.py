"""Row penalties in query blocks (attn_core/regularizers/rows.py) against an independent dense
computation, the sampled-rows estimate's unbiasedness, the fused attention kept by a penalty's
cache, the meta device, bf16 inputs and torch.compile.

Tolerances: float64 values to 1e-10 and gradients to 1e-9 (the blocked and dense sums differ only
in summation order, and in scores more than 64 below their row's max, weighted exp(-64) = 1.6e-28
instead of their true, smaller weight); float32 eager against compiled to 1e-5 (fused kernels
reorder float32 sums); the sampled mean within 5 standard errors of the exact value.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_core import metrics
from attn_core import regularizers as R
from attn_core.hooks import Cache, act_name
from attn_core.model import ModelConfig, Transformer, attention_weights
from attn_core.regularizers.rows import block_rows, head_means, row_values

DENSE = {
    "entropy": lambda p, m, k: metrics.normalized_entropy(p, m),
    "hoyer": lambda p, m, k: 1 - metrics.hoyer(p, m),
    "topk": lambda p, m, k: 1 - metrics.topk_mass(p, k, m),
    "sink": lambda p, m, k: metrics.first_key_mass(p, m),
}


def dense_mask(T: int, window, lengths) -> torch.Tensor:
    """[b or 1, 1, T, T], True where query i sees key j: the whole row (window None), causal
    (0) or a causal window of w keys, and only the first lengths[b] keys (right padding)."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    mask = torch.ones(T, T, dtype=torch.bool)
    if window is not None:
        mask = j <= i
        if window > 0:
            mask = mask & (i - j < window)
    mask = mask[None, None]
    if lengths is not None:
        mask = mask & (torch.arange(T)[None, None, None, :] < torch.tensor(lengths)[:, None, None, None])
    return mask


def dense_values(q, k, kind, window, lengths, topk, alpha):
    """Every row's penalty from the whole [b, h, T, T] pattern, and the rows with a visible key."""
    T = k.shape[2]
    mask = dense_mask(T, window, lengths)
    seen = mask.sum(-1) > 0
    safe = mask | ~seen[..., None]  # a row that sees nothing: any finite row (never compared)
    A = attention_weights(q @ k.transpose(-1, -2), safe, alpha)
    return DENSE[kind](A, safe, topk), seen


@st.composite
def problems(draw):
    b, h, T, w = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 20)), draw(st.integers(1, 5))
    window = draw(st.sampled_from([None, 0, 1, 2, 3, 7]))
    lengths = draw(st.none() | st.lists(st.integers(1, T), min_size=b, max_size=b))
    subset = draw(st.none() | st.lists(st.integers(0, T - 1), min_size=1, max_size=T, unique=True))
    return dict(
        b=b, h=h, T=T, w=w, window=window, lengths=lengths, positions=None if subset is None else sorted(subset),
        kind=draw(st.sampled_from(sorted(DENSE))), topk=draw(st.integers(1, 3)),
        alpha=draw(st.sampled_from([1.0, 1.0, 1.5, 2.0])), block=draw(st.integers(1, T + 2)),
        scale=draw(st.sampled_from([0.3, 1.0, 3.0, 30.0])), fold=draw(st.sampled_from([1.0, 0.25, 3.0])),
        seed=draw(st.integers(0, 2**16)), path=draw(st.sampled_from(["auto", "blocked"])),
    )  # fmt: skip


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_blocked_rows_equal_the_dense_pattern(p):
    """Every kind, softmax and entmax, every mask (none, causal, sliding window, right padding),
    any block size, all rows or a subset, a scale given or folded into q, in query blocks or (auto)
    the fused pass where it applies: values and gradients in q and k equal the dense ones."""
    g = torch.Generator().manual_seed(p["seed"])
    shape = (p["b"], p["h"], p["T"], p["w"])
    q = (p["scale"] * torch.randn(shape, generator=g, dtype=torch.float64)).requires_grad_()
    k = torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_()
    key_mask = None
    if p["lengths"] is not None:
        key_mask = torch.arange(p["T"])[None, :] < torch.tensor(p["lengths"])[:, None]
    rows = None if p["positions"] is None else torch.tensor(p["positions"])
    q_rows = q if rows is None else q[:, :, rows]
    args = dict(
        window=p["window"], key_mask=key_mask, topk=p["topk"], alpha=p["alpha"], block=p["block"], path=p["path"]
    )
    blocked = row_values(q_rows / p["fold"], k, p["kind"], positions=rows, scale=p["fold"], **args)
    dense, seen = dense_values(q, k, p["kind"], p["window"], p["lengths"], p["topk"], p["alpha"])
    if rows is not None:
        dense, seen = dense[:, :, rows], seen[:, :, rows]
    seen = seen.expand_as(dense)
    torch.testing.assert_close(blocked[seen], dense[seen], atol=1e-10, rtol=0)
    weights = torch.randn(dense.shape, generator=g, dtype=torch.float64) * seen
    g_blocked = torch.autograd.grad((blocked * weights).sum(), (q, k))
    g_dense = torch.autograd.grad((dense * weights).sum(), (q, k))
    for a, b in zip(g_blocked, g_dense):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_rows_that_see_nothing_are_zero_and_finite():
    q = torch.randn(1, 2, 6, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 6, 3, dtype=torch.float64, requires_grad=True)
    key_mask = torch.tensor([[True, True, False, False, False, False]])  # rows 4, 5 see no key in a window of 2
    for kind in DENSE:
        v = row_values(q, k, kind, window=2, key_mask=key_mask, block=4)
        assert torch.isfinite(v).all() and (v[..., 4:] == 0).all()
        grads = torch.autograd.grad(v.sum(), (q, k))
        assert all(torch.isfinite(x).all() for x in grads)
        assert (grads[0][:, :, 4:] == 0).all()
    assert float(head_means(q, k, "entropy", window=1).detach().abs().max()) == 0  # no informative row at all


# --- the sampled-rows estimate --------------------------------------------------------------------------


@pytest.mark.parametrize("window, padded", [(0, False), (3, False), (None, False), (0, True)])
def test_sampled_rows_estimate_is_unbiased(window, padded):
    """The mean of many sampled estimates (value and gradient) converges to the exact head means:
    within 5 standard errors of the mean over 1500 draws (a seeded generator: the same draws on
    every machine)."""
    g = torch.Generator().manual_seed(0)
    q = (2 * torch.randn(2, 2, 10, 3, generator=g, dtype=torch.float64)).requires_grad_()
    k = torch.randn(2, 2, 10, 3, generator=g, dtype=torch.float64).requires_grad_()
    key_mask = torch.arange(10)[None, :] < torch.tensor([[10], [7]]) if padded else None
    exact = head_means(q, k, "entropy", window=window, key_mask=key_mask)
    exact_grad = torch.autograd.grad(exact.sum(), q)[0]
    draws = torch.Generator().manual_seed(1)
    values, grads = [], []
    for _ in range(1500):
        est = head_means(q, k, "entropy", window=window, key_mask=key_mask, rows=3, generator=draws)
        values.append(est.detach())
        grads.append(torch.autograd.grad(est.sum(), q)[0])
    for samples, target in ((torch.stack(values), exact.detach()), (torch.stack(grads), exact_grad)):
        mean, se = samples.mean(0), samples.std(0) / math.sqrt(len(samples))
        assert ((mean - target).abs() <= 5 * se + 1e-12).all()
    assert torch.stack(values).std(0).min() > 0  # the draws do differ
    with pytest.raises(ValueError, match="at least 1"):
        head_means(q, k, "entropy", rows=0)


def test_sampled_rows_are_deterministic_under_a_seed():
    model = small_model(torch.float32)
    tokens = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(0))

    def term(seed):
        pen = R.build_penalty(["entropy=1"], model, rows=4, seed=seed)
        cache = pen.cache()
        model(tokens, cache=cache)
        return [float(pen(model, None, cache)["entropy"]) for _ in range(3)]

    assert term(0) == term(0) and term(0) != term(1)


# --- the model: Q and K cached, fused attention kept -------------------------------------------------------

FAMILIES = {
    "learned": {},
    "rotary-gqa-window": dict(positional="rotary", n_kv_heads=2, normalization="rmsnorm", sliding_window=[0, 3]),
    "merged": dict(qk="merged"),
    "grown": dict(d_qk=[[2, 4, 3, 4], [4, 4, 4, 1]]),
    "entmax-1.5": dict(entmax_alpha=1.5),
    "sparsemax": dict(entmax_alpha=2.0, attn_bias=True),
}
SPECS = ["entropy=1", "hoyer@L1=0.5", "topk:2@L0H1,L1H3=0.3"]


def small_model(dtype=torch.float64, **config) -> Transformer:
    cfg = ModelConfig(**{**dict(n_layers=2, n_heads=4, d_model=16, d_head=4, n_ctx=12, d_vocab=16), **config})
    model = Transformer(cfg).to(dtype)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=dtype))
        if cfg.d_qk is not None:
            model.zero_qk_padding()
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_penalty_from_q_and_k_equals_the_pattern_path(family):
    """The penalty read from cached Q and K equals the same penalty read from the cached
    patterns (the path before blocking), values and every parameter's gradient."""
    model = small_model(**FAMILIES[family])
    tokens = torch.randint(0, 16, (3, 12), generator=torch.Generator().manual_seed(1))
    params = list(model.parameters())
    pen = R.build_penalty(SPECS, model, block=5)
    cache = pen.cache()
    model(tokens, cache=cache)
    assert set(cache) == set(pen.reads) == {act_name(n, l) for l in (0, 1) for n in ("q", "k")}
    blocked = pen(model, None, cache)
    patterns = Cache(act_name("pattern", l) for l in range(2))
    model(tokens, cache=patterns)
    dense = pen(model, None, patterns)
    for label in blocked:
        torch.testing.assert_close(blocked[label], dense[label], atol=1e-10, rtol=0)
        g1 = torch.autograd.grad(blocked[label], params, allow_unused=True, retain_graph=True)
        g2 = torch.autograd.grad(dense[label], params, allow_unused=True, retain_graph=True)
        for a, b in zip(g1, g2):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)
    values = pen.values(model, cache)  # unweighted, no gradient
    assert all(values[s.label] == pytest.approx(float(dense[s.label]) / s.strength, abs=1e-10) for s in pen.specs)


class CountAttention(torch.overrides.TorchFunctionMode):
    """Counts the fused attention kernel's calls (the real kernel runs)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def test_only_what_the_penalty_reads_is_cached_and_every_layer_stays_fused():
    model = small_model(torch.float32, n_layers=3)
    tokens = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(0))
    pen = R.build_penalty(["entropy@L1=1", "spectral=1"], model)
    assert pen.reads == (act_name("q", 1), act_name("k", 1))
    cache = pen.cache()
    with CountAttention() as counter:
        model(tokens, cache=cache)
    assert counter.calls == 3 and sorted(cache) == sorted(pen.reads)
    with CountAttention() as counter:  # the pattern of layer 1 asked for: that layer alone is explicit
        model(tokens, cache=Cache([act_name("pattern", 1)]))
    assert counter.calls == 2
    assert R.build_penalty(["spectral=1", "vocab_entropy=1"], model).cache() is None  # reads no activation


def test_the_trainer_caches_only_what_the_penalty_reads():
    from attn_core.tasks import get_task
    from attn_core.training.config import TrainConfig
    from attn_core.training.trainer import Trainer, init_model

    task = get_task("reverse")
    model = init_model(
        ModelConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, d_vocab=task.d_vocab, n_ctx=task.n_ctx), 0
    )
    pen = R.build_penalty(["entropy@L1=0.1"], model)
    seen = []

    def spy(model, batch, cache):
        seen.append(sorted(cache))
        return pen(model, batch, cache)

    spy.cache = pen.cache
    out = Trainer(model, task, TrainConfig(steps=2, batch_size=4, eval_every=100, device="cpu"), penalty=spy).step()
    assert seen == [sorted(pen.reads)] and math.isfinite(out["entropy@L1"]) and out["entropy@L1"] > 0


# --- devices, dtypes and the compiler ------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["learned", "rotary-gqa-window", "merged", "grown", "sparsemax"])
def test_the_penalty_runs_on_the_meta_device(family):
    """Every tensor the blocked penalty makes follows q's device: on meta (CUDA's stand-in) the
    forward, the penalty (exact and sampled) and the backward run, and gradients land on meta."""
    cfg = ModelConfig(n_layers=2, n_heads=4, d_model=16, d_head=4, n_ctx=12, d_vocab=16, **FAMILIES[family])
    with torch.device("meta"):
        model = Transformer(cfg)
    tokens = torch.zeros(2, 12, dtype=torch.long, device="meta")
    for rows in (None, 4):
        pen = R.build_penalty(SPECS, model, rows=rows)
        cache = pen.cache()
        logits = model(tokens, cache=cache)
        loss = logits.sum() + sum(pen(model, None, cache).values())
        assert loss.device.type == "meta"
        loss.backward()
        assert all(p.grad.device.type == "meta" for p in model.parameters() if p.grad is not None)
        model.zero_grad()


def test_bf16_scores_follow_q_and_reduce_in_float32():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 40, 8, generator=g), torch.randn(2, 3, 40, 8, generator=g)
    exact = row_values(q, k, "entropy", block=16)
    qb, kb = q.bfloat16().requires_grad_(), k.bfloat16().requires_grad_()
    low = row_values(qb, kb, "entropy", block=16)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, exact, atol=2e-2, rtol=0)  # bf16 scores: about 3 significant digits
    low.sum().backward()
    assert qb.grad.dtype == kb.grad.dtype == torch.bfloat16


def test_block_rows():
    q = torch.empty(4, 8, 512, 32, device="meta")
    assert block_rows(q, 512) == 32 and block_rows(q, 512, 7) == 7
    assert block_rows(torch.empty(64, 64, 4096, 8, device="meta"), 4096) == 16
    with pytest.raises(ValueError, match="at least 1"):
        block_rows(q, 512, 0)
    with pytest.raises(ValueError, match="whole number"):
        R.build_penalty(["entropy=1"], small_model(), rows=2.5)


def test_compiled_penalty_equals_eager_without_graph_breaks():
    """forward + cache + blocked penalty + loss compile as one graph (fullgraph=True: a graph
    break would raise); values and gradients equal eager's to 1e-5 in float32."""
    model = small_model(torch.float32, n_layers=1, **{**FAMILIES["rotary-gqa-window"], "sliding_window": [3]})
    tokens = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(0))
    pen = R.build_penalty(["entropy=1", "topk:2@L0H1=0.5"], model, block=6)

    def loss_fn(tokens):
        cache = pen.cache()
        logits = model(tokens, cache=cache)
        return F.cross_entropy(logits.flatten(0, 1), tokens.flatten()) + sum(pen(model, None, cache).values())

    def run(fn):
        model.zero_grad()
        loss = fn(tokens)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    torch._dynamo.reset()
    eager, compiled = run(loss_fn), run(torch.compile(loss_fn, backend="aot_eager", fullgraph=True))
    torch.testing.assert_close(compiled[0], eager[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(compiled[1], eager[1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_inductor_compiled_rows_equal_eager():
    """The blocked rows through inductor's generated kernels: values and gradients to 1e-5."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 24, 8, generator=g).requires_grad_()
    k = torch.randn(2, 3, 24, 8, generator=g).requires_grad_()

    def f(q, k):
        return head_means(q, k, "entropy", window=0, block=12)

    torch._dynamo.reset()
    eager, compiled = f(q, k), torch.compile(f, fullgraph=True)(q, k)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(compiled.sum(), (q, k)), torch.autograd.grad(eager.sum(), (q, k))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", ["blocked", "flash"])
def test_compiled_rows_keep_no_scores_for_backward(path):
    """Compiled, the backward still forms each block's scores again: what the forward keeps for
    it is Q, K and a few numbers per row, as in eager (a compiler's partitioner would otherwise
    move the recomputed scores into the forward and keep every block of them). The fused path
    keeps Q, K, the pass's output P K and its lse."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 64, 8, generator=g).requires_grad_()
    k = torch.randn(2, 2, 64, 8, generator=g).requires_grad_()

    def f(q, k):
        return head_means(q, k, "entropy", window=0, block=16, path=path)

    def kept(fn) -> int:
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            fn(q, k).sum().backward()
        return sum(sizes)

    torch._dynamo.reset()
    eager = kept(f)
    tensors = 2 if path == "blocked" else 3  # Q, K (and P K)
    assert eager < tensors * q.numel() + 64 * 2 * 2 * 8  # and a few numbers per row: no 64 x 64 block
    compiled = kept(torch.compile(f, backend="aot_eager", fullgraph=True))
    assert compiled == eager if path == "blocked" else compiled <= eager  # the graph may keep fewer row numbers
