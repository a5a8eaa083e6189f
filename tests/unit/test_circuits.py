"""Circuits (attn_core.circuits): attribution of f_x(y) against the model's own scores,
composition scores against an explicit dense computation, copying scores of heads built to copy
and to anti-copy, the induction-2l composition finding, the JSON reports and the figures."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_core import circuits as ci
from attn_core.bilinear import best_heads, head_detectors, layer_form
from attn_core.hooks import act_name
from attn_core.model import Transformer
from attn_core.sources import LoadedModel
from tests.conftest import MODEL_KINDS, make_tiny_model

ZOO = Path(__file__).resolve().parent.parent.parent / "assets" / "models"
TOKENS = [1, 2, 3, 4, 5, 1, 2, 3, 0, 7]

KINDS = MODEL_KINDS


def random_model(std: float = 0.3, seed: int = 0, **kw) -> Transformer:
    """A small model with weights large enough that attention is far from uniform."""
    base = dict(n_layers=2, n_heads=3, d_model=24, d_head=6, d_vocab=12, n_ctx=12)
    return make_tiny_model(seed=seed, std=std, **{**base, **kw})


def loaded_of(model: Transformer) -> LoadedModel:
    """A bare model as a LoadedModel without a card (token names are the ids)."""
    return LoadedModel("t", model, model.cfg)


def own_scores(model: Transformer, tokens: list[int]) -> list[torch.Tensor]:
    """The model's own pre-softmax scores per layer, [heads, T, T] each."""
    _, cache = model.run_with_cache(torch.tensor([tokens]))
    return [cache[act_name("attn_scores", l)][0].detach().double() for l in range(model.cfg.n_layers)]


# --- attribution --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(KINDS))
def test_attribution_terms_and_bias_sum_to_the_models_own_scores(kind):
    model = random_model(**KINDS[kind])
    S = own_scores(model, TOKENS)
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            for query in (0, 4, len(TOKENS) - 1):
                attr = ci.attribute(loaded_of(model), TOKENS, layer, head, query)
                total = attr.terms.sum(-1) + attr.bias
                torch.testing.assert_close(total, S[layer][head, query, : query + 1], atol=1e-5, rtol=0)
                assert attr.keys == list(range(query + 1))
    # the number of rank-1 terms is the head's own rank cap: d_qk (grown: per head) or d_model (merged)
    attr = ci.attribute(loaded_of(model), TOKENS, 0, 2, 3)
    expected = {"merged": 24, "grown": 4}.get(kind, 6)
    assert attr.terms.shape == (4, expected) and attr.sigma.shape == (expected,)
    assert (attr.sigma[:-1] >= attr.sigma[1:]).all()
    if kind != "biased":
        assert attr.bias.abs().max() == 0


def test_each_term_is_sigma_times_the_coordinates_along_the_singular_pair():
    model = random_model()
    attr = ci.attribute(loaded_of(model), TOKENS, 1, 0, 6)
    torch.testing.assert_close(attr.terms, attr.sigma * attr.x_coords * attr.y_coords)
    B = layer_form(model, 1)[0].dense.double()
    _, cache = model.run_with_cache(torch.tensor([TOKENS]))
    X = cache[act_name("attn_in", 1)][0].double()
    torch.testing.assert_close(attr.scores, X[6] @ B @ X[:7].T, atol=1e-6, rtol=0)


def test_runner_up_differences_add_up_to_the_margin():
    model = random_model(attn_bias=True)
    attr = ci.attribute(loaded_of(model), TOKENS, 1, 1, 9)
    diff = attr.runner_up()
    s = attr.scores.sort(descending=True).values
    assert diff["difference"].sum() == pytest.approx(float(s[0] - s[1]), abs=1e-9)
    assert diff.attrs["winner"] == attr.top(1)[0] and diff.attrs["runner_up"] == attr.top(2)[1]
    assert list(diff["difference"].abs()) == sorted(diff["difference"].abs(), reverse=True)
    assert ci.attribute(loaded_of(model), TOKENS, 1, 1, 0).runner_up().empty  # one key: no runner-up


@pytest.mark.parametrize("kind", ["factored", "biased", "merged", "grown", "no_norm"])
def test_token_position_split_adds_up_at_layer_0(kind):
    kw = dict(KINDS.get(kind, {}), **({"normalization": "none"} if kind == "no_norm" else {}))
    model = random_model(**kw)
    S = own_scores(model, TOKENS)[0]
    for head in range(model.cfg.n_heads):
        split = ci.token_position_split(loaded_of(model), TOKENS, head, 8)
        parts = split[list(ci.SPLIT_PARTS)].sum(axis=1)
        torch.testing.assert_close(torch.tensor(parts.values), S[head, 8, :9], atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(split["score"].values), S[head, 8, :9], atol=1e-5, rtol=0)
    if kind == "no_norm":  # no LayerNorm bias nor attention biases: nothing left over
        assert split["bias"].abs().max() == 0


def test_token_position_split_needs_learned_positions():
    with pytest.raises(ValueError, match="learned position"):
        ci.token_position_split(loaded_of(random_model(positional="none")), TOKENS, 0, 3)


def test_attribution_rejects_bad_inputs():
    model = random_model()
    with pytest.raises(ValueError, match="query must be an integer in 0..9"):
        ci.attribute(loaded_of(model), TOKENS, 0, 0, 10)
    with pytest.raises(ValueError, match="layer 2 is outside"):
        ci.attribute(loaded_of(model), TOKENS, 2, 0, 1)
    with pytest.raises(ValueError, match="head 3 is outside"):
        ci.attribute(loaded_of(model), TOKENS, 0, 3, 1)


# --- composition --------------------------------------------------------------------------------


def dense_composition(model: Transformer, fold_ln: bool = True) -> dict[str, torch.Tensor]:
    """Elhage et al.'s scores from dense d_model x d_model matrices, pair by pair."""
    cfg = model.cfg
    d, L, H = cfg.d_model, cfg.n_layers, cfg.n_heads
    n = L * H
    out = {k: torch.full((n, n), math.nan, dtype=torch.float64) for k in "qkv"}

    def N(l):
        ln = model.blocks[l].ln1
        if not fold_ln or not hasattr(ln, "w"):
            return torch.eye(d, dtype=torch.float64)
        return (torch.eye(d, dtype=torch.float64) - 1.0 / d) @ torch.diag(ln.w.detach().double())

    def ov(l, h):
        a = model.blocks[l].attn
        return (a.W_V[h] @ a.W_O[h]).detach().double()

    def score(M1, M2):
        return torch.linalg.norm(M1 @ M2) / (torch.linalg.norm(M1) * torch.linalg.norm(M2))

    for i in range(n):
        a, ha = divmod(i, H)
        for j in range(n):
            b, hb = divmod(j, H)
            if a >= b:
                continue
            B = N(b) @ layer_form(model, b)[hb].dense.detach().double() @ N(b).T
            out["q"][i, j] = score(ov(a, ha), B)
            out["k"][i, j] = score(ov(a, ha), B.T)
            out["v"][i, j] = score(ov(a, ha), N(b) @ ov(b, hb))
    return out


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("fold_ln", [True, False])
def test_composition_scores_match_an_explicit_dense_computation(kind, fold_ln):
    model = (
        random_model(n_layers=3, **KINDS[kind])
        if kind != "grown"
        else random_model(n_layers=3, d_qk=[[6, 9, 4], [7, 6, 6], [3, 6, 8]])
    )
    comp = ci.composition(model, fold_ln=fold_ln, n_samples=4)
    dense = dense_composition(model, fold_ln)
    assert comp.order[:4] == ["L0H0", "L0H1", "L0H2", "L1H0"] and len(comp.order) == 9
    for k in "qkv":
        torch.testing.assert_close(comp.scores[k].double(), dense[k], atol=1e-5, rtol=0, equal_nan=True)
        assert torch.isnan(comp.baseline[k]).equal(torch.isnan(dense[k]))


def test_composition_baseline_is_the_mean_over_random_matrices_and_deterministic():
    model = random_model(n_layers=2)
    a = ci.composition(model, n_samples=32, seed=3)
    b = ci.composition(model, n_samples=32, seed=3)
    c = ci.composition(model, n_samples=32, seed=4)
    for k in "qkv":
        assert torch.equal(a.baseline[k].nan_to_num(-1), b.baseline[k].nan_to_num(-1))
        valid = ~torch.isnan(a.baseline[k])
        assert not torch.equal(a.baseline[k][valid], c.baseline[k][valid])
        assert ((a.baseline[k][valid] > 0) & (a.baseline[k][valid] < 1)).all()
        torch.testing.assert_close(a.corrected(k), a.scores[k] - a.baseline[k], equal_nan=True)
    # against a dense Monte Carlo estimate of the same quantity (other draws): Gaussian factors
    # of the OV shape (24 x 6, 24 x 6) and of the QK shape
    g = torch.Generator().manual_seed(99)
    vals = []
    for _ in range(400):
        M1 = torch.randn(24, 6, generator=g, dtype=torch.float64) @ torch.randn(6, 24, generator=g, dtype=torch.float64)
        M2 = torch.randn(24, 6, generator=g, dtype=torch.float64) @ torch.randn(6, 24, generator=g, dtype=torch.float64)
        vals.append(float(torch.linalg.norm(M1 @ M2) / (torch.linalg.norm(M1) * torch.linalg.norm(M2))))
    mc = sum(vals) / len(vals)
    assert ci.baseline_score("q", (24, 6, False), (24, 6, False), n_samples=400) == pytest.approx(mc, abs=0.01)
    assert float(a.baseline["q"][0, 3]) == pytest.approx(mc, abs=0.02)
    # one of the two rotation invariant: E||M1 M2||^2 = ||M1||^2 ||M2||^2 / d, so about 1/sqrt(d)
    # whatever the ranks (a dense merged B included)
    assert mc == pytest.approx(24**-0.5, abs=0.01)
    assert ci.baseline_score("k", (24, 6, False), (24, 24, True), n_samples=200) == pytest.approx(24**-0.5, abs=0.01)
    with pytest.raises(ValueError, match="composition kind"):
        a.corrected("x")


def test_composition_of_a_head_that_writes_into_the_keys_of_another():
    """Head L0H0 writes exactly into the 6-dim subspace that L1H1's keys read, orthogonal to what
    its queries read: C_K = ||W_V (9 Q_q^T)|| / (||W_V|| 9 ||Q_k Q_q^T||) = 1 / sqrt(6), C_Q = 0."""
    model = random_model(normalization="none", std=0.2)
    d, dh = 24, 6
    with torch.no_grad():
        a, b = model.blocks[0].attn, model.blocks[1].attn
        basis = torch.linalg.qr(torch.randn(d, d))[0]
        a.W_O[0] = basis[:, :dh].T  # writes into span(basis[:, :6])
        b.W_K[1] = basis[:, :dh] * 3  # keys read that span
        b.W_Q[1] = basis[:, dh : 2 * dh] * 3  # queries read an orthogonal one
    comp = ci.composition(model)
    k, q = comp.scores["k"], comp.scores["q"]
    assert float(k[0, 4]) == pytest.approx(6**-0.5, abs=1e-5)
    assert k[0, 4] == k[:, 4].nan_to_num(-1).max()
    assert q[0, 4] < 1e-5
    assert comp.edges("k", top=1)[0]["source"] == "L0H0" and comp.edges("k", top=1)[0]["target"] == "L1H1"


# --- OV circuits and copying ---------------------------------------------------------------------


def copy_model(sign: float, std: float = 0.05) -> Transformer:
    """One layer, no LayerNorm or positions, W_U = W_E^T: head 0 has W_OV = sign * (the
    projection on the first d_head dims) + noise, so E W_OV U is sign times a PSD matrix; its QK
    form has W_K = W_Q, so B is PSD too."""
    model = random_model(n_layers=1, normalization="none", positional="none", d_vocab=20, std=0.5)
    with torch.no_grad():
        attn = model.blocks[0].attn
        eye = torch.eye(24)
        attn.W_V[0] = eye[:, :6] + std * torch.randn(24, 6)
        attn.W_O[0] = sign * eye[:6] + std * torch.randn(6, 24)
        attn.W_K[0] = attn.W_Q[0]
        model.unembed.W_U.copy_(model.embed.W_E.T)
    return model


@pytest.mark.parametrize("sign, expected", [(1.0, 1.0), (-1.0, -1.0)])
def test_copying_score_of_a_head_built_to_copy_or_anti_copy(sign, expected):
    model = copy_model(sign)
    copy = ci.copying_scores(model)
    assert copy.shape == (1, 3)
    assert float(copy[0, 0]) == pytest.approx(expected, abs=0.05)
    assert float(ci.qk_positivities(model)[0, 0]) == pytest.approx(1.0, abs=1e-4)
    # exactly (no noise): eigenvalues of a PSD matrix
    assert float(ci.copying_scores(copy_model(sign, std=0.0))[0, 0]) == pytest.approx(expected, abs=1e-4)
    # the heatmap's dense circuit has the same trace the score's numerator uses
    M = ci.full_ov_circuit(model, 0, 0)
    with torch.no_grad():
        eig = ci.full_ov_form(model, 0)[0].eigenvalues
    assert float(M.trace()) == pytest.approx(float(eig.sum().real), rel=1e-4)
    assert float(ci.positivity(torch.linalg.eigvals(M.double())[None])[0]) == pytest.approx(float(copy[0, 0]), abs=1e-4)


def test_ov_spectrum_is_factored_and_matches_the_dense_svd():
    model = random_model(**KINDS["biased"])
    sv = ci.ov_singular_values(model)
    assert sv.shape == (2, 3, 6)
    a = model.blocks[1].attn
    dense = torch.linalg.svdvals((a.W_V[2] @ a.W_O[2]).detach())[:6]
    torch.testing.assert_close(sv[1, 2], dense, atol=1e-5, rtol=1e-4)
    frame = ci.ov_spectrum_frame(model)
    assert len(frame) == 2 * 3 * 6 and set(frame.columns) >= {"layer", "head", "index", "singular_value", "normalized"}


def test_full_qk_circuit_is_the_vocabulary_view():
    from attn_core.bilinear import vocab_scores

    for kind in ("factored", "biased", "merged"):
        model = random_model(**KINDS[kind])
        with torch.no_grad():
            torch.testing.assert_close(ci.full_qk_form(model, 1).dense, vocab_scores(model, 1), atol=1e-5, rtol=1e-5)


def test_value_weighted_attention_is_pattern_times_value_norms():
    model = random_model(attn_bias=True)
    vw = ci.value_weighted(model, TOKENS, 1, heads=[0, 2])
    _, cache = model.run_with_cache(torch.tensor([TOKENS]))
    X = cache[act_name("attn_in", 1)][0]
    a = model.blocks[1].attn
    v = X @ a.W_V[2] + a.b_V[2]
    norms = (v @ a.W_O[2]).norm(dim=-1).detach()
    torch.testing.assert_close(vw["value_norms"][1], norms)
    torch.testing.assert_close(vw["pattern"], cache[act_name("pattern", 1)][0, [0, 2]].detach())
    torch.testing.assert_close(vw["weighted"], vw["pattern"] * vw["value_norms"][:, None, :])


# --- reports ------------------------------------------------------------------------------------


def test_attribute_report_terms_and_bias_sum_to_the_score():
    model = random_model(**KINDS["grown"])
    doc = ci.attribute_report(loaded_of(model), 1, 0, 7, TOKENS)
    json.dumps(doc, allow_nan=False)
    assert doc["query"] == 7 and len(doc["keys"]) == 8
    S = own_scores(model, TOKENS)[1][0, 7]  # a head grown to d_qk = 7
    scores = [k["score"] for k in doc["keys"]]
    assert scores == sorted(scores, reverse=True)
    for k in doc["keys"]:
        assert set(k) == {"key", "token", "score", "terms", "bias"}
        assert sum(t["contribution"] for t in k["terms"]) + k["bias"] == pytest.approx(k["score"], abs=1e-9)
        assert k["score"] == pytest.approx(float(S[k["key"]]), abs=1e-5)
        assert k["token"] == str(TOKENS[k["key"]]) and len(k["terms"]) == 7
        assert set(k["terms"][0]) == {"direction", "term", "sigma", "contribution"}


def test_circuits_report_document():
    model = random_model(**KINDS["merged"])
    doc = ci.circuits_report(model, n_samples=4)
    json.dumps(doc, allow_nan=False)
    assert set(doc) == {"heads", "order", "composition", "composition_baseline"}
    assert doc["order"] == ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1", "L1H2"]
    assert [(h["layer"], h["head"]) for h in doc["heads"]] == [(l, h) for l in range(2) for h in range(3)]
    for h in doc["heads"]:
        assert -1 <= h["copying_score"] <= 1 and -1 <= h["qk_positivity"] <= 1 and len(h["ov_singular_values"]) == 6
    for part in ("composition", "composition_baseline"):
        assert set(doc[part]) == {"q", "k", "v"}
        m = doc[part]["k"]
        assert len(m) == 6 and all(len(r) == 6 for r in m)
        assert m[3][0] is None and m[0][0] is None and m[0][3] is not None


# --- property tests -----------------------------------------------------------------------------

configs = st.fixed_dictionaries(
    dict(
        n_layers=st.integers(1, 3),
        n_heads=st.integers(1, 3),
        d_model=st.sampled_from([8, 12, 16]),
        d_head=st.integers(1, 6),
        qk=st.sampled_from(["factored", "merged"]),
        attn_bias=st.booleans(),
        normalization=st.sampled_from(["layernorm", "none"]),
        positional=st.sampled_from(["learned", "none"]),
        seed=st.integers(0, 10_000),
    )
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, st.data())
def test_property_attribution_and_composition_on_random_configs(c, data):
    seed = c.pop("seed")
    model = random_model(seed=seed, d_vocab=10, n_ctx=8, **c)
    tokens = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=8))
    layer = data.draw(st.integers(0, c["n_layers"] - 1))
    head = data.draw(st.integers(0, c["n_heads"] - 1))
    query = data.draw(st.integers(0, len(tokens) - 1))
    attr = ci.attribute(loaded_of(model), tokens, layer, head, query)
    S = own_scores(model, tokens)[layer][head, query, : query + 1]
    torch.testing.assert_close(attr.scores, S, atol=1e-5, rtol=1e-5)
    comp = ci.composition(model, n_samples=2)
    for k in "qkv":
        valid = comp.scores[k][~torch.isnan(comp.scores[k])]
        assert ((valid >= 0) & (valid <= 1 + 1e-6)).all()
    pos = ci.copying_scores(model)
    assert ((pos >= -1 - 1e-6) & (pos <= 1 + 1e-6)).all()


# --- the zoo --------------------------------------------------------------------------------------


@pytest.mark.skipif(not (ZOO / "induction-2l" / "config.json").is_file(), reason="zoo model induction-2l not shipped")
def test_induction_2l_k_composition_from_the_previous_token_head_stands_out():
    from attn_core.sources import resolve

    loaded = resolve("induction-2l")
    prev = best_heads(head_detectors(loaded.model, n_samples=16))["previous_token"]
    assert (prev["layer"], prev["head"]) == (0, 3)
    comp = ci.composition(loaded.model)
    H = loaded.config.n_heads
    K = comp.scores["k"]
    for j in range(H, 2 * H):  # every layer-1 head (all four are induction heads)
        col = K[:H, j]
        assert int(col.argmax()) == 3
        assert float(comp.corrected("k")[3, j]) > 0.15  # measured 0.20..0.21 over a baseline of 0.124
        assert float(col[3]) > 1.4 * float(col.sort(descending=True).values[1])  # measured 1.69..1.77x
        # larger than any Q- or V-composition into that head
        assert float(col[3]) > float(comp.scores["q"][:H, j].max()) and float(col[3]) > float(
            comp.scores["v"][:H, j].max()
        )
    assert {e["source"] for e in comp.edges("k", top=4)} == {"L0H3"}
    # read through the previous-token head, the induction heads' QK circuit is nearly positive definite
    assert (ci.k_composed_positivity(loaded.model, (0, 3), 1) > 0.95).all()
    composed = ci.composed_qk_positivities(loaded.model, comp)
    assert {r["writer"] for r in composed} == {"L0H3"} and min(r["qk_positivity_composed"] for r in composed) > 0.95
    # and they copy what they attend to
    assert (ci.copying_scores(loaded.model)[1] > 0.95).all()


# --- figures ------------------------------------------------------------------------------------


def test_figures_build_with_their_data():
    from attn_core.figures import attribution as fa
    from attn_core.figures import circuits as fc

    model = random_model(**KINDS["biased"])
    lm = loaded_of(model)
    attr = ci.attribute(lm, TOKENS, 1, 0, 9)
    comp = ci.composition(model, n_samples=4)
    vw = ci.value_weighted(model, TOKENS, 1)
    plots = [
        fa.attribution_plot(attr, top=4, n_terms=3),
        fa.runner_up_plot(attr),
        fa.token_position_plot(ci.token_position_split(loaded_of(model), TOKENS, 1, 9)),
        fc.ov_spectrum_plot(ci.ov_spectrum_frame(model)),
        fc.ov_circuit_plot(ci.full_ov_circuit(model, 1, 0), [str(i) for i in range(12)], 1, 0, 0.5),
        fc.positivity_plot(
            ci.head_circuits(model).merge(
                pd.DataFrame(ci.composed_qk_positivities(model, comp)), on=["layer", "head"], how="left"
            )
        ),
        fc.composition_plot(comp),
        fc.composition_plot(comp, corrected=True),
        fc.head_graph_plot(comp, top=5),
        fa.value_weighted_plot(vw, [str(t) for t in TOKENS], 1, [0, 1, 2], 1),
    ]
    assert len({p.name for p in plots}) == len(plots)
    for p in plots:
        assert not p.data.empty, p.name
        p.fig.to_json()
    # the stacked bars of a key add up to its score
    data = plots[0].data
    sums = data.groupby("key")["contribution"].sum()
    for key, score in data.groupby("key")["score"].first().items():
        assert sums[key] == pytest.approx(score, abs=1e-9)
    assert len(plots[8].data) == 5
    points = [t for t in plots[5].fig.data if t.mode == "markers"]
    assert len(points) == 3  # two layers and the composed points (then the labels and the region's legend key)
    labels = [t for t in plots[5].fig.data if t.mode == "markers+text"][0]
    assert sorted(n for text in labels.text for n in text.split(", ")) == sorted(
        [str(t) for p in points for t in p.text]
    )  # every point is named once, by itself or in its cluster's label


# --- the model objects ----------------------------------------------------------------------------


def test_functions_take_either_model_object_and_refuse_others_in_one_sentence():
    model = random_model()
    one, other = model, loaded_of(model)
    assert torch.equal(ci.attribute(one, TOKENS, 0, 0, 1).terms, ci.attribute(other, TOKENS, 0, 0, 1).terms)
    assert torch.equal(ci.copying_scores(one), ci.copying_scores(other))
    assert ci.circuits_report(one, n_samples=4) == ci.circuits_report(other, n_samples=4)
    with pytest.raises(TypeError, match="token_position_split takes a model"):
        ci.token_position_split("model", TOKENS, 0, 1)
    with pytest.raises(TypeError, match="composition takes a model"):
        ci.composition(None)
