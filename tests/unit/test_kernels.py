"""Kernelized attention: estimators, exactness limits, causality, FFT Toeplitz,
the model hook, figures and the benchmark's shape."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import kernels as K
from attn_core.figures import export_bytes
from attn_core.figures.kernels import error_curves, pattern_comparison, speed_chart
from attn_core.hooks import act_name
from attn_core.model import ModelConfig, Transformer
from attn_core.tasks import TASKS
from benchmarks import kernel_methods as bench

f64 = torch.float64


def qkv(n=32, d=8, scale=0.35, batch=(2,), seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*batch, n, d, generator=g, dtype=f64) * s for s in (scale, scale, 1.0))


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("method", ["favor", "maclaurin"])
def test_random_features_are_unbiased_for_exp_dot(method):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 6, generator=g, dtype=f64) * 0.5
    k = torch.randn(4, 6, generator=g, dtype=f64) * 0.5
    seeds = 800
    est = torch.stack([K.kernel_estimate(q, k, method, 8, s) for s in range(seeds)])
    mean, se = est.mean(0), est.std(0) / math.sqrt(seeds)
    # 12 entries at |z| < 4.5: a false alarm has probability ~1e-4.
    z = (mean - torch.exp(q @ k.T)) / se
    assert z.abs().max() < 4.5, z


@pytest.mark.parametrize("method", ["favor", "maclaurin"])
def test_error_decreases_with_features(method):
    q, k, v = qkv(n=48, scale=0.3)
    exact = K.exact_attention(q, k, v)
    err = {m: sum(rel(K.approx_attention(q, k, v, method, m, s), exact) for s in range(6)) / 6 for m in (8, 512)}
    assert err[512] < err[8] / 3, err


def test_orthogonal_features_are_orthogonal_within_a_block():
    W = K.orthogonal_gaussian(20, 8, seed=3, dtype=f64)
    block = W[:8] / W[:8].norm(dim=1, keepdim=True)
    assert torch.allclose(block @ block.T, torch.eye(8, dtype=f64), atol=1e-12)
    assert W.shape == (20, 8)


def test_nystrom_is_exact_with_every_point_as_landmark():
    q, k, v = qkv(n=20, scale=0.5)
    for causal in (False, True):
        exact = K.exact_pattern(q, k, causal)
        p = K.approx_pattern(q, k, "nystrom", 2 * 20, seed=0, causal=causal)
        assert torch.allclose(p, exact, atol=1e-9)
        p = K.approx_pattern(q, k, "nystromformer", 20, causal=causal)
        assert torch.allclose(p, exact, atol=1e-9)
    assert torch.allclose(K.approx_attention(q, k, v, "nystrom", 40), K.exact_attention(q, k, v), atol=1e-9)


def test_newton_pinv_converges_and_segment_means():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 12, 12, generator=g, dtype=f64) + 6 * torch.eye(12, dtype=f64)
    assert torch.allclose(K.newton_pinv(a, iters=12), torch.linalg.pinv(a), atol=1e-10)
    x = torch.arange(10, dtype=f64).reshape(5, 2)
    assert torch.equal(K.segment_means(x, 2), torch.tensor([[2.0, 3.0], [7.0, 8.0]], dtype=f64))


def test_nystrom_newton_matches_exact_with_enough_iterations():
    q, k, v = qkv(n=16, scale=0.4)
    a = K.approx_attention(q, k, v, "nystrom", 12, seed=2, pinv="newton", iters=40)
    b = K.approx_attention(q, k, v, "nystrom", 12, seed=2, pinv="exact")
    assert rel(a, b) < 1e-6


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), data=st.data())
def test_fft_toeplitz_equals_dense(n, data):
    b = torch.tensor(data.draw(st.lists(st.floats(-6, 6), min_size=2 * n - 1, max_size=2 * n - 1)), dtype=f64)
    x = torch.randn(2, n, 3, generator=torch.Generator().manual_seed(n), dtype=f64)
    t = torch.exp(b)
    assert torch.allclose(K.toeplitz_matmul(t, x), K.toeplitz_dense(t) @ x, atol=1e-10 * t.max().item())


def test_fft_toeplitz_float32_and_batched_diagonals():
    n = 300
    t = torch.rand(3, 2 * n - 1)
    x = torch.randn(3, n, 4)
    dense = K.toeplitz_dense(t) @ x
    assert torch.allclose(K.toeplitz_matmul(t, x), dense, atol=1e-4 * dense.abs().max().item())


@pytest.mark.parametrize("causal", [False, True])
def test_rpe_attention_matches_dense_kernel_with_bias(causal):
    q, k, v = qkv(n=24, scale=0.3)
    b = torch.randn(2 * 24 - 1, generator=torch.Generator().manual_seed(5), dtype=f64)
    phi_q, phi_k = K.factors(q, k, "favor", 16, seed=1)
    kernel = (phi_q @ phi_k.transpose(-1, -2)) * torch.exp(K.toeplitz_dense(b))
    if causal:
        kernel = kernel.tril()
    dense = (kernel / kernel.sum(-1, keepdim=True)) @ v
    assert torch.allclose(K.rpe_linear_attention(phi_q, phi_k, v, b, causal), dense, atol=1e-10)
    # with every landmark Nystrom's kernel is exact, so the FFT path gives exact RPE attention
    exact = K.exact_rpe_attention(q, k, v, b, causal)
    assert torch.allclose(K.rpe_attention(q, k, v, b, "nystrom", 48, causal=causal), exact, atol=1e-8)


@pytest.mark.parametrize("method", K.CAUSAL_METHODS)
def test_causal_forms_never_look_ahead(method):
    q, k, v = qkv(n=150, scale=0.4)  # more than two chunks of 64
    t = 90
    k2, v2 = k.clone(), v.clone()
    k2[..., t + 1 :, :] = 3 * torch.randn(
        k2[..., t + 1 :, :].shape, generator=torch.Generator().manual_seed(9), dtype=f64
    )
    v2[..., t + 1 :, :] = 100.0
    a = K.approx_attention(q, k, v, method, 32, seed=4, causal=True)
    b = K.approx_attention(q, k2, v2, method, 32, seed=4, causal=True)
    # FAVOR+'s key stabilizer is a max over all keys, a constant that cancels up to rounding
    assert torch.allclose(a[..., : t + 1, :], b[..., : t + 1, :], rtol=1e-9, atol=1e-12)
    if method != "favor":
        assert torch.equal(a[..., : t + 1, :], b[..., : t + 1, :])
    assert not torch.allclose(a[..., t + 1 :, :], b[..., t + 1 :, :])
    # The FFT mixes every position at rounding level (eps x the largest entry), so the RPE form is
    # checked with a future of the same scale as the past.
    k3, v3 = k.clone(), v.clone()
    k3[..., t + 1 :, :], v3[..., t + 1 :, :] = k.flip(-2)[..., t + 1 :, :], v.flip(-2)[..., t + 1 :, :]
    b = torch.randn(2 * 150 - 1, generator=torch.Generator().manual_seed(0), dtype=f64)
    r1 = K.rpe_attention(q, k, v, b, method, 32, seed=4, causal=True)
    r2 = K.rpe_attention(q, k3, v3, b, method, 32, seed=4, causal=True)
    assert torch.allclose(r1[..., : t + 1, :], r2[..., : t + 1, :], atol=1e-10)
    assert not torch.allclose(r1[..., t + 1 :, :], r2[..., t + 1 :, :])


@pytest.mark.parametrize("method", K.METHODS)
def test_causal_linear_form_equals_masked_pattern(method):
    q, k, v = qkv(n=70, scale=0.3)
    out = K.approx_attention(q, k, v, method, 16, seed=1, causal=True)
    p = K.approx_pattern(q, k, method, 16, seed=1, causal=True)
    assert torch.allclose(out, p @ v, atol=1e-8)
    assert torch.allclose(p.sum(-1), torch.ones(2, 70, dtype=f64))
    assert torch.all(p.triu(1) == 0)


@pytest.mark.parametrize("method", K.METHODS)
def test_deterministic_under_seed_and_batched_over_heads(method):
    q, k, v = qkv(n=20, batch=(2, 3))
    a = K.approx_attention(q, k, v, method, 8, seed=7)
    assert a.shape == (2, 3, 20, 8)
    assert torch.equal(a, K.approx_attention(q, k, v, method, 8, seed=7))
    if method != "nystromformer":  # segment means: no randomness
        assert not torch.allclose(a, K.approx_attention(q, k, v, method, 8, seed=8))
    # each head is computed on its own
    assert torch.allclose(a[1, 2], K.approx_attention(q[1, 2], k[1, 2], v[1, 2], method, 8, seed=7), atol=1e-10)


def test_unknown_method_and_options_are_refused():
    q, k, v = qkv(n=8)
    with pytest.raises(ValueError, match="unknown method"):
        K.approx_attention(q, k, v, "linformer", 8)
    with pytest.raises(ValueError, match="only apply"):
        K.approx_attention(q, k, v, "favor", 8, gamma=2.0)
    with pytest.raises(ValueError, match="its options are pinv, iters, ridge"):
        K.approx_attention(q, k, v, "nystrom", 8, orthogonal=False)
    with pytest.raises(ValueError, match=r"features must be an integer in 1\.\.65536, got 0"):
        K.approx_attention(q, k, v, "favor", 0)
    with pytest.raises(ValueError, match="features must be at most 65,536"):  # a limit, before any work
        K.approx_attention(q, k, v, "favor", 10**7)
    with pytest.raises(ValueError, match="same shape"):
        K.approx_attention(q, k[..., :3], v, "favor", 8)
    with pytest.raises(ValueError, match="at least 2"):
        K.approx_attention(q, k, v, "maclaurin", 1)


def test_schoenbat_prenorm_and_postscale():
    q, k, v = qkv(n=12, d=16)
    x = K.schoenbat_prenorm(q)
    assert torch.allclose(x.norm(dim=-1), torch.full(x.shape[:-1], 16**-0.25, dtype=f64))
    out = torch.tensor([-8.0, 0.0, 4.0], dtype=f64)
    assert torch.allclose(K.schoenbat_postscale(out, 2.0, 0.5), torch.tensor([-2 * 8**0.5, 0.0, 4.0], dtype=f64))
    a = K.approx_attention(q, k, v, "schoenbat", 16, gamma=3.0)
    assert torch.allclose(a, 3.0 * K.approx_attention(q, k, v, "schoenbat", 16))


# Not conftest's make_tiny_model: the default init with its Q/K weights scaled up 40x (W_QK 400x).
def _model(**overrides):
    cfg = ModelConfig(
        **{"n_layers": 2, "n_heads": 2, "d_model": 32, "d_head": 8, "n_ctx": 24, "d_vocab": 26, **overrides}
    )
    torch.manual_seed(0)
    model = Transformer(cfg)
    with torch.no_grad():  # sharpen the random init so patterns are far from uniform
        for block in model.blocks:
            for name in ("W_Q", "W_K", "W_QK"):
                if hasattr(block.attn, name):
                    getattr(block.attn, name).mul_(40 if name != "W_QK" else 400)
    return model.eval()


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"attn_bias": True},
        {"qk": "merged"},
        {"d_qk": [[8, 4], [3, 8]]},
        {"normalization": "none"},
    ],
)
def test_head_qkv_reproduces_the_models_pattern(overrides):
    model = _model(**overrides)
    if model.cfg.attn_bias:
        with torch.no_grad():
            for block in model.blocks:
                for name in ("b_Q", "b_K", "b_V"):
                    getattr(block.attn, name).normal_(0, 0.5)
    tokens = TASKS["induction"].sample(3, seed=0).tokens
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        for head in range(2):
            q, k, v = K.head_qkv(model, tokens, layer, head)
            pattern = cache[act_name("pattern", layer)][:, head]
            assert torch.allclose(K.exact_pattern(q, k, causal=True), pattern, atol=1e-6)
            assert pattern.max() > 0.5  # not a trivial, uniform pattern
            assert v.shape == (3, 24, 8)


def test_error_curve_summary_and_head_error():
    model = _model()
    tokens = TASKS["induction"].sample(2, seed=1).tokens
    q, k, v = K.head_qkv(model, tokens, 1, 0)
    df = K.error_curve(q, k, v, methods=("favor", "nystrom"), features=(8, 64), seeds=range(3))
    assert list(df.columns) == ["method", "features", "seed", "rel_error", "tv", "kl"]
    assert len(df) == 2 * 2 * 3 and df[["rel_error", "tv", "kl"]].notna().all().all()
    summary = K.error_summary(df)
    assert {"rel_error_mean", "rel_error_std", "tv_mean", "kl_mean", "n_seeds"} <= set(summary.columns)
    assert len(summary) == 4 and (summary["n_seeds"] == 3).all()
    assert (summary["tv_mean"] >= 0).all() and (summary["kl_mean"] >= 0).all()
    exact, approx = K.head_patterns(model, tokens, 1, 0, "nystromformer", 64)
    assert exact.shape == approx.shape == (2, 24, 24)
    assert torch.allclose(exact, K.exact_pattern(q.double(), k.double(), causal=True))
    assert torch.allclose(approx.sum(-1), torch.ones(2, 24, dtype=f64))
    out = K.head_error(model, tokens, 1, 0, "favor", 16, seeds=2)
    json.dumps(out)
    assert out["method"] == "favor" and out["features"] == 16 and out["rel_error_mean"] > 0
    assert out["stable_rank"] >= 1 and out["spectral_norm"] > 0


def test_balancing_keeps_the_pattern():
    q, k, _ = qkv(n=10, scale=0.2)
    qb, kb = K.balance_qk(q, 10 * k)
    assert torch.allclose(K.exact_pattern(qb, kb), K.exact_pattern(q, 10 * k))
    assert torch.allclose((qb * qb).sum(-1).mean(-1), (kb * kb).sum(-1).mean(-1))


def test_head_spectrum_matches_dense_B():
    model = _model()
    attn = model.blocks[0].attn
    B = attn.W_Q[1].double() @ attn.W_K[1].double().T / math.sqrt(8)
    s = torch.linalg.svdvals(B)
    spec = K.head_spectrum(model, 0, 1)
    assert spec["spectral_norm"] == pytest.approx(s[0].item())
    assert spec["stable_rank"] == pytest.approx((s**2).sum().item() / s[0].item() ** 2)


def test_figures_build_and_export():
    q, k, v = qkv(n=16)
    df = K.error_curve(q, k, v, methods=("favor", "maclaurin"), features=(8, 32), seeds=range(2), causal=False)
    plots = [
        error_curves(df),
        error_curves(df, "tv"),
        pattern_comparison(
            K.exact_pattern(q, k)[0], K.approx_pattern(q, k, "favor", 8)[0], labels=list("abcdefghijklmnop")
        ),
    ]
    result = {
        "config": {"heads": 1, "d_head": 8, "features": 8, "causal": False},
        "rows": [
            {"n": n, "method": m, "ms": ms, "peak_mb": 1.0, "ratio": r, "rel_error": 0.1}
            for n, m, ms, r in [
                (256, "sdpa", 1.0, 1.0),
                (256, "favor", 2.0, 0.5),
                (512, "sdpa", 4.0, 1.0),
                (512, "favor", 2.0, 2.0),
            ]
        ],
        "crossover": {"favor": 512},
    }
    plots.append(speed_chart(result))
    for plot in plots:
        assert b"<html" in export_bytes(plot, "html")[:500].lower()
        assert export_bytes(plot, "csv").count(b"\n") == len(plot.data) + 1
    assert len(plots[2].data) == 16 * 16


def test_crossover_needs_every_longer_length_to_win():
    rows = [
        {"n": n, "method": m, "ms": ms}
        for n, m, ms in [
            (1, "sdpa", 1),
            (1, "x", 0.5),
            (2, "sdpa", 2),
            (2, "x", 3),
            (4, "sdpa", 4),
            (4, "x", 3),
            (8, "sdpa", 9),
            (8, "x", 4),
        ]
    ]
    assert bench.crossover(rows, "x") == 4
    assert bench.crossover([r for r in rows if r["n"] < 4], "x") is None


def test_benchmark_rows_ratios_and_memory_subprocess():
    threads = torch.get_num_threads()
    result = bench.run(
        min_n=64,
        max_n=128,
        repeats=2,
        methods=("favor", "nystrom"),
        d_head=16,
        heads=1,
        features=16,
        memory=False,
        threads=1,
    )
    assert result["config"]["torch_threads"] == 1 and torch.get_num_threads() == threads
    assert [(r["n"], r["method"]) for r in result["rows"]] == [
        (64, "sdpa"),
        (64, "favor"),
        (64, "nystrom"),
        (128, "sdpa"),
        (128, "favor"),
        (128, "nystrom"),
    ]
    for r in result["rows"]:
        assert r["ms"] > 0 and r["ratio"] > 0 and r["peak_mb"] is None
        assert r["rel_error"] == 0.0 if r["method"] == "sdpa" else 0 < r["rel_error"] < 10
    assert set(result["crossover"]) == {"favor", "nystrom"} and set(result["speedup_at_max_n"]) == {"favor", "nystrom"}
    acc = {(r["score_std"], r["method"]): r["rel_error"] for r in result["accuracy"]["rows"]}
    assert result["accuracy"]["n"] == 128 and len(acc) == 6
    assert acc[(0.25, "favor")] < acc[(1.0, "favor")]  # smaller scores, smaller FAVOR+ variance
    json.dumps(result)
    # one fresh interpreter measures the rise of resident memory over a call
    config = {
        "n": 2048,
        "method": "sdpa",
        "heads": 1,
        "d_head": 16,
        "features": 8,
        "causal": False,
        "seed": 0,
        "threads": 1,
    }
    peak = bench._peak_memory(config, timeout=120)
    assert peak is None or peak >= 0.1  # the [2048, 16] float32 output alone is 0.125 MB


def test_a_kernel_method_has_one_colour_in_every_figure():
    """favor's line is one colour in the error curves and in the speed chart, whose exact sdpa
    line (grey) comes first and must not move the methods' colours."""
    q, k, v = qkv(n=16)
    df = K.error_curve(q, k, v, methods=("favor", "maclaurin"), features=(8,), seeds=range(1), causal=False)
    rows = [
        {"n": n, "method": m, "ms": 1.0, "peak_mb": 1.0, "ratio": 1.0, "rel_error": 0.1}
        for n in (256, 512)
        for m in ("sdpa", "favor", "maclaurin")
    ]
    curves = {t.name: t.line.color for t in error_curves(df).fig.data if t.name in K.METHODS}
    speed = {t.name: t.line.color for t in speed_chart({"config": {}, "rows": rows}).fig.data}
    assert curves == {m: speed[m] for m in ("favor", "maclaurin")} and curves["favor"] != curves["maclaurin"]
    assert speed["sdpa"] == "grey"
