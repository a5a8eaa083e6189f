"""The two ranks of a head (attn_core.bilinear.ranks) against dense SVDs written here: B formed
densely, and the centred score matrix formed from the layer's input X and B' (or, with rotary
positions, from B(delta) of every pair's offset, ``layer_form(..., offset)``), with numpy's SVD."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core.bilinear import head_B, layer_form
from attn_core.bilinear.heads import augment, has_bias
from attn_core.bilinear.ranks import Ranks, cumulative_variance, gap, ranks, stable_rank, variance_rank
from attn_core.hooks import act_name
from attn_core.sources import resolve
from tests.conftest import make_tiny_model, write_tiny_hf


def dense_variance_rank(s: np.ndarray, frac: float) -> int:
    e = s.astype(np.float64) ** 2
    if e.sum() == 0:
        return 0
    share = np.cumsum(e) / e.sum()
    return int(np.argmax(share >= frac - 1e-9) + 1)


@settings(max_examples=40, deadline=None)
@given(
    s=st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=12),
    frac=st.sampled_from([0.5, 0.9, 0.99, 1.0]),
)
def test_variance_rank_and_stable_rank_by_hand(s, frac):
    s = sorted(s, reverse=True)
    t = torch.tensor(s, dtype=torch.float64)
    e = np.array(s) ** 2
    share = np.cumsum(e) / e.sum() if e.sum() else np.zeros_like(e)
    got = int(variance_rank(t, frac))
    if e.sum() == 0:
        assert got == 0 and float(stable_rank(t)) == 0
        return
    # the fewest leading components that reach frac (ties at the boundary within rounding)
    assert share[got - 1] >= frac - 1e-9 and (got == 1 or share[got - 2] < frac + 1e-9)
    assert float(stable_rank(t)) == pytest.approx(e.sum() / e.max())
    assert np.allclose(cumulative_variance(t).numpy(), share)


def test_variance_rank_of_a_flat_spectrum():
    assert int(variance_rank(torch.ones(10), 0.9)) == 9 and int(variance_rank(torch.ones(10), 0.95)) == 10
    assert int(variance_rank(torch.tensor([3.0, 0, 0]), 0.9)) == 1


SHAPES = st.fixed_dictionaries(
    dict(
        d_model=st.sampled_from([8, 12, 16]),
        d_head=st.sampled_from([2, 4, 8]),
        n_heads=st.integers(1, 3),
        qk=st.sampled_from(["factored", "merged"]),
        attn_bias=st.booleans(),
    )
)


@settings(max_examples=15, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 1000))
def test_both_ranks_match_dense_svds(shape, seed):
    model = make_tiny_model("reverse", seed, std=0.5, **shape)
    T = model.cfg.n_ctx
    tokens = torch.randint(0, model.cfg.d_vocab, (3, T), generator=torch.Generator().manual_seed(seed))
    r = ranks(model, tokens, 0.9)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    X = cache[act_name("attn_in", 0)].double()
    aug = has_bias(model)
    for h in range(model.cfg.n_heads):
        B = head_B(model, 0, h).detach().double().numpy()
        s = np.linalg.svd(B, compute_uv=False)
        k = r.weight.shape[-1]
        assert np.allclose(r.weight[0, h].numpy(), s[:k], atol=1e-5 * max(1, s[0]))
        assert np.allclose(s[k:], 0, atol=1e-5 * max(1, s[0]))  # a factored head's spectrum stops at d_head
        assert abs(int(r.weight_rank[0, h]) - dense_variance_rank(s, 0.9)) <= _boundary(s, 0.9)
        Bp = head_B(model, 0, h, augmented=aug).detach().double().numpy()
        ranks_h, stable_h = [], []
        for p in range(3):
            x = (augment(X[p]) if aug else X[p]).numpy()
            S = x @ Bp @ x.T  # the full pre-mask scores
            Sc = S - S.mean(1, keepdims=True)
            sd = np.linalg.svd(Sc, compute_uv=False)
            scale = max(1.0, sd[0])
            np.testing.assert_allclose(r.data[p, 0, h].numpy(), sd, atol=1e-4 * scale)
            ranks_h.append(dense_variance_rank(sd, 0.9))
            stable_h.append((sd**2).sum() / sd[0] ** 2)
        assert abs(float(r.data_rank[0, h]) - np.mean(ranks_h)) <= 1
        assert float(r.data_stable_rank[0, h]) == pytest.approx(np.mean(stable_h), rel=1e-3)


def _boundary(s: np.ndarray, frac: float) -> int:
    """1 when some leading share of s lies within float32 rounding of ``frac`` (the rank may
    flip there), else 0."""
    e = s**2
    share = np.cumsum(e) / e.sum()
    return int(bool(np.any(np.abs(share - frac) < 1e-5)))


def test_rotary_scores_are_the_models_own(tmp_path):
    """With rotary positions S[i, j] = x_i B(j - i) x_j^T: every pair through the offset form of
    its own offset (attn_core.bilinear.heads.layer_form), then centred and SVD'd by numpy."""
    write_tiny_hf(tmp_path, "llama", num_key_value_heads=2)
    model = resolve(tmp_path).model
    T = 10
    tokens = torch.randint(0, 100, (2, T), generator=torch.Generator().manual_seed(0))
    r = ranks(model, tokens)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        forms = {d: layer_form(model, 1, offset=d).dense.double() for d in range(-(T - 1), T)}
    X = cache[act_name("attn_in", 1)].double()
    for h in (0, 3):
        for p in range(2):
            S = torch.zeros(T, T, dtype=torch.float64)
            for i in range(T):
                for j in range(T):
                    S[i, j] = X[p, i] @ forms[j - i][h] @ X[p, j]
            Sc = (S - S.mean(1, keepdim=True)).numpy()
            sd = np.linalg.svd(Sc, compute_uv=False)
            np.testing.assert_allclose(r.data[p, 1, h].numpy(), sd, atol=1e-4 * max(1, sd[0]))
    assert r.rank_cap.tolist() == [[8] * 4] * 2


def test_records_gap_and_bad_input():
    model = make_tiny_model("reverse", std=0.5)
    r = ranks(model)  # weight space only
    assert r.data is None and r.data_rank is None and np.isnan(gap(r))
    rows = r.heads()
    assert [(x["layer"], x["head"]) for x in rows] == [(0, 0), (0, 1)]
    assert rows[0]["data_rank"] is None and rows[0]["gap"] is None and rows[0]["rank_cap"] == 8
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 8), generator=torch.Generator().manual_seed(0))
    r2 = ranks(model, tokens, 0.8)
    assert r2.to_json()["variance"] == 0.8 and r2.n_probes == 2
    row = r2.heads()[1]
    assert row["gap"] == pytest.approx(row["weight_rank"] / row["data_rank"])
    curves = r2.curves()
    assert {c["space"] for c in curves} == {"weight", "data"}
    assert max(c["variance"] for c in curves) == pytest.approx(1.0)
    for bad in (0, 1.5, True, "0.9"):
        with pytest.raises(ValueError, match="--variance"):
            ranks(model, None, bad)
    with pytest.raises(ValueError, match="exceed the model context"):
        ranks(model, torch.zeros(1, 100, dtype=torch.long))
    assert isinstance(r2, Ranks)


def test_dynamics_measures_sinks_and_both_ranks():
    """The dynamics metric lines are these functions on the first 32 held-out inputs (64 tokens)."""
    from attn_core import dynamics as D
    from attn_core.bilinear import sinks

    loaded = resolve("sort-2l-mlp")
    model = loaded.model
    inputs = D.task_inputs(loaded.task, samples=40)
    values = D.measure(model, inputs, detector_samples=2).values
    probes = inputs.tokens[:32, :64]
    s, r = sinks(model, probes), ranks(model, probes)
    assert values["sink_rate"] == pytest.approx(s.rate) and s.rate > 0
    for l in range(2):
        for h in range(4):
            assert values[f"sink_importance:L{l}H{h}"] == pytest.approx(float(s.strongest[l, h]))
            assert values[f"weight_rank:L{l}H{h}"] == int(r.weight_rank[l, h])
            assert values[f"data_rank:L{l}H{h}"] == pytest.approx(float(r.data_rank[l, h]))
            assert values[f"data_stable_rank:L{l}H{h}"] == pytest.approx(float(r.data_stable_rank[l, h]))
    partial = D.measure(model, inputs, detector_samples=2, partial=True).values
    assert partial["sink_rate"] is None and partial["data_rank:L0H0"] is None
    assert partial["weight_rank:L0H0"] == values["weight_rank:L0H0"]


@pytest.mark.parametrize("augmented", [False, True])
def test_al_spectrum_factorises_each_head_once(monkeypatch, augmented):
    """The weight ranks of al.spectrum read the spectrum's own singular values (the same numbers
    ranks() computes alone); an augmented B is another matrix, whose ranks are of B itself."""
    import importlib

    import attn_core as al

    module = importlib.import_module("attn_core.bilinear.ranks")

    model = make_tiny_model(n_layers=2)
    want = ranks(model).heads()
    calls = []
    real = module.weight_spectra
    monkeypatch.setattr(module, "weight_spectra", lambda m: calls.append(1) or real(m))
    got = al.spectrum(model, augmented=augmented)
    assert len(calls) == (1 if augmented else 0)
    assert got["weight_rank"].tolist() == [h["weight_rank"] for h in want]


def test_the_spectrum_holds_one_layers_form_at_a_time(monkeypatch):
    """spectrum and the weight ranks make each layer's form when they reach it, never the whole
    model's stacked (a 0.6B model's factors are 470 MiB); the numbers are model_form's (to float32
    rounding: a layer's factorisation alone or in the stack may sum in another order)."""
    import importlib

    from attn_core.bilinear.heads import model_form

    spectrum_module = importlib.import_module("attn_core.bilinear.spectrum")
    ranks_module = importlib.import_module("attn_core.bilinear.ranks")
    model = make_tiny_model(n_layers=3, d_qk=[[8, 8], [8, 12], [6, 8]])  # grown heads: padded alike
    want = model_form(model).singular_values.double()

    def whole(*args, **kwargs):
        raise AssertionError("the whole model's form was built")

    for module in (spectrum_module, ranks_module):
        monkeypatch.setattr(module, "model_form", whole, raising=False)
    assert torch.allclose(ranks_module.weight_spectra(model), want, rtol=1e-6, atol=1e-7)
    rows = spectrum_module.spectrum(model)
    got = torch.tensor([r["singular_values"] for r in rows], dtype=torch.float64)
    assert torch.allclose(got, want.flatten(0, 1), rtol=1e-6, atol=1e-7)
