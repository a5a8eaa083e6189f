"""attn_core.grow: every formula against a direct computation -- Eckart-Young in both
bases, the batch least squares against an explicit Kronecker lstsq, dL/dS against finite
differences and the weight gradient, the function kept at step 0 (and through save/load), the
first-order prediction, and growth beating random and zero growth on a head too narrow for its task."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import checkpoint
from attn_core import grow as G
from attn_core.model import ModelConfig, Transformer
from attn_core.sources import resolve
from attn_core.tasks import Batch, get_task
from attn_core.training.config import TrainConfig
from attn_core.training.trainer import init_model, train

TASK = get_task("reverse")
DT = torch.float64


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# Not conftest's make_tiny_model: every weight from N(0, 0.4) by a generator, LayerNorm gains near 1.
def random_model(attn_bias: bool = False, n_layers: int = 2, d_head: int = 2, seed: int = 0, qk: str = "factored"):
    """A small model with O(1) weights, so that scores and gradients are far from zero."""
    cfg = ModelConfig(
        n_layers=n_layers,
        n_heads=2,
        d_model=10,
        d_head=d_head,
        d_vocab=TASK.d_vocab,
        n_ctx=TASK.n_ctx,
        attn_bias=attn_bias,
        qk=qk,
    )
    model = Transformer(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.4, generator=g)
            if name.endswith(".w"):  # LayerNorm gains around 1
                p.add_(1.0)
    return model.eval()


def causal(T):
    return torch.tril(torch.ones(T, T, dtype=torch.bool))


def rows_in_subspace(n, T, d, rank, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, T, rank, generator=g, dtype=DT) @ torch.randn(rank, d, generator=g, dtype=DT)


# --- Eckart-Young -------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 7), n=st.integers(1, 7), k=st.integers(1, 9), seed=st.integers(0, 10_000))
def test_low_rank_residual_is_the_discarded_energy(m, n, k, seed):
    Y = torch.randn(m, n, generator=torch.Generator().manual_seed(seed), dtype=DT)
    left, sigma, right = G.low_rank(Y, k)
    assert left.shape == (m, k) and right.shape == (n, k)
    Yk = left @ right.T
    assert torch.linalg.matrix_rank(Yk) <= k
    assert math.isclose((Y - Yk).pow(2).sum().item(), sigma[k:].pow(2).sum().item(), rel_tol=1e-9, abs_tol=1e-12)
    # and no other rank-k matrix does better (a random one, and a perturbation of the optimum)
    g = torch.Generator().manual_seed(seed + 1)
    other = torch.randn(m, min(k, m, n), generator=g, dtype=DT) @ torch.randn(min(k, m, n), n, generator=g, dtype=DT)
    assert (Y - other).pow(2).sum() >= (Y - Yk).pow(2).sum() - 1e-12
    assert (Y - Yk * 1.01).pow(2).sum() >= (Y - Yk).pow(2).sum() - 1e-12


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 4),
    T=st.integers(2, 6),
    d=st.integers(2, 6),
    deficit=st.integers(0, 2),
    k=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_whitened_discarded_energy_is_the_all_pairs_score_residual(n, T, d, deficit, k, seed):
    """For Y on the batch's span, (1/N^2) ||X_s (Z* - Z_k) X_c^T||_F^2 = sum of the discarded
    sigma_i^2 of Y = R_q Z* R_k^T; with a part off the span it is a lower bound."""
    X = rows_in_subspace(n, T, d, max(1, d - deficit), seed)
    rows = X.reshape(-1, d)
    centred = rows - rows.mean(0)
    q, kb = G.Basis.of_rows(rows, centre=False), G.Basis.of_rows(rows, centre=True)
    assert torch.allclose(q.metric @ q.lift, torch.eye(d, dtype=DT), atol=1e-6)
    g = torch.Generator().manual_seed(seed + 7)
    on_span = torch.zeros(d, d, dtype=DT)
    on_span[: q.rank, : kb.rank] = torch.randn(q.rank, kb.rank, generator=g, dtype=DT)
    anywhere = q.metric @ torch.randn(d, d, generator=g, dtype=DT) @ kb.metric.T  # a form's coordinates
    for Y, exact in ((on_span, True), (anywhere, False)):
        Z_star = q.lift @ Y @ kb.lift.T
        assert torch.allclose(q.metric @ Z_star @ kb.metric.T, Y, atol=1e-8 * (1 + Y.abs().max()))
        left, sigma, right = G.low_rank(Y, k)
        Z_k = q.lift @ left @ right.T @ kb.lift.T
        all_pairs = (rows @ (Z_star - Z_k) @ centred.T).pow(2).sum().item() / rows.shape[0] ** 2
        discarded = sigma[k:].pow(2).sum().item()
        if exact:
            assert math.isclose(all_pairs, discarded, rel_tol=1e-7, abs_tol=1e-10)
        else:
            assert all_pairs <= discarded * (1 + 1e-7) + 1e-10


def test_raw_basis_residual_is_the_z_space_residual():
    model = random_model()
    growth = G.Growth(model, TASK, TASK.sample(6, 1), layer=1, head=0, add=1, basis="raw")
    step = growth.step(0.3 * growth.eta_ref)
    Z_star = growth.B - step.eta * growth.fit.Z
    assert math.isclose((Z_star - step.Z).pow(2).sum().item(), step.discarded_energy, rel_tol=1e-8)
    assert torch.linalg.matrix_rank(step.Z) <= growth.kept


# --- the batch least squares -------------------------------------------------------------------------


def test_single_sequence_fit_is_the_seed_closed_form():
    """Unmasked, uncentred, X of full column rank: Z* = X^+ T (X^+)^T."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1, 9, 4, generator=g, dtype=DT)
    target = torch.randn(1, 9, 9, generator=g, dtype=DT)
    fit = G.fit_scores(X, target, torch.ones(9, 9, dtype=torch.bool), centre=False)
    Xp = torch.linalg.pinv(X[0])
    assert torch.allclose(fit.Z, Xp @ target[0] @ Xp.T, rtol=1e-6, atol=1e-9)


def kron_features(X, mask, centre):
    """The explicit least-squares problem: one row x_i (x) x_j per visible (b, i, j), centred per
    query row when ``centre`` (then the target too)."""
    n, T, d = X.shape
    feats, rows = [], []
    for b in range(n):
        for i in range(T):
            vis = mask[i].nonzero().flatten().tolist()
            block = torch.stack([torch.kron(X[b, i], X[b, j]) for j in vis])
            if centre:
                block = block - block.mean(0)
            feats.append(block)
            rows.append((b, i, vis))
    return torch.cat(feats), rows


def kron_target(target, rows, centre):
    out = []
    for b, i, vis in rows:
        t = target[b, i, vis]
        out.append(t - t.mean() if centre else t)
    return torch.cat(out)


@pytest.mark.parametrize("centre", [False, True])
def test_batch_fit_equals_direct_lstsq(centre):
    g = torch.Generator().manual_seed(3)
    n, T, d = 4, 6, 3
    X = torch.randn(n, T, d, generator=g, dtype=DT)
    target = torch.randn(n, T, T, generator=g, dtype=DT)
    mask = causal(T)
    Phi, rows = kron_features(X, mask, centre)
    assert torch.linalg.matrix_rank(Phi) == d * d  # full column rank: the solution is unique
    z = torch.linalg.lstsq(Phi, kron_target(target, rows, centre)[:, None]).solution[:, 0]
    fit = G.fit_scores(X, target, mask, centre=centre)
    assert torch.allclose(fit.Z, z.reshape(d, d), rtol=1e-6, atol=1e-9)


def test_rank_deficient_rows_give_the_minimum_norm_solution():
    """X spans 2 of 4 dimensions: the fit equals pinv of the explicit problem (no component of Z
    outside the span of the rows)."""
    X = rows_in_subspace(5, 6, 4, 2, seed=5)
    target = torch.randn(5, 6, 6, generator=torch.Generator().manual_seed(6), dtype=DT)
    mask = causal(6)
    Phi, rows = kron_features(X, mask, False)
    z = torch.linalg.pinv(Phi, rtol=1e-10) @ kron_target(target, rows, False)
    fit = G.fit_scores(X, target, mask, centre=False)
    assert fit.q.rank == 2
    assert torch.allclose(fit.Z, z.reshape(4, 4), rtol=1e-6, atol=1e-8)


def test_solve_psd_on_a_singular_system_is_the_pseudo_inverse_solution():
    g = torch.Generator().manual_seed(2)
    A = torch.randn(30, 12, generator=g, dtype=DT) @ torch.randn(12, 40, generator=g, dtype=DT)  # rank 12 of 40
    H = A.T @ A
    rhs = A.T @ torch.randn(30, generator=g, dtype=DT)
    y = G.solve_psd(H, rhs)
    expected = torch.linalg.pinv(H, hermitian=True, rtol=1e-10) @ rhs
    assert (y - expected).norm() <= 1e-6 * expected.norm()


def test_fit_ignores_masked_entries_and_per_query_constants():
    g = torch.Generator().manual_seed(4)
    X = torch.randn(3, 5, 3, generator=g, dtype=DT)
    target = torch.randn(3, 5, 5, generator=g, dtype=DT)
    mask = causal(5)
    shifted = target + torch.randn(3, 5, 1, generator=g, dtype=DT) + 100.0 * (~mask)
    a, b = G.fit_scores(X, target, mask), G.fit_scores(X, shifted, mask)
    assert torch.allclose(a.Z, b.Z, atol=1e-9)
    # without centring the per-query constants do matter
    assert not torch.allclose(
        G.fit_scores(X, target, mask, centre=False).Z, G.fit_scores(X, shifted, mask, centre=False).Z, atol=1e-3
    )


# --- the gradient w.r.t. the scores --------------------------------------------------------------------


def test_score_gradient_matches_finite_differences():
    model = random_model()
    hb = G.head_batch(model, TASK, TASK.sample(4, 2), layer=1, head=1)
    n, T, _ = hb.G.shape
    assert torch.all(hb.G[:, ~hb.mask] == 0)
    assert hb.G.sum(-1).abs().max() < 1e-12  # softmax is shift invariant along a row
    eps = 1e-5
    for b, i, j in [(0, 3, 0), (1, 10, 10), (2, 15, 7), (3, 8, 2)]:
        E = torch.zeros(n, T, T, dtype=DT)
        E[b, i, j] = eps
        fd = (hb.loss_with(E) - hb.loss_with(-E)) / (2 * eps)
        assert math.isclose(fd, hb.G[b, i, j].item(), rel_tol=1e-5, abs_tol=1e-10), (b, i, j)
    assert hb.G.abs().max() > 1e-4  # the test compares something


def test_score_gradient_has_the_scale_of_the_weight_gradient():
    """dL/dW_Q = sum_b X^T G X W_K / sqrt(d_qk): G is the gradient w.r.t. the scaled scores."""
    model = random_model()
    layer, head = 1, 0
    hb = G.head_batch(model, TASK, TASK.sample(4, 3), layer, head)
    m = hb.model
    attn = m.blocks[layer].attn
    attn.W_Q.requires_grad_(True)
    loss = TASK.loss(m(hb.batch.tokens), hb.batch)
    (grad,) = torch.autograd.grad(loss, attn.W_Q)
    expected = (
        torch.einsum("bid,bij,bje->de", hb.X, hb.G, hb.X) @ attn.W_K[head].detach() * attn.qk_scale[0, head, 0, 0]
    )
    assert torch.allclose(grad[head], expected, rtol=1e-8, atol=1e-12)


# --- growth steps ------------------------------------------------------------------------------------


@pytest.mark.parametrize("attn_bias, basis", [(False, "whitened"), (True, "whitened"), (False, "raw")])
def test_step_zero_keeps_the_function_and_survives_save_load(attn_bias, basis, tmp_path):
    model = random_model(attn_bias=attn_bias)
    growth = G.Growth(model, TASK, TASK.sample(8, 1), layer=1, head=0, add=3, basis=basis)
    step = growth.step(0.0)
    assert abs(step.predicted_decrease) < 1e-10
    grown = growth.grown_model(step)
    assert grown.cfg.d_qk == [[2, 2], [5, 2]] and grown.cfg.head_d_qk(1, 0) == 5
    held_out = TASK.sample(16, 9, split="test").tokens
    random_tokens = torch.randint(0, TASK.d_vocab, (8, TASK.n_ctx), generator=torch.Generator().manual_seed(1))
    for tokens in (held_out, random_tokens):
        with torch.no_grad():
            assert torch.allclose(grown(tokens), model(tokens), atol=2e-5), "the function changed at step 0"
    checkpoint.save(grown, tmp_path / "grown", card={"task": "reverse"})
    loaded = resolve(tmp_path / "grown")
    assert loaded.config.d_qk == grown.cfg.d_qk
    with torch.no_grad():
        assert torch.equal(loaded.model(held_out), grown(held_out))
    # a step that is not 0 does change the function (so the comparison above can fail)
    moved = growth.grown_model(growth.step(0.5 * growth.eta_ref))
    with torch.no_grad():
        assert not torch.allclose(moved(held_out), model(held_out), atol=1e-3)


def test_step_zero_keeps_the_function_off_the_batch_span():
    """A fitting batch of two tokens at four positions spans fewer directions than d_model: the
    grown head still agrees with the old one on inputs the batch never showed."""
    model = random_model(attn_bias=True)
    tokens = torch.randint(0, 2, (6, 4), generator=torch.Generator().manual_seed(0))
    narrow = Batch(tokens, tokens.roll(1, 1), torch.ones_like(tokens, dtype=torch.bool))
    growth = G.Growth(model, TASK, narrow, layer=0, head=0, add=2)
    assert growth.fit.q.rank < model.cfg.d_model + 1
    grown = growth.grown_model(growth.step(0.0))
    held_out = TASK.sample(16, 9, split="test").tokens
    with torch.no_grad():
        assert torch.allclose(grown(held_out), model(held_out), atol=2e-5)


def test_widen_keeps_the_scores_and_grows_twice():
    model = random_model(attn_bias=True)
    tokens = TASK.sample(8, 4, split="test").tokens
    zero = G.widen(model, 0, 1, 2, "zero")
    with torch.no_grad():
        assert torch.allclose(zero(tokens), model(tokens), atol=1e-5)
    again = G.widen(zero, 0, 1, 3, "random", std=0.5, seed=1)  # a head that is already wider
    assert again.cfg.d_qk == [[2, 7], [2, 2]]
    with torch.no_grad():
        assert not torch.allclose(again(tokens), model(tokens), atol=1e-4)


def test_first_order_prediction_matches_small_steps():
    model = random_model()
    growth = G.Growth(model, TASK, TASK.sample(8, 5), layer=1, head=1, add=2)
    for rel in (1e-4, 1e-3):
        step = growth.step(rel * growth.eta_ref)
        measured = growth.loss - growth.loss_at(step)
        assert step.predicted_decrease > 0
        assert 0.97 < measured / step.predicted_decrease < 1.03, rel


def test_grown_model_loss_equals_the_probed_loss():
    """loss_at runs the original with an offset on the head's scores; the built model agrees."""
    model = random_model(attn_bias=True)
    batch = TASK.sample(8, 6)
    growth = G.Growth(model, TASK, batch, layer=0, head=1, add=2)
    assert torch.allclose(G.scores_of(growth.hb.X, growth.B), growth.hb.S, atol=1e-10)  # S = X' B' X'^T
    step = growth.step(0.05 * growth.eta_ref)
    grown = growth.grown_model(step).double()
    with torch.no_grad():
        direct = TASK.loss(grown(batch.tokens), batch).item()
    assert math.isclose(direct, growth.loss_at(step), rel_tol=1e-5)


def test_residual_splits_and_is_bounded_by_the_discarded_energy():
    model = random_model(d_head=1)
    growth = G.Growth(model, TASK, TASK.sample(8, 7), layer=1, head=0, add=1)
    step = growth.step(0.2 * growth.eta_ref)
    assert step.discarded_energy > 1e-6  # the truncation is active
    assert math.isclose(step.residual, step.fit_residual + step.truncation_residual, rel_tol=1e-6)
    assert growth.n_visible * step.truncation_residual <= growth.n_rows**2 * step.discarded_energy * (1 + 1e-9)
    Y_star = growth.B_hat - step.eta * growth.fit.Y_full
    assert math.isclose(
        step.discarded_energy, torch.linalg.svdvals(Y_star)[growth.kept :].pow(2).sum().item(), rel_tol=1e-9
    )
    assert torch.allclose(step.singular_values, torch.linalg.svdvals(Y_star))


def test_line_search_takes_the_best_admissible_step():
    model = random_model()
    growth = G.Growth(model, TASK, TASK.sample(8, 8), layer=1, head=1, add=2, val_batch=TASK.sample(8, 9))
    step, table = growth.line_search(grid=12)
    assert len(table) == 13 and table["eta"].iloc[0] == 0.0
    admissible = table[table["armijo"]]
    assert step.eta == admissible.loc[admissible["val_loss"].idxmin(), "eta"]
    assert step.eta > 0  # a random model has loss to lose
    assert growth.val_loss_at(step) < growth.val_loss_at(growth.step(0.0))


# --- the whole comparison on a head too narrow for its task ------------------------------------------------


@pytest.fixture(scope="module")
def narrow_result():
    """Reverse needs a positional attention pattern that a rank-1 head cannot draw: one layer,
    one head, d_head 1, trained until it stalls, then grown by p = 3."""
    cfg = ModelConfig(n_layers=1, n_heads=1, d_model=24, d_head=1, d_vocab=TASK.d_vocab, n_ctx=TASK.n_ctx)
    model, _ = train(
        init_model(cfg, 0),
        TASK,
        TrainConfig(steps=250, batch_size=64, lr=3e-3, warmup_steps=20, eval_every=250, eval_samples=64, device="cpu"),
    )
    return G.grow(model, TASK, G.GrowConfig(add=3, steps=40, eval_samples=256, eval_every=20, seed=0))


def test_growth_beats_random_and_zero_growth_on_a_narrow_head(narrow_result):
    r = narrow_result
    s = r.summary()
    print({k: s[k] for k in ("loss_before", "loss_after_step", "loss_after_finetune")}, s["baselines"])
    assert s["loss_after_step"] < s["loss_before"] - 1e-3
    for base in ("random", "zero"):
        assert s["loss_after_step"] < s["baselines"][base]["loss_after_init"] - 1e-3
        assert s["loss_after_finetune"] < s["baselines"][base]["loss_after_finetune"] - 1e-2
    assert s["predicted_decrease"] > 0 and s["measured_decrease"] > 0
    assert s["d_k_new"] == 4 and len(s["singular_values_Z"]) == 24  # d_model: the complete whitened basis
    curves = r.curves
    assert set(curves["method"]) == set(G.METHODS) and curves["step"].max() == 40
    json.dumps(s)  # the CLI's document


def test_zero_growth_sits_at_a_saddle(narrow_result):
    tuned = narrow_result.models["zero_finetuned"].blocks[0].attn
    assert torch.all(tuned.W_Q[0, :, 1:] == 0) and torch.all(tuned.W_K[0, :, 1:] == 0)
    grown = narrow_result.models["grown_finetuned"].blocks[0].attn
    assert grown.W_Q[0, :, 1:].abs().sum() > 0


# --- bad input --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(layer=2), "layer 2 is outside 0..1"),
        (dict(head=5), "outside 0..1"),
        (dict(add=0), "add (p) must be 1..8"),
        (dict(add=9), "add (p) must be 1..8"),
        (dict(basis="diag"), "basis must be one of"),
    ],
)
def test_growth_rejects_bad_input(kwargs, msg):
    args = dict(layer=0, head=0, add=1, basis="whitened") | kwargs
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        G.Growth(random_model(), TASK, TASK.sample(2, 0), **args)


def test_merged_heads_and_bad_settings_are_refused():
    with pytest.raises(ValueError, match="merged heads"):
        G.Growth(random_model(qk="merged"), TASK, TASK.sample(2, 0), 0, 0, 1)
    for kwargs, msg in [
        (dict(batch=0), "batch must be"),
        (dict(steps=-1), "steps must be"),
        (dict(lr=0.0), "lr must be"),
        (dict(damping=2.0), "damping must be"),
        (dict(add=1.5), "add must be an integer"),
    ]:
        with pytest.raises(ValueError, match=msg):
            G.GrowConfig(**kwargs)
    with pytest.raises(ValueError, match="does not fit task"):
        G.grow(random_model(), get_task("sort"), G.GrowConfig())


# --- the CLI ------------------------------------------------------------------------------------------------


def cli(*args):
    """In-process (tests/test_cli.py runs the command as a subprocess; a second interpreter here
    would cost more than the growth itself on a shared CPU)."""
    from typer.testing import CliRunner

    from attn_core.cli import app

    return CliRunner().invoke(app, ["grow", *args])


def test_cli_grow_json_and_out(tmp_path):
    model = random_model(n_layers=1)
    checkpoint.save(model, tmp_path / "tiny", card={"task": "reverse"})
    out = tmp_path / "grown"
    proc = cli(
        str(tmp_path / "tiny"),
        "--add",
        "2",
        "--batch",
        "6",
        "--steps",
        "4",
        "--eval-samples",
        "32",
        "--out",
        str(out),
        "--json",
    )
    assert proc.exit_code == 0, proc.output
    doc = json.loads(proc.stdout)
    for key in (
        "singular_values_Z",
        "residual",
        "discarded_energy",
        "predicted_decrease",
        "loss_before",
        "loss_after_step",
        "loss_after_finetune",
    ):
        assert isinstance(doc[key], (float, list)), key
    assert set(doc["baselines"]) == {"random", "zero"}
    assert set(doc["baselines"]["zero"]) >= {"loss_after_init", "loss_after_finetune"}
    loaded = resolve(out)
    assert loaded.config.d_qk == [[4, 2]] and loaded.card.details["grow"]["d_k_new"] == 4
    bad = cli(str(tmp_path / "tiny"), "--add", "99", "--json")
    assert bad.exit_code == 2 and "add (p) must be 1..8" in bad.stderr and json.loads(bad.stdout)["kind"] == "invalid"
    again = cli(str(tmp_path / "tiny"), "--add", "1", "--out", str(out))
    assert again.exit_code == 2 and "already exists" in again.stderr
