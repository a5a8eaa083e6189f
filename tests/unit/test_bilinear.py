"""The bilinear-form engine: B and B', the factored spectrum against dense linear algebra,
views of f_x(y) against the model's own scores, head detectors."""

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import bilinear as bl
from attn_core.hooks import act_name
from attn_core.model import Transformer
from attn_core.sources import LoadedModel
from tests.conftest import MODEL_KINDS, SPECTRUM_KEYS, make_tiny_model

ZOO = Path(__file__).resolve().parents[2] / "assets" / "models"
TOKENS = [1, 2, 3, 4, 5, 1, 2, 3, 0, 7]


BASE = dict(n_layers=2, n_heads=3, d_model=24, d_head=6, d_vocab=12, n_ctx=12)


def random_model(std: float = 0.4, seed: int = 0, **kw) -> Transformer:
    """A small model with weights large enough that attention is far from uniform."""
    return make_tiny_model(seed=seed, std=std, **{**BASE, **kw})


def loaded(model: Transformer) -> LoadedModel:
    """The model as views and token helpers take it (no card, so no task)."""
    return LoadedModel("test", model, model.cfg)


KINDS = MODEL_KINDS


# --- QKForm: factored spectrum == dense linear algebra ------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(2, 24),
    r=st.integers(1, 12),
    batch=st.integers(1, 3),
    rank=st.integers(0, 12),
    seed=st.integers(0, 10_000),
)
def test_factored_singular_values_equal_dense_svdvals(m, r, batch, rank, seed):
    g = torch.Generator().manual_seed(seed)
    L = torch.randn(batch, m, r, generator=g, dtype=torch.float64)
    R = torch.randn(batch, m, r, generator=g, dtype=torch.float64)
    if rank < r:  # lower the true rank below the factor width
        L[..., rank:] = L[..., :1].expand_as(L[..., rank:]) * 0.0
    form = bl.QKForm(L, R)
    dense = torch.linalg.svdvals(L @ R.transpose(-1, -2))
    s = form.singular_values
    k = s.shape[-1]
    assert k == (r if r < m else m)
    assert torch.allclose(s, dense[..., :k], atol=1e-9 * max(1.0, dense.max().item()))
    assert torch.all(dense[..., k:] < 1e-9 * max(1.0, dense.max().item()))
    U, S, Vh = form.svd()
    assert torch.allclose(U @ torch.diag_embed(S) @ Vh, form.dense, atol=1e-9)
    scale = max(1.0, dense.max().item())
    assert form.frobenius_norm.sub(torch.linalg.matrix_norm(form.dense)).abs().max() < 1e-9 * scale
    assert form.nuclear_norm.sub(torch.linalg.matrix_norm(form.dense, "nuc")).abs().max() < 1e-8 * scale
    assert form.spectral_norm.sub(torch.linalg.matrix_norm(form.dense, 2)).abs().max() < 1e-9 * scale


@settings(max_examples=20, deadline=None)
@given(m=st.integers(3, 20), r=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_core_eigenvalues_are_the_nonzero_eigenvalues_of_B(m, r, seed):
    g = torch.Generator().manual_seed(seed)
    L = torch.randn(m, r, generator=g, dtype=torch.float64)
    R = torch.randn(m, r, generator=g, dtype=torch.float64)
    form = bl.QKForm(L, R)
    dense = torch.linalg.eigvals(form.dense)
    dense = dense[dense.abs().argsort(descending=True)]
    ev = form.eigenvalues
    k = ev.shape[-1]
    # the core's eigenvalues are the k largest of B in modulus; the rest of B's are zero
    assert torch.all(dense[k:].abs() < 1e-8)
    for lam in ev:
        assert (dense[:k] - lam).abs().min() < 1e-7 * max(1.0, lam.abs().item())
    # symmetric part: padding the core's 2r eigenvalues with zeros gives B_sym's spectrum
    sym = torch.linalg.eigvalsh((form.dense + form.dense.T) / 2)
    got = form.eigenvalues_sym
    padded = torch.cat([got, got.new_zeros(m - got.shape[-1])]).sort().values
    assert torch.allclose(padded, sym, atol=1e-8)
    assert torch.allclose(form.symmetric.dense + form.antisymmetric.dense, form.dense, atol=1e-12)
    assert torch.allclose(form.antisymmetric.dense, -form.antisymmetric.dense.T, atol=1e-12)


def test_factored_path_never_forms_the_dense_matrix():
    form = bl.QKForm(torch.randn(4, 64, 8), torch.randn(4, 64, 8))
    assert form.uses_core
    _ = (form.singular_values, form.eigenvalues, form.eigenvalues_sym, form.stable_rank, form.effective_rank)
    assert "dense" not in form.__dict__
    assert not bl.QKForm(torch.randn(8, 8), torch.randn(8, 8)).uses_core  # full width: dense path


def test_ranks_by_hand():
    B = torch.diag(torch.tensor([3.0, 1.0, 0.0, 0.0]))
    form = bl.QKForm(dense=B)
    assert form.stable_rank.item() == pytest.approx(10 / 9)
    p = torch.tensor([0.75, 0.25])
    assert form.effective_rank.item() == pytest.approx(math.exp(-(p * p.log()).sum().item()))
    zero = bl.QKForm(torch.zeros(6, 2), torch.zeros(6, 2))
    assert zero.stable_rank.item() == 0 and zero.effective_rank.item() == 0


def test_qkform_validates_and_indexes():
    with pytest.raises(ValueError):
        bl.QKForm(torch.randn(3, 4, 2), torch.randn(3, 4, 3))
    with pytest.raises(ValueError):
        bl.QKForm()
    with pytest.raises(ValueError, match="square"):
        _ = bl.QKForm(torch.randn(5, 2), torch.randn(4, 2)).eigenvalues
    form = bl.model_form(random_model())
    assert form.batch_shape == (2, 3) and form[1, 2].shape == (24, 24)
    assert torch.allclose(form[1][2].dense, form.dense[1, 2])


@settings(max_examples=15, deadline=None)
@given(m=st.integers(2, 10), r1=st.integers(1, 5), r2=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_transpose_and_products_stay_factored_and_equal_dense(m, r1, r2, seed):
    g = torch.Generator().manual_seed(seed)
    a = bl.QKForm(
        torch.randn(m, r1, generator=g, dtype=torch.float64), torch.randn(m, r1, generator=g, dtype=torch.float64)
    )
    b = bl.QKForm(
        torch.randn(m, r2, generator=g, dtype=torch.float64), torch.randn(m, r2, generator=g, dtype=torch.float64)
    )
    M = torch.randn(m, m, generator=g, dtype=torch.float64)
    dense = bl.QKForm(dense=b.dense)
    assert torch.allclose(a.T.dense, a.dense.T)
    for got, want in (
        (a @ b, a.dense @ b.dense),
        (a @ M, a.dense @ M),
        (M @ a, M @ a.dense),
        (a @ dense, a.dense @ b.dense),
        (dense @ a, b.dense @ a.dense),
    ):
        assert torch.allclose(got.dense, want, atol=1e-10)
    assert not (a @ b).is_dense and (a @ b).left.shape[-1] == min(r1, r2)
    assert torch.allclose((a @ b).singular_values, torch.linalg.svdvals(a.dense @ b.dense)[: min(r1, r2, m)], atol=1e-8)


def test_views_and_detectors_take_either_model_object():
    model = random_model()
    assert torch.equal(bl.sequence_view(model, [1, 2]).scores, bl.sequence_view(loaded(model), [1, 2]).scores)
    a, b = (bl.head_detectors(m, n_samples=2) for m in (model, loaded(model)))
    assert a.equals(b)
    with pytest.raises(TypeError, match="sequence_view takes a model"):
        bl.sequence_view("a name", [1, 2])
    with pytest.raises(TypeError, match="head_detectors takes a model"):
        bl.head_detectors(model.state_dict(), n_samples=2)


# --- B from a model ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(KINDS))
def test_sequence_view_equals_the_models_scores(kind):
    model = random_model(**KINDS[kind])
    _, cache = model.run_with_cache(torch.tensor([TOKENS]))
    for layer in range(model.cfg.n_layers):
        view = bl.sequence_view(loaded(model), TOKENS, layer)
        S, A = cache[act_name("attn_scores", layer)][0], cache[act_name("pattern", layer)][0]
        assert torch.allclose(view.scores, S, atol=1e-5, rtol=1e-5), kind
        assert torch.allclose(view.pattern, A, atol=1e-6), kind
        # and through the dense B' of each head, S = X' B' X'^T exactly
        X = bl.augment(cache[act_name("attn_in", layer)][0])
        for h in range(model.cfg.n_heads):
            Bp = bl.head_B(model, layer, h, augmented=True)
            assert torch.allclose(X @ Bp @ X.T, S[h], atol=1e-5, rtol=1e-5)
        assert view.scores.grad_fn is None


def test_bias_needs_the_augmented_form():
    model = random_model(**KINDS["biased"])
    _, cache = model.run_with_cache(torch.tensor([TOKENS]))
    X = cache[act_name("attn_in", 0)][0]
    plain = X @ bl.head_B(model, 0, 0) @ X.T
    assert not torch.allclose(plain, cache[act_name("attn_scores", 0)][0, 0], atol=1e-3)
    Bp = bl.head_B(model, 0, 0, augmented=True)
    assert Bp.shape == (25, 25) and torch.allclose(Bp[:24, :24], bl.head_B(model, 0, 0))


def test_from_model_spectrum_matches_dense_for_every_kind():
    for kind, kw in KINDS.items():
        model = random_model(**kw)
        form = bl.model_form(model)
        assert form.uses_core == (kind != "merged")
        dense = torch.linalg.svdvals(torch.stack([bl.layer_B(model, l) for l in range(2)]))
        k = form.singular_values.shape[-1]
        assert torch.allclose(form.singular_values, dense[..., :k], atol=1e-5), kind


def test_grown_heads_have_their_own_rank():
    model = random_model(**KINDS["grown"])
    recs = bl.spectrum_rows(model)
    caps = [r["rank_cap"] for r in recs]
    assert caps == [6, 9, 4, 7, 6, 6]
    for r in recs:
        s = torch.tensor(r["singular_values"])
        assert (s > 1e-5).sum().item() == r["rank_cap"]


def test_spectrum_records():
    recs = bl.spectrum_rows(random_model())
    assert len(recs) == 6
    assert SPECTRUM_KEYS <= set(recs[0])
    r = recs[0]
    assert r["spectral_norm"] == pytest.approx(r["singular_values"][0])
    assert 1 <= r["stable_rank"] <= r["effective_rank"] + 1e-6 <= 6 + 1e-6
    frame = bl.spectrum_frame(random_model())
    assert len(frame) == 6 * 6 and frame["normalized"].max() == pytest.approx(1.0)
    assert set(bl.eigen_frame(random_model()).columns) >= {"real", "imag", "modulus"}


# --- vocabulary and positional views -------------------------------------------------------------


def test_vocab_scores_by_hand_and_differentiable():
    model = random_model(**KINDS["biased"])
    x = model.blocks[1].ln1(model.embed.W_E + model.pos_embed.W_pos.mean(0))
    assert torch.allclose(bl.vocab_inputs(model, 1), x)
    S = bl.vocab_scores(model, layer=1, heads=[2])
    attn = model.blocks[1].attn
    q = x @ attn.W_Q[2] + attn.b_Q[2]
    k = x @ attn.W_K[2] + attn.b_K[2]
    assert S.shape == (1, 12, 12)
    assert torch.allclose(S[0], q @ k.T / math.sqrt(6), atol=1e-5)
    S.pow(2).sum().backward()
    assert attn.W_Q.grad is not None and model.embed.W_E.grad is not None


def test_vocab_inputs_without_positions_or_norm():
    model = random_model(**KINDS["no_norm_no_pos"])
    assert torch.equal(bl.vocab_inputs(model), model.embed.W_E)
    with pytest.raises(ValueError, match="no position"):
        bl.positional_inputs(model)


def test_positional_view_is_causal():
    model = random_model()
    view = bl.positional_view(loaded(model), 0, [1])
    assert view.scores.shape == (1, 12, 12) and view.queries[3] == "p3"
    assert torch.equal(view.mask, torch.tril(torch.ones(12, 12, dtype=torch.bool)))
    assert torch.allclose(view.pattern.sum(-1), torch.ones(1, 12))
    assert view.pattern[0].triu(1).abs().max() == 0
    expected = bl.positional_scores(model, 0, [1]).detach()
    assert torch.allclose(view.scores, expected, atol=1e-6)


def test_vocabulary_view_rows_and_table():
    model = random_model()
    view = bl.vocabulary_view(loaded(model), 1)
    assert view.scores.shape == (3, 12, 12) and view.mask.all()
    row = view.row(head=2, query=4, sort=True)
    assert list(row.columns) == ["key", "label", "score", "prob", "rank"]
    assert row["score"].is_monotonic_decreasing and row["rank"].tolist() == list(range(1, 13))
    assert row["prob"].sum() == pytest.approx(1.0, abs=1e-5)
    unsorted = view.row(2, 4)
    assert unsorted["key"].tolist() == list(range(12))
    assert unsorted.loc[row["key"][0], "rank"] == 1
    table = view.concentration_table(k=2)
    assert len(table) == 3 * 6 and {"mean", "min", "max"} <= set(table.columns)
    assert (table["min"] <= table["mean"] + 1e-9).all() and (table["mean"] <= table["max"] + 1e-9).all()
    sub = bl.vocabulary_view(loaded(model), 0, heads=[0], tokens=[3, 5, 7])
    assert sub.keys == ["3", "5", "7"] and sub.scores.shape == (1, 3, 3)
    assert torch.allclose(sub.scores[0], view_scores(model, [3, 5, 7]))


def view_scores(model, tokens):
    full = bl.vocab_scores(model, 0, [0]).detach()[0]
    return full[tokens][:, tokens]


def test_sequence_view_labels_rows_and_frame():
    model = random_model()
    view = bl.sequence_view(loaded(model), [3, 1, 3], layer=1, heads=[0, 2])
    assert view.queries == ["0:3", "1:1", "2:3"]
    row = view.row(2, 2)
    assert row["key"].tolist() == [0, 1, 2]
    first = view.row(0, 0)
    assert len(first) == 1 and first["prob"][0] == pytest.approx(1.0)
    frame = view.frame()
    assert len(frame) == 2 * 9 and frame["visible"].sum() == 2 * 6
    c = view.concentration()
    assert c["entropy"].shape == (2, 3) and c["entropy"][:, 0].abs().max() < 1e-6


def test_concentration_table_on_data_and_vocabulary():
    model = random_model()
    table = bl.concentration_table(loaded(model), TOKENS)
    assert set(table["view"]) == {"sequence", "vocabulary"}
    assert len(table) == 2 * 2 * 3 * 6


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m: bl.sequence_view(loaded(m), [1, 2], layer=2), r"layer 2 is outside 0\.\.1"),
        (lambda m: bl.sequence_view(loaded(m), [1, 2], layer=0, heads=[3]), r"head 3 is outside 0\.\.2"),
        (lambda m: bl.sequence_view(loaded(m), [1, 12], layer=0), r"token id 12 is outside 0\.\.11"),
        (lambda m: bl.sequence_view(loaded(m), list(range(12)) + [0], layer=0), "exceed the model context of 12"),
        (lambda m: bl.sequence_view(loaded(m), [], layer=0), "no tokens"),
        (lambda m: bl.sequence_view(loaded(m), [1, 2]).row(0, 5), r"query 5 is outside 0\.\.1"),
        (lambda m: bl.sequence_view(loaded(m), [1, 2], heads=[1]).row(0, 0), "head 0 is not in this view"),
        (lambda m: bl.head_B(m, 0, 7), r"head 7 is outside"),
        (lambda m: bl.random_tokens(loaded(m), length=99), r"outside 1\.\.12"),
    ],
)
def test_bad_indices_name_the_valid_range(call, match):
    with pytest.raises(ValueError, match=match):
        call(random_model())


def test_tokens_helpers():
    model = random_model()
    assert bl.random_tokens(loaded(model), seed=3) == bl.random_tokens(loaded(model), seed=3)
    assert len(bl.random_tokens(loaded(model), length=5)) == 5
    assert bl.input_ids(loaded(model), "1 5 11") == [1, 5, 11]
    with pytest.raises(ValueError, match="unknown token"):
        bl.input_ids(loaded(model), "1 x")
    with pytest.raises(ValueError, match="no task"):
        bl.sample_tokens(loaded(model))
    assert bl.token_names(loaded(model))[:3] == ["0", "1", "2"]


# --- head detectors ------------------------------------------------------------------------------


def test_detection_patterns_by_hand():
    t = torch.tensor([[5, 6, 7, 5, 6, 7]])
    p = bl.detection_patterns(t)
    assert p["previous_token"][0, 3].nonzero().flatten().tolist() == [2]
    assert p["duplicate_token"][0, 4].nonzero().flatten().tolist() == [1]
    assert p["induction"][0, 4].nonzero().flatten().tolist() == [2]  # 6 after 5 -> the token after the earlier 6
    assert p["induction"][0, :3].sum() == 0 and p["duplicate_token"][0, :3].sum() == 0
    assert torch.equal(p["self"][0], torch.eye(6, dtype=torch.bool))


def test_detector_scores_a_perfect_previous_token_head():
    """A 1-layer model whose head is built to attend to the previous position."""
    model = random_model(n_layers=1, n_heads=2, d_model=16, d_head=12, normalization="none", d_vocab=10, n_ctx=12)
    with torch.no_grad():
        model.embed.W_E.zero_()
        model.pos_embed.W_pos.copy_(torch.eye(12, 16) * 1.0)  # one-hot positions
        attn = model.blocks[0].attn
        attn.W_Q.zero_()
        attn.W_K.zero_()
        # head 0: query p looks for key p-1 (positions 0..7 through 8 dims)
        for p in range(1, 9):
            attn.W_Q[0, p, p - 1] = 40.0
            attn.W_K[0, p - 1, p - 1] = 1.0
        # head 1: every query looks at itself
        for p in range(9):
            attn.W_Q[1, p, p] = 40.0
            attn.W_K[1, p, p] = 1.0
    scores = bl.head_detector_scores(model, n_samples=4, length=9)
    assert scores["previous_token"][0, 0] > 0.99
    assert scores["self"][0, 1] > 0.99
    assert scores["self"][0, 0] == pytest.approx(1 / 9, abs=0.01)  # only row 0, which sees itself alone
    assert scores["previous_token"][0, 1] < 0.01
    frame = bl.head_detectors(model, n_samples=4, length=9)
    assert bl.best_heads(frame)["previous_token"] == {
        "layer": 0,
        "head": 0,
        "score": pytest.approx(float(scores["previous_token"][0, 0])),
    }
    tl = bl.head_detector_scores(model, n_samples=4, length=9, rows="all")
    assert tl["previous_token"][0, 0] == pytest.approx(8 / 9, abs=0.01)  # row 0 has no previous token


def test_detector_inputs_are_seeded_and_repeated():
    model = random_model()
    a, b = bl.detector_inputs(model, 3, seed=1), bl.detector_inputs(model, 3, seed=1)
    assert torch.equal(a["random"], b["random"]) and torch.equal(a["repeated"], b["repeated"])
    r = a["repeated"]
    assert r.shape == (3, 12) and torch.equal(r[:, :6], r[:, 6:])
    assert all(len(set(row[:6].tolist())) == 6 for row in r)
    with pytest.raises(ValueError, match="rows must be"):
        bl.head_detector_scores(model, rows="some")


@pytest.mark.skipif(
    not (ZOO / "induction-2l" / "config.json").is_file(), reason="zoo model induction-2l not shipped yet"
)
def test_detectors_find_the_zoo_induction_circuit():
    from attn_core.sources import resolve

    loaded = resolve("induction-2l")
    frame = bl.head_detectors(loaded.model, n_samples=32)
    best = bl.best_heads(frame)
    prev = frame[frame["detector"] == "previous_token"].sort_values("score", ascending=False)
    # One layer-0 head attends to the previous token (in the first period, where the induction
    # head needs it) far more than any other head; every layer-1 head is an induction head.
    assert best["previous_token"]["layer"] == 0 and best["previous_token"]["score"] > 0.3
    assert prev["score"].iloc[0] - prev["score"].iloc[1] > 0.15
    assert best["induction"]["layer"] == 1 and best["induction"]["score"] > 0.6


def test_detectors_without_support_are_nan():
    """A context of 3 repeats one token at most: no row can show induction, which is NaN (not 0)."""
    model = random_model(n_ctx=3)
    scores = bl.head_detector_scores(model, n_samples=2)
    assert torch.isnan(scores["induction"]).all() and not torch.isnan(scores["previous_token"]).any()
    best = bl.best_heads(bl.head_detectors(model, n_samples=2))
    assert best["induction"] is None and best["previous_token"]["layer"] in (0, 1)
