"""attn_core.qk: merged and factored heads compute the same thing when they
should, the parameter formulas, the nuclear-norm identity behind "weight decay on both factors",
rank truncation, the per-group weight decay, and a short seeded comparison end to end."""

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import qk as Q
from attn_core.hooks import act_name
from attn_core.model import ModelConfig, Transformer
from attn_core.qk.result import _finite
from attn_core.runs import RunStore
from attn_core.tasks import get_task
from attn_core.training.config import TrainConfig
from attn_core.training.trainer import Trainer
from tests.conftest import make_tiny_model


def n_params_formula(cfg: ModelConfig) -> int:
    """The parameter count of a model from its config alone, written out from first principles
    (an independent check of the model's own count). With d, V, T, h, d_head, d_mlp as in the config:

        embeddings   V d (+ T d learned positions);  unembedding  d V + V;  final LayerNorm 2d
        per layer    ln1 2d + h qk_params_per_head + h 2 d d_head (W_V, W_O) (+ h d_head + d biases)
                     (+ ln2 2d + 2 d d_mlp + d_mlp + d with an MLP)

    LayerNorms count 0 with ``normalization = "none"``. Factored layers store W_Q/W_K at the layer's
    widest d_qk (narrower heads are zero-padded), so that width is what is counted."""
    d, h = cfg.d_model, cfg.n_heads
    ln = 2 * d if cfg.normalization == "layernorm" else 0
    total = cfg.d_vocab * d + (cfg.n_ctx * d if cfg.positional == "learned" else 0) + d * cfg.d_vocab + cfg.d_vocab + ln
    for layer in range(cfg.n_layers):
        width = cfg.qk_width(layer) if cfg.qk == "factored" else None
        total += ln + h * Q.qk_params_per_head(d, cfg.qk, width, cfg.attn_bias) + 2 * h * d * cfg.d_head
        if cfg.attn_bias:
            total += h * cfg.d_head + d
        if cfg.d_mlp > 0:
            total += ln + 2 * d * cfg.d_mlp + cfg.d_mlp + d
    return total


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These models are tiny: one thread is as fast as two, and far faster on a busy machine
    (oversubscribed intra-op threads spin); restored afterwards for the other test files."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# Not conftest's make_tiny_model: weights drawn in ``dtype`` (float64) from their own generator.
def _model(seed=0, dtype=torch.float64, **kw) -> Transformer:
    base = dict(n_layers=2, n_heads=2, d_model=12, d_head=4, d_vocab=11, n_ctx=9)
    model = Transformer(ModelConfig(**{**base, **kw})).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # larger than the GPT-2 init, so that differences would show
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype) * 0.5)
        if model.cfg.d_qk is not None:
            model.zero_qk_padding()
    return model


def _tokens(cfg, seed=1, batch=3):
    return torch.randint(0, cfg.d_vocab, (batch, cfg.n_ctx), generator=torch.Generator().manual_seed(seed))


configs = st.fixed_dictionaries(
    {
        "n_layers": st.integers(1, 2),
        "n_heads": st.integers(1, 3),
        "d_model": st.integers(2, 10),
        "d_head": st.integers(1, 5),
        "d_mlp": st.sampled_from([0, 7]),
        "normalization": st.sampled_from(["layernorm", "none"]),
        "positional": st.sampled_from(["learned", "none"]),
    }
)


# --- merged == factored ----------------------------------------------------------------------------


def test_merged_equals_factored_when_W_QK_is_W_Q_W_K_T_over_sqrt_d_head():
    fact = _model(d_head=4)
    merged = Transformer(ModelConfig(**{**fact.cfg.to_dict(), "qk": "merged"})).double()
    state = {k: v for k, v in fact.state_dict().items() if not k.endswith(("W_Q", "W_K"))}
    for l, block in enumerate(fact.blocks):  # written out here, independently of the library
        state[f"blocks.{l}.attn.W_QK"] = torch.einsum("hde,hfe->hdf", block.attn.W_Q, block.attn.W_K) / math.sqrt(4)
    merged.load_state_dict(state)
    x = _tokens(fact.cfg)
    lf, cf = fact.run_with_cache(x)
    lm, cm = merged.run_with_cache(x)
    torch.testing.assert_close(lm, lf, rtol=1e-10, atol=1e-10)
    for l in range(2):
        torch.testing.assert_close(
            cm[act_name("attn_scores", l)], cf[act_name("attn_scores", l)], rtol=1e-10, atol=1e-10
        )
    # and the library's converter gives exactly that model
    torch.testing.assert_close(Q.merged_from_factored(fact)(x), lf, rtol=1e-10, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(configs, st.data())
def test_merged_from_factored_keeps_every_logit(kw, data):
    d_qk = [[data.draw(st.integers(1, 6)) for _ in range(kw["n_heads"])] for _ in range(kw["n_layers"])]
    fact = _model(seed=data.draw(st.integers(0, 99)), d_vocab=7, n_ctx=5, d_qk=d_qk, **kw)
    merged = Q.merged_from_factored(fact)
    assert merged.cfg.qk == "merged" and merged.cfg.d_qk is None
    x = _tokens(fact.cfg)
    torch.testing.assert_close(merged(x), fact(x), rtol=1e-9, atol=1e-9)


def test_a_model_with_query_key_biases_cannot_be_merged():
    with pytest.raises(ValueError, match="biases"):
        Q.merged_from_factored(_model(attn_bias=True))
    with pytest.raises(ValueError, match="already merged"):
        Q.merged_from_factored(_model(qk="merged"))


@pytest.mark.parametrize("rank", [1, 3, 12])
def test_factored_from_merged_is_exact_when_rank_fits(rank):
    merged = _model(qk="merged")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for block in merged.blocks:  # W_QK of rank exactly `rank`
            a = torch.randn(2, 12, rank, generator=g, dtype=torch.float64)
            b = torch.randn(2, 12, rank, generator=g, dtype=torch.float64)
            block.attn.W_QK.copy_(a @ b.transpose(-1, -2) / 4)
    fact = Q.factored_from_merged(merged, rank)
    assert fact.cfg.d_qk == [[rank, rank], [rank, rank]]
    x = _tokens(merged.cfg)
    torch.testing.assert_close(fact(x), merged(x), rtol=1e-8, atol=1e-8)
    # balanced: (||W_Q||^2 + ||W_K||^2) / 2 = sqrt(d_qk) ||B||_* for B = W_Q W_K^T / sqrt(d_qk)
    for fb, mb in zip(fact.blocks, merged.blocks):
        half = (fb.attn.W_Q.pow(2).sum((1, 2)) + fb.attn.W_K.pow(2).sum((1, 2))) / 2
        nuc = torch.linalg.matrix_norm(mb.attn.W_QK, ord="nuc")
        torch.testing.assert_close(half, math.sqrt(rank) * nuc, rtol=1e-9, atol=1e-9)


def test_factored_from_merged_checks_its_width():
    with pytest.raises(ValueError, match=r"1\.\.12"):
        Q.factored_from_merged(_model(qk="merged"), 13)
    with pytest.raises(ValueError, match="not merged"):
        Q.factored_from_merged(_model(), 2)


# --- the nuclear-norm identity ----------------------------------------------------------------------

matrices = st.tuples(st.integers(1, 7), st.integers(1, 7), st.integers(0, 10_000))


@settings(max_examples=40, deadline=None)
@given(matrices)
def test_balanced_factors_attain_the_nuclear_norm(shape):
    m, n, seed = shape
    M = torch.randn(m, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    W_Q, W_K = Q.balanced_factors(M)
    torch.testing.assert_close(W_Q @ W_K.T, M, rtol=1e-10, atol=1e-10)
    half = (W_Q.pow(2).sum() + W_K.pow(2).sum()) / 2
    torch.testing.assert_close(half, torch.linalg.matrix_norm(M, ord="nuc"), rtol=1e-10, atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(matrices, st.integers(1, 9))
def test_no_factorization_has_smaller_weight_norm(shape, width):
    m, n, seed = shape
    g = torch.Generator().manual_seed(seed)
    A, C = (
        torch.randn(m, width, generator=g, dtype=torch.float64),
        torch.randn(n, width, generator=g, dtype=torch.float64),
    )
    M = A @ C.T
    nuc = torch.linalg.matrix_norm(M, ord="nuc")
    # every factorization M = A C^T, rebalanced by any invertible G, costs at least ||M||_*
    G = torch.randn(width, width, generator=g, dtype=torch.float64) + 3 * torch.eye(width, dtype=torch.float64)
    for W_Q, W_K in ((A, C), (A @ G, C @ torch.linalg.inv(G).T)):
        torch.testing.assert_close(W_Q @ W_K.T, M, rtol=1e-8, atol=1e-8)
        assert (W_Q.pow(2).sum() + W_K.pow(2).sum()) / 2 >= nuc * (1 - 1e-9)


def test_balanced_factors_truncate_to_the_best_rank_r_approximation():
    M = torch.randn(6, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    s = torch.linalg.svdvals(M)
    for r in range(1, 6):
        W_Q, W_K = Q.balanced_factors(M, r)
        assert W_Q.shape == (6, r) and W_K.shape == (5, r)
        err = torch.linalg.matrix_norm(M - W_Q @ W_K.T)
        torch.testing.assert_close(err, s[r:].pow(2).sum().sqrt(), rtol=1e-9, atol=1e-9)  # Eckart-Young
    with pytest.raises(ValueError, match=r"1\.\.5"):
        Q.balanced_factors(M, 6)


@pytest.mark.parametrize("qk", ["factored", "merged"])
def test_truncated_caps_the_rank_of_every_head(qk):
    model = _model(qk=qk)
    for r in (1, 2, 5):
        cut = Q.truncated(model, r)
        ranks = torch.linalg.matrix_rank(torch.stack([b.attn.W_QK for b in cut.blocks]), rtol=1e-9)
        assert int(ranks.max()) <= r
    full = Q.truncated(model, 12)
    x = _tokens(model.cfg)
    torch.testing.assert_close(full(x), model(x), rtol=1e-8, atol=1e-8)
    with pytest.raises(ValueError, match=r"1\.\.12"):
        Q.truncated(model, 0)


# --- parameter counts --------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(configs, st.booleans(), st.sampled_from(["factored", "merged", "d_qk"]), st.data())
def test_parameter_formula_matches_the_model(kw, bias, qk, data):
    extra = {"attn_bias": bias and qk != "merged", "qk": "merged" if qk == "merged" else "factored"}
    if qk == "d_qk":
        extra["d_qk"] = [[data.draw(st.integers(1, 6)) for _ in range(kw["n_heads"])] for _ in range(kw["n_layers"])]
    cfg = ModelConfig(d_vocab=7, n_ctx=5, **kw, **extra)
    assert n_params_formula(cfg) == Transformer(cfg).n_params()


@pytest.mark.parametrize("d_qk", [1, 2, 4, 16, 32])
@pytest.mark.parametrize("bias", [False, True])
def test_qk_parameters_per_head(d_qk, bias):
    d, L, H = 32, 2, 3
    base = dict(n_layers=L, n_heads=H, d_model=d, d_head=8, d_vocab=10, n_ctx=6)
    fact = Transformer(ModelConfig(**base, attn_bias=bias, d_qk=[[d_qk] * H] * L))
    merged = Transformer(ModelConfig(**base, attn_bias=bias, qk="merged"))
    # merged heads drop W_Q, W_K (and b_Q, b_K) and add W_QK
    assert fact.n_params() - merged.n_params() == L * H * (2 * d * d_qk + 2 * d_qk * bias - d * d)
    assert Q.qk_params_per_head(d, "factored", d_qk, bias) == 2 * d * d_qk + 2 * d_qk * bias
    assert Q.qk_params_per_head(d, "merged") == d * d == merged.blocks[0].attn.W_QK[0].numel()
    with pytest.raises(ValueError, match="d_qk"):
        Q.qk_params_per_head(d, "factored")


# --- weight decay per group ---------------------------------------------------------------------------


def test_qk_weight_decay_is_its_own_group_and_decays_W_QK():
    task = get_task("induction")
    recipe = TrainConfig(
        steps=3, batch_size=4, lr=0.01, weight_decay=0.1, warmup_steps=0, min_lr_ratio=1.0, device="cpu"
    )
    trainers = {}
    for wd in (0.0, 5.0):
        trainers[wd] = Trainer(make_tiny_model("induction", d_model=8, d_head=4, qk="merged"), task, recipe)
        Q.set_qk_weight_decay(trainers[wd], wd)
    groups = trainers[5.0].optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.1, 5.0, 0.0]
    W_QK = trainers[5.0].model.blocks[0].attn.W_QK
    assert len(groups[1]["params"]) == 1 and groups[1]["params"][0] is W_QK
    assert sum(p.numel() for g in groups for p in g["params"]) == trainers[5.0].model.n_params()
    W0 = W_QK.detach().clone()
    for t in trainers.values():
        t.step()
    # same data and gradient: the decoupled decay is the only difference, lr * wd * W0, on W_QK alone
    a, b = (dict(t.model.named_parameters()) for t in (trainers[5.0], trainers[0.0]))
    torch.testing.assert_close(b["blocks.0.attn.W_QK"] - a["blocks.0.attn.W_QK"], 0.01 * 5.0 * W0)
    for name in a:
        if name != "blocks.0.attn.W_QK":
            torch.testing.assert_close(a[name], b[name])
    with pytest.raises(ValueError, match="before the first step"):
        Q.set_qk_weight_decay(trainers[5.0], 1.0)


# --- settings ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"task": "nope"}, "unknown task"),
        ({"steps": 0}, "steps must be 1.."),
        ({"seeds": 0}, "seeds must be 1.."),
        ({"d_qks": (0,)}, r"outside 1\.\.32"),
        ({"d_qks": (2, 2)}, "repeat"),
        ({"merged_kinds": ("merged + dropout",)}, "not one of"),
        ({"d_qks": (), "merged_kinds": ()}, "no variant"),
        ({"nuclear": -1.0}, r"nuclear must be in \[0, 100\]"),
        ({"nuclear": 0.0}, "must be > 0"),
        ({"qk_weight_decay": float("nan")}, "qk_weight_decay"),
        ({"lr": 0.0}, "lr"),
        ({"device": "tpu"}, "device"),
        ({"n_heads": 0}, "n_heads"),
        ({"threads": -1}, r"threads must be 0..256"),
    ],
)
def test_bad_settings_are_clear_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        Q.CompareConfig(**kw)


def test_variants_and_command():
    cfg = Q.CompareConfig(d_qks=(16, 2), nuclear=0.02)
    names = [v.name for v in cfg.variants()]
    assert names == ["factored d_qk=2", "factored d_qk=16", "merged", "merged + wd", "merged + nuclear"]
    assert [v.kind for v in cfg.variants()] == ["factored", "factored", "merged", "merged + wd", "merged + nuclear"]
    base = cfg.base_model_config()
    assert cfg.variants()[0].model_config(base).d_qk == [[2, 2], [2, 2]]
    assert cfg.variants()[0].model_config(base).d_head == base.d_head  # V/O width unchanged
    assert cfg.command() == "attn-lab compare-qk --task induction --steps 400 --seeds 3 --nuclear 0.02 --d-qk 16,2"
    assert Q.CompareConfig.from_dict(cfg.to_dict()) == cfg


# --- a short seeded comparison, end to end -------------------------------------------------------------

TINY = dict(
    task="induction",
    steps=6,
    seeds=2,
    d_qks=(1,),
    d_model=8,
    d_head=4,
    n_heads=2,
    batch_size=8,
    eval_every=3,
    eval_samples=16,
    measure_samples=16,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    store = RunStore(tmp_path_factory.mktemp("runs"))
    seen = []
    result = Q.compare(Q.CompareConfig(**TINY), store=store, progress=lambda f, msg: seen.append((f, msg)))
    return result, store, seen


def test_short_comparison_runs_end_to_end(tiny):
    result, store, seen = tiny
    names = ["factored d_qk=1", "merged", "merged + wd", "merged + nuclear"]
    rows = result.summary()
    assert [r["name"] for r in rows] == names
    cfg = Q.CompareConfig(**TINY)
    for r, v in zip(rows, cfg.variants()):
        assert r["seeds"] == 2 and r["diverged"] == 0 and len(r["run_ids"]) == 2
        assert r["params"] == n_params_formula(v.model_config(cfg.base_model_config()))
        assert r["rank_cap"] == (v.d_qk if v.qk == "factored" else 8) and r["d_head"] == v.d_qk
        assert 0 <= r["accuracy_mean"] <= 1 and r["final_loss_mean"] > 0 and r["ms_per_step"] > 0
        assert 1 <= r["stable_rank_mean"] <= r["rank_cap"] + 1e-6
        assert len(r["stable_rank_by_layer"]) == 2
    assert rows[0]["stable_rank_mean"] == pytest.approx(1.0)  # rank-1 heads
    curves = result.curves()
    assert sorted(curves["step"].unique()) == [3, 6]
    assert set(curves["metric"]) == {"loss", "accuracy", "eval_loss", "eval_accuracy"}
    assert sorted(result.truncation()["rank"].unique()) == [1, 2, 4, 8]
    # progress: monotone, ends at 1
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(seen) >= 8 * 6


def test_each_run_is_in_the_store(tiny):
    result, store, _ = tiny
    runs = store.list_runs()
    assert len(runs) == 8 and {r["parent"] for r in runs} == {"compare-qk:induction"}
    assert {r["status"] for r in runs} == {"completed"}
    rec = next(r for r in result.runs if r["variant"] == "merged + nuclear")
    run = store.get(rec["run_id"])
    assert run["config"]["variant"] == "merged + nuclear" and run["config"]["regularizers"] == ["nuclear=0.01"]
    assert run["summary"]["after"]["accuracy"] == pytest.approx(rec["accuracy"])
    names = set(store.metrics(rec["run_id"])["name"])
    assert {"task_loss", "eval_accuracy", "term:nuclear", "stable_rank:L1H0"} <= names
    loaded = store.load_model(rec["run_id"])
    assert loaded.config.qk == "merged" and loaded.card.details["variant"] == "merged + nuclear"


# Another thread count sums the same products in another order (and another CPU may pick other
# kernels): float32 rounding differs in the last bits and grows a little over the steps, so
# across thread counts the numbers agree to this relative tolerance only; same threads: exactly.
ACROSS_THREADS_RTOL = 1e-4


def test_same_seed_same_numbers(tiny):
    result, _, _ = tiny
    base = {**TINY, "seeds": 1, "d_qks": (), "merged_kinds": ("merged + nuclear",)}
    same = Q.compare(Q.CompareConfig(**base, threads=1), store=False)  # the threads tiny ran with
    two = Q.compare(Q.CompareConfig(**base, threads=2), store=False)
    assert "2 threads" in two.machine and torch.get_num_threads() == 1  # set for the runs, then restored
    for again, exact in ((same, True), (two, False)):
        for rec in again.runs:
            old = next(r for r in result.runs if r["variant"] == rec["variant"] and r["seed"] == rec["seed"])
            assert rec["run_id"] is None
            if exact:
                assert rec["final_loss"] == old["final_loss"] and rec["curves"] == old["curves"]
                continue
            assert rec["final_loss"] == pytest.approx(old["final_loss"], rel=ACROSS_THREADS_RTOL)
            assert [c["step"] for c in rec["curves"]] == [c["step"] for c in old["curves"]]
            for c, o in zip(rec["curves"], old["curves"]):
                for key in ("loss", "eval_loss"):
                    assert c[key] == pytest.approx(o[key], rel=ACROSS_THREADS_RTOL)


def test_saved_comparison_round_trips(tiny, tmp_path):
    result, _, _ = tiny
    path = result.save(tmp_path / "c.json")
    raw = json.loads(path.read_text())
    assert raw["variants"] == json.loads(json.dumps(_finite(result.summary())))
    back = Q.Comparison.load(path)
    assert back.summary() == result.summary() and back.markdown() == result.markdown()
    assert "| merged + nuclear |" in back.markdown() and "## What the numbers say" in back.markdown()
    with pytest.raises(ValueError, match="no saved comparison"):
        Q.Comparison.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"runs": 3}')
    with pytest.raises(ValueError, match="not a saved comparison"):
        Q.Comparison.load(tmp_path / "bad.json")


def test_findings_follow_the_numbers(tiny):
    result, _, _ = tiny
    runs = [dict(r) for r in result.runs]
    for r in runs:  # pretend d_qk=1 failed and everything else learned the task
        r["accuracy"] = 0.4 if r["variant"] == "factored d_qk=1" else 0.99
    text = "\n".join(Q.Comparison(result.config, runs).findings())
    assert "The rank cap costs accuracy: d_qk=1 reaches 0.400" in text
    assert "within 1% of it: merged, merged + wd, merged + nuclear" in text
    for r in runs:
        r["accuracy"] = 0.99
    text = "\n".join(Q.Comparison(result.config, runs).findings())
    assert "Every factored width down to d_qk=1 reaches the best accuracy" in text
    for r in runs:  # nothing learned: no claim about rank
        r["accuracy"] = 0.3
    text = "\n".join(Q.Comparison(result.config, runs).findings())
    assert "say nothing yet about the rank" in text and "rank cap" not in text


# --- the command ---------------------------------------------------------------------------------------


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "attn_core", "compare-qk", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )


def test_compare_qk_command_prints_one_json_document(tmp_path):
    out = tmp_path / "c.json"
    proc = _cli(
        "--task",
        "induction",
        "--steps",
        "3",
        "--seeds",
        "2",
        "--d-qk",
        "2",
        "--merged",
        "merged",
        "--d-model",
        "8",
        "--out",
        str(out),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [v["name"] for v in doc["variants"]] == ["factored d_qk=2", "merged"]
    keys = {
        "name",
        "qk",
        "d_head",
        "params",
        "final_loss_mean",
        "final_loss_std",
        "accuracy_mean",
        "stable_rank_mean",
        "ms_per_step",
    }
    assert all(keys <= set(v) for v in doc["variants"])
    assert doc["variants"][0]["d_head"] == 2 and doc["variants"][1]["d_head"] is None
    assert doc["seeds"] == [0, 1] and len(RunStore().list_runs()) == 4  # $ATTN_LAB_RUNS (conftest)
    assert Q.Comparison.load(out).summary()[0]["params"] == doc["variants"][0]["params"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "0"], "steps must be 1.."),
        (["--d-qk", "2,x"], "comma-separated integers"),
        (["--merged", "merged, fast", "--steps", "2"], "not one of"),
    ],
)
def test_compare_qk_bad_input_is_one_line(args, message):
    proc = _cli(*args, "--no-store", "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"] in proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
