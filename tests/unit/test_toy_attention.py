"""The attention algebra of one head: the limits of copy and average, the random-key cases, and the
figures built on them."""

import io
import json
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attn_core.figures import bundle_zip, export_bytes, toy
from attn_core.toy_attention import (
    MAX_KEY_ELEMENTS,
    attention,
    average_limit,
    average_query,
    copy_limit,
    copy_query,
    experiment,
    head_queries,
    key_scales,
    orthonormal_means,
    orthonormality_error,
    predicted_alpha_a,
    sample_keys,
    two_head_limit,
)

BETAS = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0]
MU = orthonormal_means(4, 8)


def _iqr(x):
    q25, q75 = np.quantile(x, [0.25, 0.75])
    return q75 - q25


# --- (a) weights are a distribution --------------------------------------------------------

finite = st.floats(-50, 50, allow_nan=False)


@given(q=arrays(np.float64, 5, elements=finite), K=arrays(np.float64, (7, 5), elements=finite))
@settings(max_examples=60, deadline=None)
def test_weights_are_a_distribution(q, K):
    V = np.arange(14.0).reshape(7, 2)
    alpha, c = attention(q, K, V)
    assert np.all(alpha >= 0) and np.all(alpha <= 1)
    assert alpha.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(c, alpha @ V)


def test_attention_broadcasts_and_survives_huge_scores():
    K = np.random.default_rng(0).standard_normal((3, 6, 4))  # [S, n, d]
    q = np.random.default_rng(1).standard_normal((2, 4))  # [h, d]
    alpha, c = attention(q, K[:, None], np.eye(6))
    assert alpha.shape == (3, 2, 6) and c.shape == (3, 2, 6)
    np.testing.assert_allclose(alpha[1, 0], attention(q[0], K[1], np.eye(6))[0])
    alpha, _ = attention(1e6 * MU[0], MU, MU)
    np.testing.assert_array_equal(alpha, [1, 0, 0, 0])


# --- (a), (b): copy and average reach the seed's limits as beta grows ----------------------


def test_copy_reaches_its_limit():
    weights, dists = [], []
    for beta in BETAS:
        e = experiment(MU, case="copy", a=2, beta=beta, n_samples=3)
        assert e.alpha_a[0] == pytest.approx(copy_limit(4, beta), rel=1e-12)
        weights.append(e.alpha_a[0])
        dists.append(e.dist_a[0])
    assert np.all(np.diff(weights) > 0) and np.all(np.diff(dists) < 0)
    assert weights[-1] == pytest.approx(1.0, abs=1e-15)
    assert dists[-1] < 1e-15
    np.testing.assert_allclose(copy_query(MU, 2, 3.0), 3.0 * MU[2])


def test_average_reaches_its_limit():
    weights, dists = [], []
    for beta in BETAS:
        e = experiment(MU, case="average", a=0, b=3, beta=beta, n_samples=3)
        assert e.alpha_a[0] == pytest.approx(average_limit(4, beta), rel=1e-12)
        assert e.alpha_b[0] == pytest.approx(e.alpha_a[0], rel=1e-12)
        weights.append(e.alpha_a[0])
        dists.append(e.dist_average[0])
    assert np.all(np.diff(weights) > 0) and np.all(np.diff(dists) < 0)
    assert weights[-1] == pytest.approx(0.5, abs=1e-15)
    assert dists[-1] < 1e-15
    np.testing.assert_allclose(e.outputs[0], (MU[0] + MU[3]) / 2, atol=1e-15)
    np.testing.assert_allclose(average_query(MU, 0, 3, 2.0), 2.0 * (MU[0] + MU[3]))


def test_two_heads_reach_the_average_with_fixed_keys():
    for beta in BETAS:
        e = experiment(MU, a=1, b=2, n_heads=2, beta=beta, n_samples=2)
        assert e.alpha_a[0] == pytest.approx(two_head_limit(4, beta), rel=1e-12)
        assert e.alpha_b[0] == pytest.approx(two_head_limit(4, beta), rel=1e-12)
    assert e.dist_average[0] < 1e-15


def test_limits_hold_for_any_orthonormal_means():
    """The algebra only sees mu_i^T mu_j, so a random orthonormal set gives the same weights."""
    rotated = orthonormal_means(4, 8, seed=5)
    assert orthonormality_error(rotated) < 1e-12
    for case in ("copy", "average"):
        base = experiment(MU, case=case, beta=7.0, big_var=0.5, n_samples=200, seed=2)
        rot = experiment(rotated, case=case, beta=7.0, big_var=0.5, n_samples=200, seed=2)
        np.testing.assert_allclose(rot.weights, base.weights, atol=1e-12)


# --- (c) i: small isotropic noise keeps the average ----------------------------------------


def test_small_key_variance_keeps_the_average():
    e = experiment(MU, alpha=1e-6, beta=20.0, n_samples=2000, seed=1)
    assert np.abs(e.alpha_a - 0.5).max() < 0.1
    assert _iqr(e.alpha_a) < 0.03
    assert np.median(e.dist_average) < 0.02


def test_isotropic_noise_spreads_alpha_a_once_beta_sqrt_alpha_is_not_small():
    """The score gap k_a^T q - k_b^T q has std 2 beta sqrt(alpha): the seed's 'alpha small'."""
    spreads = [_iqr(experiment(MU, alpha=alpha, beta=10.0, n_samples=2000).alpha_a) for alpha in (1e-6, 1e-4, 1e-2)]
    assert spreads[0] < spreads[1] < spreads[2]
    assert spreads[2] > 0.3


# --- (c) ii and (d): one large-variance key; two heads --------------------------------------


@pytest.fixture(scope="module")
def big_var_pair():
    kw = dict(alpha=1e-6, beta=20.0, big_var=0.5, n_samples=4000, seed=3)
    return experiment(MU, n_heads=1, **kw), experiment(MU, n_heads=2, **kw)


def test_large_variance_key_makes_one_head_swing(big_var_pair):
    one, _ = big_var_pair
    # c sits near v_a or near v_b, rarely near the average: alpha_a ~ sigma((gamma - 1) beta).
    assert _iqr(one.alpha_a) > 0.9
    assert one.alpha_a.std() > 0.4
    assert np.mean(np.abs(one.alpha_a - 0.5) <= 0.1) < 0.05
    near_a, near_b = np.mean(one.dist_a < 0.1), np.mean(one.dist_b < 0.1)
    assert near_a > 0.35 and near_b > 0.35
    # The side is decided by gamma, the key's scale along mu_a.
    assert np.all(one.alpha_a[one.gamma > 1.2] > 0.9)
    assert np.all(one.alpha_a[one.gamma < 0.8] < 0.1)


def test_two_heads_remove_the_spread(big_var_pair):
    one, two = big_var_pair
    np.testing.assert_array_equal(one.keys, two.keys)  # same draws, sample by sample
    np.testing.assert_allclose(two.queries, [20.0 * MU[0], 20.0 * MU[1]])
    np.testing.assert_allclose(two.outputs, two.head_outputs.mean(axis=1))
    assert _iqr(two.alpha_a) < 0.01
    assert np.mean(np.abs(two.alpha_a - 0.5) <= 0.1) > 0.85
    assert np.median(two.dist_average) < 1e-3
    # What is left is the seed's caveat: head 1 needs gamma beta >> log(n - 1), so the tail
    # gamma <~ 0 still fails; its share is what the alpha -> 0 prediction says it is.
    predicted = np.mean(np.abs(predicted_alpha_a(two, two.gamma) - 0.5) <= 0.1)
    assert np.mean(np.abs(two.alpha_a - 0.5) <= 0.1) == pytest.approx(predicted, abs=0.01)
    assert np.all(two.alpha_a[two.gamma > 0.5] > 0.45)


def test_prediction_is_exact_without_isotropic_noise():
    n, beta = 4, 3.0
    for heads in (1, 2):
        e = experiment(MU, alpha=0.0, beta=beta, big_var=0.5, n_heads=heads, n_samples=500)
        np.testing.assert_allclose(predicted_alpha_a(e, e.gamma), e.alpha_a, rtol=1e-12)
    g = np.linspace(-1, 3, 9)
    one = experiment(MU, beta=beta, n_heads=1, n_samples=1)
    np.testing.assert_allclose(predicted_alpha_a(one, g), np.exp(g * beta) / (np.exp(g * beta) + np.exp(beta) + n - 2))
    two = experiment(MU, beta=beta, n_heads=2, n_samples=1)
    np.testing.assert_allclose(
        predicted_alpha_a(two, g), (np.exp(g * beta) / (np.exp(g * beta) + n - 1) + 1 / (np.exp(beta) + n - 1)) / 2
    )


def test_big_variance_on_an_unrelated_key_changes_nothing():
    base = experiment(MU, alpha=0.0, beta=10.0, n_samples=100)
    other = experiment(MU, alpha=0.0, beta=10.0, big_var_index=3, big_var=4.0, n_samples=100)
    np.testing.assert_allclose(other.weights, base.weights, atol=1e-15)
    assert other.gamma.std() > 1.0


# --- sampling ----------------------------------------------------------------------------


def test_sample_keys_is_seeded_and_has_the_stated_covariance():
    mu = orthonormal_means(3, 5, seed=0)
    alpha, s = 0.04, 0.7
    k = sample_keys(mu, alpha, 1, s, n_samples=40_000, seed=11)
    np.testing.assert_array_equal(k, sample_keys(mu, alpha, 1, s, n_samples=40_000, seed=11))
    assert not np.array_equal(k, sample_keys(mu, alpha, 1, s, n_samples=40_000, seed=12))
    np.testing.assert_allclose(k.mean(axis=0), mu, atol=0.02)
    np.testing.assert_allclose(np.cov(k[:, 1].T), alpha * np.eye(5) + s * np.outer(mu[1], mu[1]), atol=0.03)
    np.testing.assert_allclose(np.cov(k[:, 0].T), alpha * np.eye(5), atol=0.01)
    gamma = key_scales(k, mu, 1)
    assert gamma.mean() == pytest.approx(1.0, abs=0.02) and gamma.var() == pytest.approx(s + alpha, rel=0.05)


def test_isotropic_noise_does_not_depend_on_big_var():
    a = sample_keys(MU, 0.1, 0, 0.0, n_samples=20, seed=4)
    b = sample_keys(MU, 0.1, 0, 2.0, n_samples=20, seed=4)
    np.testing.assert_array_equal(a[:, 1:], b[:, 1:])


def test_orthonormal_means():
    np.testing.assert_array_equal(orthonormal_means(3, 5), np.eye(3, 5))
    r = orthonormal_means(3, 5, seed=9)
    np.testing.assert_allclose(r @ r.T, np.eye(3), atol=1e-12)
    np.testing.assert_array_equal(r, orthonormal_means(3, 5, seed=9))
    assert orthonormality_error(np.array([[1.0, 0], [1, 1]])) == pytest.approx(1.0)


def test_custom_values_and_non_orthonormal_means_run():
    mu = np.array([[1.0, 0.2], [0.0, 1.0], [0.5, 0.5]])
    V = np.array([[2.0, 0, 0], [0, 3, 0], [0, 0, 1]])
    e = experiment(mu, V, beta=30.0, n_samples=5)
    np.testing.assert_allclose(e.outputs, e.weights @ V)
    np.testing.assert_allclose(e.plane_coordinates(), e.weights[:, :2], atol=1e-12)


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: orthonormal_means(1, 4), "n .* >= 2"),
        (lambda: orthonormal_means("3", 4), "n .* integer"),
        (lambda: orthonormal_means(5, 3), "d >= n"),
        (lambda: experiment(MU[:1]), "at least n = 2"),
        (lambda: experiment(np.zeros((3, 3))), "non-zero"),
        (lambda: experiment([[1, np.nan], [0, 1]]), "NaN"),
        (lambda: experiment(MU, alpha=-0.1), "alpha .* >= 0"),
        (lambda: experiment(MU, big_var=-1.0), "big_var .* >= 0"),
        (lambda: experiment(MU, beta=float("inf")), "beta must be finite"),
        (lambda: experiment(MU, beta="big"), "beta must be a number"),
        (lambda: experiment(MU, a=1, b=1), "different"),
        (lambda: experiment(MU, a=4), r"a \(a key index\) must be an integer in 0..3"),
        (lambda: experiment(MU, b="x"), "b .* integer"),
        (lambda: experiment(MU, big_var_index=-1), "big_var_index"),
        (lambda: experiment(MU, n_heads=3), "head count"),
        (lambda: experiment(MU, case="copy", n_heads=2), "copy case has one head"),
        (lambda: experiment(MU, case="blend"), "case must be one of"),
        (lambda: experiment(MU, n_samples=0), "number of samples"),
        (lambda: experiment(MU, n_samples=2.5), "number of samples"),
        (lambda: experiment(MU, seed=-1), "seed"),
        (lambda: experiment(MU, np.eye(3)), "one row per key"),
        (lambda: sample_keys(np.eye(400), n_samples=MAX_KEY_ELEMENTS // 160_000 + 1), "too large"),
        (lambda: head_queries(MU, "average", 2, 2, 1.0, 2), "different"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --- figures --------------------------------------------------------------------------------


def test_figures_show_the_experiments(big_var_pair):
    one, two = big_var_pair
    plots = [
        toy.weights_plot(two),
        toy.output_plot(one),
        toy.alpha_histogram([one, two]),
        toy.head_comparison_plot([one, two]),
    ]
    assert [p.name for p in plots] == ["toy_weights", "toy_output", "toy_alpha_a_hist", "toy_heads"]
    weights = plots[0].data
    assert len(weights) == 2 * 4 and set(weights["head"]) == {1, 2}
    head1_a = weights[(weights["head"] == 1) & (weights["key"] == 0)]
    assert head1_a["median"].item() > 0.99  # q_1 = beta mu_a copies v_a
    out = plots[1].data
    assert len(out) == one.settings["n_samples"]  # the CSV keeps every sample
    assert len(plots[1].fig.data[0].x) == toy.MAX_POINTS  # the figure draws a subset
    hist = plots[2].data
    np.testing.assert_allclose(hist[["share 1 head", "share 2 heads"]].sum(), 1.0)
    centre = hist[(hist.bin_left < 0.5) & (hist.bin_right > 0.5)]
    assert centre["share 2 heads"].item() > 0.8 and centre["share 1 head"].item() < 0.05
    assert set(plots[3].data["heads"]) == {1, 2}
    assert toy.summary_table([one, two]).shape[0] == 2
    for p in plots:
        assert export_bytes(p, "csv").startswith(p.data.columns[0].encode())
        assert b"plotly" in export_bytes(p, "html")[:200_000].lower()


def test_figures_bundle_with_a_manifest(big_var_pair):
    one, two = big_var_pair
    blob = bundle_zip(
        [toy.alpha_histogram([one, two]), toy.weights_plot(one)],
        {"page": "Attention explorer", "settings": one.settings},
        formats=("csv",),
    )
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        assert set(zf.namelist()) == {"toy_alpha_a_hist.csv", "toy_weights.csv", "manifest.json"}
        manifest = json.loads(zf.read("manifest.json"))
    assert manifest["settings"]["big_var"] == 0.5 and manifest["skipped"] == []


def test_copy_case_figures():
    e = experiment(MU, case="copy", a=1, b=0, beta=12.0, alpha=1e-3, n_samples=300)
    assert "k1 (a)" in set(toy.weights_plot(e).data["key_name"])
    xy = toy.output_plot(e).data[["x", "y"]].median()
    assert xy["x"] == pytest.approx(1.0, abs=0.05) and xy["y"] == pytest.approx(0.0, abs=0.05)
