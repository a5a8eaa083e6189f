"""Training dynamics (attn_core.dynamics): every metric against a direct computation (prefix matching
on a hand-built induction head, the ICL score from per-position losses, the entropy floor against
measured entropy on random and trained heads), series ordering and bad input, the cache, the phase
change and the JSON shape."""

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import checkpoint
from attn_core import dynamics as D
from attn_core.bilinear import detector_inputs, head_B
from attn_core.circuits import composition
from attn_core.hooks import act_name
from attn_core.model import ModelConfig, Transformer
from attn_core.sources import resolve
from attn_core.tasks import get_task
from attn_core.training import checkpoints as ckpt
from tests.conftest import make_tiny_model

# --- the entropy floor -----------------------------------------------------------------------------


def _entropy(s: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(s.double(), -1)
    return -(p * torch.log_softmax(s.double(), -1)).sum(-1)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 24, 500])
@pytest.mark.parametrize("sigma", [0.0, 0.3, 2.0, 9.0, 40.0])
def test_the_floor_is_attained_by_its_logits(n, sigma):
    s = D.bound.floor_logits(n, sigma)
    assert float((s - s.mean()).norm()) == pytest.approx(sigma if n > 1 else 0.0, abs=1e-9)
    assert float(D.entropy_floor(n, sigma)) == pytest.approx(float(_entropy(s)), abs=1e-9)
    if sigma == 0.0:
        assert float(D.entropy_floor(n, 0.0)) == pytest.approx(math.log(n), abs=1e-12)


@pytest.mark.parametrize("n, sigma", [(2, 1.0), (3, 0.7), (5, 3.0), (12, 2.0), (24, 6.0)])
def test_a_search_over_logits_finds_no_entropy_below_the_floor_and_reaches_it(n, sigma):
    """The floor is the least entropy of logits with centred norm sigma (docs/maths.md), checked
    without the proof: Adam on the sphere of such logits from 32 random starts ends at the floor,
    never below it. (A floor that is too high fails the first assertion, one that is too low, and
    so not the least, fails the second.)"""
    t = torch.randn(32, n, generator=torch.Generator().manual_seed(n), dtype=torch.float64).requires_grad_()
    opt = torch.optim.Adam([t], lr=0.05)
    for _ in range(600):
        u = t - t.mean(-1, keepdim=True)
        H = _entropy(u / u.norm(dim=-1, keepdim=True) * sigma)
        opt.zero_grad()
        H.sum().backward()
        opt.step()
    least, floor = float(H.detach().min()), float(D.entropy_floor(n, sigma))
    assert least >= floor - 1e-9
    assert least == pytest.approx(floor, abs=1e-4)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-50, 50, allow_nan=False), min_size=1, max_size=40),
    st.floats(0, 3),
)
def test_no_logits_have_less_entropy_than_the_floor_of_their_norm(values, stretch):
    s = torch.tensor(values, dtype=torch.float64) * stretch
    sigma = float((s - s.mean()).norm())
    assert float(_entropy(s)) >= float(D.entropy_floor(len(values), sigma)) - 1e-9
    # and a larger norm allowance only lowers the floor
    assert float(D.entropy_floor(len(values), sigma + 1.0)) <= float(D.entropy_floor(len(values), sigma)) + 1e-12


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 16), st.floats(0.01, 30), st.integers(0, 2**31 - 1))
def test_row_floors_never_exceed_the_rows_entropy(T, scale, seed):
    g = torch.Generator().manual_seed(seed)
    S = torch.randn(3, 2, T, T, generator=g, dtype=torch.float64) * scale
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    A = torch.softmax(S.masked_fill(~mask, -math.inf), -1)
    H = -(A * A.clamp_min(1e-300).log()).sum(-1)
    assert bool((D.row_floors(S, mask) <= H + 1e-9).all())


def test_the_floor_takes_the_device_of_its_scores():
    S = torch.randn(2, 3, 5, 5, device="meta")
    mask = torch.tril(torch.ones(5, 5, dtype=torch.bool, device="meta"))
    assert D.row_floors(S, mask).device.type == "meta" and D.normalized_row_floors(S, mask).shape == (2, 3, 5)


def _measured_vs_floor(model: Transformer, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    names = [act_name(k, l) for l in range(model.cfg.n_layers) for k in ("attn_scores", "pattern")]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names)
    T = tokens.shape[1]
    H, floors = [], []
    for l in range(model.cfg.n_layers):
        mask = model.mask(T)
        A = cache[act_name("pattern", l)].double()
        H.append(-(A * A.clamp_min(1e-300).log()).sum(-1))
        floors.append(D.row_floors(cache[act_name("attn_scores", l)], mask))
    return torch.stack(H), torch.stack(floors)


def test_the_floor_holds_on_trained_and_random_heads():
    trained = resolve("induction-2l").model
    tokens = get_task("induction").sample(16, 5, split="test").tokens
    H, floor = _measured_vs_floor(trained, tokens)
    assert bool((floor <= H + 1e-5).all())  # the pattern is float32
    for std in (None, 0.3, 1.5):  # as training initialises them, and wider
        sharp = make_tiny_model("reverse", std=std, n_layers=2)
        H, floor = _measured_vs_floor(sharp, get_task("reverse").sample(16, 1).tokens)
        assert bool((floor <= H + 1e-5).all())
        if std is None:
            assert float(floor[..., 8:].min()) > 0.5  # near log n at init: not vacuous
    # the weights' bound (Zhai et al.): ||S||_2 <= sigma_1(B) ||X||_2^2 (S = X B X^T), so its floor is lower still
    with torch.no_grad():
        names = [act_name("attn_in", 0), act_name("attn_scores", 0)]
        _, cache = sharp.run_with_cache(get_task("reverse").sample(4, 2).tokens, names_filter=names)
        X = cache[act_name("attn_in", 0)].double()  # [b, T, d]
        S = cache[act_name("attn_scores", 0)][:, 0]  # head 0, [b, T, T]
        weights = torch.linalg.matrix_norm(head_B(sharp, 0, 0).double(), 2) * torch.linalg.matrix_norm(X, 2) ** 2
    assert bool((D.spectral_norm(S, sharp.mask(S.shape[-1])) <= weights + 1e-6).all())
    assert torch.allclose(S.double(), X @ head_B(sharp, 0, 0).detach().double() @ X.transpose(-1, -2), atol=1e-4)


# --- the metrics against direct computations ------------------------------------------------------------


def induction_circuit(V: int = 8, T: int = 16, c: float = 12.0) -> Transformer:
    """A hand-built 2-layer attention-only model: L0H0 attends to the previous position and writes
    that token into a 'previous token' slot; L1H0 attends to keys whose previous token is the
    query's token: an exact induction head. Residual: [token one-hot | position one-hot | previous token]."""
    cfg = ModelConfig(n_layers=2, n_heads=1, d_model=2 * V + T, d_head=T, d_vocab=V, n_ctx=T, normalization="none")
    m = Transformer(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        tok, pos, prev = range(0, V), range(V, V + T), range(V + T, 2 * V + T)
        m.embed.W_E[:, :V] = torch.eye(V)
        m.pos_embed.W_pos[:, V : V + T] = torch.eye(T)
        a0, a1 = m.blocks[0].attn, m.blocks[1].attn
        for p in range(T):
            a0.W_Q[0, pos[p], p] = c  # query at position p ...
            if p + 1 < T:
                a0.W_K[0, pos[p], p + 1] = c  # ... meets the key at position p - 1
        for t in range(V):
            a0.W_V[0, tok[t], t] = 1.0
            a0.W_O[0, t, prev[t]] = 1.0  # writes the attended (previous) token into the slot
            a1.W_Q[0, tok[t], t] = c
            a1.W_K[0, prev[t], t] = c  # key j matches when its previous token is the query's token
    return m.eval()


def test_prefix_matching_of_a_hand_built_induction_head():
    model = induction_circuit()
    got = D.checkpoint_metrics(model, None, detector_samples=16, seed=3).values
    # every row of the second half finds its target, except the first one, whose token also sits in
    # position 0's previous-token slot (position 0 has only itself to attend to): 7.5 of 8 rows
    assert got["prefix_matching:L1H0"] == pytest.approx(7.5 / 8, abs=1e-3) and got["previous_token:L0H0"] > 0.99
    assert got["prefix_matching:L0H0"] < 0.2 and got["loss"] is None  # no inputs: no forward metrics
    # directly: attention from each token of the second half to the token after its earlier copy
    tokens = detector_inputs(model, 16, 3)["repeated"]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=act_name("pattern", 1))
    A = cache[act_name("pattern", 1)][:, 0]
    half = tokens.shape[1] // 2
    direct = torch.stack([A[:, i, i - half + 1] for i in range(half, 2 * half)], 1).mean()
    assert got["prefix_matching:L1H0"] == pytest.approx(float(direct), abs=1e-5)


@pytest.fixture(scope="module")
def trained():
    return resolve("induction-2l")


def test_icl_score_and_loss_from_per_position_losses(trained):
    task = trained.task
    inputs = D.task_inputs(task, samples=24, seed=2)
    got = D.checkpoint_metrics(trained.model, inputs, detector_samples=8).values
    with torch.no_grad():
        logits = trained.model(inputs.tokens)
    per = torch.zeros(inputs.tokens.shape[1], dtype=torch.float64)
    for t in range(inputs.tokens.shape[1]):
        per[t] = F.cross_entropy(logits[:, t].double(), inputs.targets[:, t])
    (a, b), (c, d) = inputs.early, inputs.late
    assert (a, b, c, d) == (1, 4, 21, 24)
    assert got["icl_score"] == pytest.approx(float(per[c:d].mean() - per[a:b].mean()), abs=1e-6)
    scored = F.cross_entropy(logits[inputs.scored].double(), inputs.targets[inputs.scored])
    assert got["loss"] == pytest.approx(float(scored), abs=1e-6)


def test_head_metrics_from_their_definitions(trained):
    model = trained.model
    inputs = D.task_inputs(trained.task, samples=8, seed=1)
    got = D.checkpoint_metrics(model, inputs, detector_samples=8).values
    K = composition(model).scores["k"]
    for h in range(4):
        assert got[f"k_composition_max:L1H{h}"] == pytest.approx(float(K[:4, 4 + h].max()), abs=1e-6)
        with torch.no_grad():
            sigma = torch.linalg.svdvals(head_B(model, 1, h).double())
        assert got[f"sigma_max:L1H{h}"] == pytest.approx(float(sigma[0]), rel=1e-4)
        assert got[f"stable_rank:L1H{h}"] == pytest.approx(float((sigma**2).sum() / sigma[0] ** 2), rel=1e-3)
    assert "k_composition_max:L0H0" not in got  # no earlier head writes into layer 0
    with torch.no_grad():
        _, cache = model.run_with_cache(inputs.tokens, names_filter=act_name("pattern", 1))
    A = cache[act_name("pattern", 1)].double()[:, 2]  # head 2, [b, T, T]
    rows = [
        -(A[:, i, : i + 1] * A[:, i, : i + 1].clamp_min(1e-300).log()).sum(-1) / math.log(i + 1) for i in range(1, 24)
    ]
    assert got["entropy_data:L1H2"] == pytest.approx(float(torch.stack(rows).mean()), abs=1e-6)
    assert 0 <= got["entropy_bound:L1H2"] <= got["entropy_data:L1H2"]


# --- series -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, step",
    [
        ("step1000", 1000),
        ("pythia-70m-step143000", 143000),
        ("checkpoint-50", 50),
        ("ckpt_7", 7),
        ("250", 250),
        ("model-v2", None),
        ("run-final", None),
        ("step-000000100.safetensors", 100),
    ],
)
def test_steps_from_names(name, step):
    assert D.step_of_name(name) == step


def _folders(tmp_path, names, **config):
    out = []
    for i, name in enumerate(names):
        out.append(str(checkpoint.save(make_tiny_model(seed=i, **config), tmp_path / name, {"task": "reverse"})))
    return out


def test_a_series_of_folders_is_ordered_by_the_steps_their_names_carry(tmp_path):
    paths = _folders(tmp_path, ["step-200", "checkpoint-10", "step50"])
    s = D.series(paths)
    assert s.steps == [10, 50, 200] and [m.source for m in s.members] == [paths[1], paths[2], paths[0]]
    given = D.series(paths, steps=[3, 1, 2])
    assert given.steps == [1, 2, 3] and given.members[0].source == paths[1]
    loaded = s.load(50)
    assert loaded.key == s.member(50).key and loaded.name.endswith("@ step 50")


@pytest.mark.parametrize(
    "case, words",
    [
        ("empty", "no series given"),
        ("no step", "cannot tell the training step"),
        ("count", "2 steps given for 3 models"),
        ("no checkpoints", "holds no checkpoints"),
        ("missing", "no model named"),
    ],
)
def test_bad_series_are_one_sentence(tmp_path, case, words):
    if case == "empty":
        args = ([],)
    elif case == "no step":
        args = (_folders(tmp_path, ["step1", "final"]),)
    elif case == "count":
        args = (_folders(tmp_path, ["a", "b", "c"]), [1, 2])
    elif case == "no checkpoints":
        args = (_folders(tmp_path, ["alone"]),)
    else:
        args = ([str(tmp_path / "nowhere"), "step9"],)
    with pytest.raises(ValueError, match=words):
        D.series(*args)


def test_members_of_another_architecture_or_a_repeated_step_are_skipped_with_the_reason(tmp_path):
    paths = _folders(tmp_path, ["step1", "step-5", "checkpoint-5", "step9"])
    paths.append(str(checkpoint.save(make_tiny_model(n_heads=4), tmp_path / "step2", {"task": "reverse"})))
    s = D.series(paths)
    assert s.steps == [1, 5, 9] and s.config.n_heads == 2  # the architecture most members share
    assert [(k.step, k.reason) for k in s.skipped] == [
        (2, "another architecture (n_heads=4; the series has n_heads=2)"),
        (5, "step 5 is listed twice (also step-5)"),
    ]


def trained_run(tmp_path, steps: int, **checkpoints) -> str:
    """``run:<id>`` of a tiny 2-layer model retrained ``steps`` steps on reverse, keeping checkpoints."""
    from attn_core.retraining.job import TrainingJob
    from attn_core.training.config import JobConfig

    src = checkpoint.save(
        make_tiny_model(n_layers=2), tmp_path / "tiny", {"task": "reverse", "train": {"batch_size": 8}}
    )
    every = max(1, steps // 2)
    cfg = JobConfig(str(src), steps=steps, device="cpu", telemetry_every=every, spectrum_every=every,
                    eval_every=every, eval_samples=8, probe_samples=4, measure_samples=16, **checkpoints)  # fmt: skip
    return f"run:{TrainingJob.open(cfg).run()['run_id']}"


@pytest.fixture
def run_with_checkpoints(tmp_path):
    return trained_run(tmp_path, 8, checkpoint_every=4)


def test_dynamics_of_a_run_is_cached_per_checkpoint(run_with_checkpoints, tmp_path):
    s = D.series([run_with_checkpoints])
    assert s.steps == [0, 4, 8] and s.reference == run_with_checkpoints
    inputs = D.default_inputs(s, samples=16)
    first = D.dynamics(s, inputs, detector_samples=4, cache=D.MetricCache(tmp_path / "c"))
    assert (first.hits, first.misses) == (0, 3)
    again = D.dynamics(s, inputs, detector_samples=4, cache=D.MetricCache(tmp_path / "c"))
    assert (again.hits, again.misses) == (3, 0)
    assert again.to_json() == first.to_json()
    other = D.task_inputs(get_task("reverse"), samples=16, seed=9)
    assert D.dynamics(s, other, detector_samples=4, cache=D.MetricCache(tmp_path / "c")).misses == 3
    path = s.member(4).file
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # rewritten: measured again
    third = D.dynamics(
        D.series([run_with_checkpoints]), inputs, detector_samples=4, cache=D.MetricCache(tmp_path / "c")
    )
    assert (third.hits, third.misses) == (2, 1)


def test_the_json_is_the_documented_shape(run_with_checkpoints):
    s = D.series([run_with_checkpoints])
    dyn = D.dynamics(s, D.default_inputs(s, samples=8), detector_samples=4)
    out = json.loads(json.dumps(dyn.to_json(), allow_nan=False))
    assert set(out) == {"steps", "tokens", "metrics", "phase_change", "inputs", "skipped"}
    assert out["steps"] == [0, 4, 8]
    T = s.config.n_ctx  # the positions the ICL score compares are stated: late T-T/8..T-1 minus early 1..T/8
    w = max(1, T // 8)
    assert f"ICL score = mean loss at positions {T - w}..{T - 1} minus at 1..{w} (of {T})" in out["inputs"]
    assert {
        "loss",
        "icl_score",
        "prefix_matching:L1H0",
        "previous_token:L0H1",
        "k_composition_max:L1H1",
        "entropy_data:L1H0",
        "entropy_bound:L1H0",
        "sigma_max:L0H0",
        "stable_rank:L1H1",
        "copying:L1H0",
    } <= set(out["metrics"])
    assert all(len(v) == 3 for v in out["metrics"].values())
    assert len(dyn.k_from("L0H1", "L1H0")) == 3


def test_a_long_series_is_thinned_for_its_curves_with_its_values_unchanged():
    steps = list(range(0, 30_000, 3))  # 10,000 steps
    dyn = D.Dynamics(steps=steps, metrics={"loss": [float(s) for s in steps]}, k_composition=[[[0.0]]] * len(steps),
                     order=["L0H0"], layers=[0], phase_change={"step": 303, "window": [300, 306]})  # fmt: skip
    thin = dyn.thinned(500)
    assert 500 <= len(thin.steps) <= 502 and thin.steps[0] == 0 and thin.steps[-1] == steps[-1]
    assert {300, 306} <= set(thin.steps) and thin.metrics["loss"] == [float(s) for s in thin.steps]
    assert len(thin.k_composition) == len(thin.steps) and dyn.thinned(10_000) is dyn


def test_attention_only_checkpoints_measure_the_weights_only(tmp_path):
    run = trained_run(tmp_path, 4, checkpoint_every=2, checkpoint_params="attn")
    s = D.series([run])
    assert s.partial
    dyn = D.dynamics(s, D.default_inputs(s, samples=8), detector_samples=4)
    assert dyn.metrics["loss"] == [None] * 3 and dyn.metrics["prefix_matching:L1H0"] == [None] * 3
    assert all(v is not None for v in dyn.metrics["sigma_max:L1H0"] + dyn.metrics["k_composition_max:L1H0"])
    assert dyn.partial == [True] * 3


def test_available_leaves_out_a_broken_folder_and_says_why(tmp_path, monkeypatch):
    root = tmp_path / "models"
    for name in ("good", "broken"):
        folder = checkpoint.save(make_tiny_model(), root / name, {"task": "reverse"})
        writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=1), 1)
        writer.start(folder / checkpoint.CHECKPOINTS, make_tiny_model())
        writer.write(1, make_tiny_model())
    (root / "broken" / checkpoint.CHECKPOINTS / ckpt.INDEX).write_text('{"steps": [0], "files": ')
    monkeypatch.setenv("ATTN_LAB_MODELS", str(root))
    problems = []
    found = D.available(problems=problems)
    assert [f["source"] for f in found] == ["good"] and found[0]["label"] == "good (2 checkpoints)"
    assert (
        len(problems) == 1 and "skipped the checkpoints of broken: " in problems[0] and "not valid JSON" in problems[0]
    )
    assert "\n" not in problems[0]


def test_a_checkpoints_folder_alone_is_a_series(tmp_path):
    model = make_tiny_model()
    writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=3), 6)
    writer.start(tmp_path / "series", model)
    writer.write(3, model)
    writer.write(6, model)
    s = D.series([str(tmp_path / "series")])
    assert s.steps == [0, 3, 6] and s.reference is None and not s.partial


# --- the phase change -----------------------------------------------------------------------------------


def _noisy(values, scale, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [v + scale * float(e) for v, e in zip(values, torch.randn(len(values), generator=g))]


def test_a_phase_change_is_a_fall_of_the_icl_score_that_the_loss_shares_beyond_the_noise():
    xs = list(range(0, 1501, 25))
    step = [1 / (1 + math.exp(-(x - 400) / 30)) for x in xs]
    icl, loss = _noisy([-3 * s for s in step], 0.02), _noisy([2.5 - 2 * s for s in step], 0.005, seed=1)
    found = D.phase_change(xs, icl, loss)
    assert (
        found["by"] == "icl_score" and abs(found["step"] - 400) <= 10 and found["window"][0] < 400 < found["window"][1]
    )
    assert found["fall"] > 2.5 and found["loss_fall"] > 1.5 and 0 < found["noise"]["icl_score"] < 0.05
    flat = _noisy([0.01] * len(xs), 0.001)
    assert D.phase_change(xs, icl, flat) is None  # the loss does not fall with it: no evidence
    assert D.phase_change(xs, icl, None) is None  # no loss, no evidence
    assert D.phase_change(xs, icl, _noisy([2.5] * len(xs), 0.5)) is None  # a loss "fall" within its noise
    assert D.phase_change(xs, _noisy([-0.3 * s for s in step], 0.1), loss) is None  # an ICL fall within its noise
    assert D.phase_change(xs, [-x / 500 for x in xs], [3 - x / 600 for x in xs]) is None  # steady: no plateau
    assert D.phase_change(xs, [-3 * (1 - math.exp(-x / 100)) for x in xs], loss) is None  # falls from the start
    assert D.phase_change([0, 1], [0.0, -5.0], [3.0, 0.0]) is None  # too few points
    assert D.phase_change(xs, [None] * len(xs), loss) is None


def test_the_phase_changes_of_induction_2l_trained_from_scratch_are_found_again():
    """The 15 runs of experiments/phase_change.py (induction-2l from scratch, 82 checkpoints each,
    the ICL score and loss as measured then): each has its phase change, where it was reported."""
    rows = json.loads((Path(__file__).parents[2] / "experiments/results/phase_change.json").read_text())["rows"]
    for r in rows:
        found = D.phase_change(r["steps_measured"], r["icl"], r["loss"])
        assert found is not None and found["window"] == r["window"] and found["step"] == r["phase_step"], r["seed"]
        assert found["loss_fall"] > 1 and found["fall"] > 10 * found["noise"]["icl_score"]


# `attn-lab retrain induction-2l --steps 400 --checkpoint-log 20` then `attn-lab dynamics run:<id> --json`
# (2026-11-26): a fine-tune of the converged model. Its ICL score falls 2.4 nats over steps 1..60 (its
# early positions grow more confidently wrong) while its loss stays below 2e-5 nats: no phase change.
FINE_TUNE = {
    "steps": [0, 1, 2, 3, 4, 5, 7, 9, 12, 17, 23, 32, 44, 60, 83, 113, 155, 213, 292, 400],
    "icl_score": [-15.4915, -15.5039, -15.5291, -15.5659, -15.6036, -15.6493, -15.7607, -15.8891, -16.0898,
                  -16.4064, -16.7227, -17.1192, -17.5413, -17.8511, -17.9964, -17.8266, -16.9804, -17.0259,
                  -16.8594, -16.9085],
    "loss": [2.61e-06, 2.56e-06, 2.47e-06, 2.35e-06, 2.23e-06, 2.08e-06, 1.78e-06, 1.49e-06, 1.13e-06, 7.5e-07,
             4.98e-07, 2.97e-07, 1.68e-07, 1.12e-07, 8.95e-08, 9.68e-08, 1.67e-05, 9.89e-07, 1.11e-06, 7.21e-07],
}  # fmt: skip


def test_a_fine_tune_of_a_converged_model_has_no_phase_change():
    f = FINE_TUNE
    assert D.phase_change(f["steps"], f["icl_score"], f["loss"]) is None
    every_20 = [i for i, s in enumerate(f["steps"]) if s % 20 == 0 or s in (0, 400)]
    assert D.phase_change([f["steps"][i] for i in every_20], [f["icl_score"][i] for i in every_20],
                          [f["loss"][i] for i in every_20]) is None  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-20, 20, allow_nan=False), min_size=3, max_size=40), st.integers(1, 50))
def test_a_found_window_lies_inside_the_steps_and_holds_the_step(values, gap):
    steps = [i * gap for i in range(len(values))]
    found = D.phase_change(steps, values, values)
    if found is not None:
        a, b = found["window"]
        assert steps[0] < a < b <= steps[-1] and a <= found["step"] <= b


# --- attn-lab dynamics ------------------------------------------------------------------------------------


def _cli(capsys, *args) -> tuple[int, str, str]:
    from attn_core.cli import main

    with pytest.raises(SystemExit) as done:
        main(list(args))
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def test_the_command_prints_the_json_and_reads_the_cache_the_second_time(run_with_checkpoints, capsys):
    code, out, err = _cli(
        capsys, "dynamics", run_with_checkpoints, "--samples", "16", "--detector-samples", "4", "--json"
    )
    assert code == 0, err
    first = json.loads(out)
    assert set(first) == {"steps", "tokens", "metrics", "phase_change", "inputs", "skipped"}
    assert first["steps"] == [0, 4, 8] and first["skipped"] == [] and first["tokens"] is None
    assert "cache: 0 of 3 checkpoints" in err
    code, out, err = _cli(
        capsys, "dynamics", run_with_checkpoints, "--samples", "16", "--detector-samples", "4", "--json"
    )
    assert code == 0 and json.loads(out) == first and "cache: 3 of 3 checkpoints" in err
    code, out, err = _cli(capsys, "dynamics", run_with_checkpoints, "--samples", "16", "--detector-samples", "4")
    # stderr is no terminal here: the shared progress lines (as pip and git print), no bar redrawn with \r
    assert code == 0 and "\r" not in err and "dynamics: 100% (3/3 checkpoints" in err, err
    assert "no phase change" in out or "phase change at step" in out


def test_the_command_writes_the_animation(run_with_checkpoints, tmp_path, capsys):
    out_file = tmp_path / "anim.html"
    args = (
        "dynamics",
        run_with_checkpoints,
        "--samples",
        "8",
        "--detector-samples",
        "4",
        "--layer",
        "1",
        "--head",
        "1",
    )
    code, _, err = _cli(capsys, *args, "--animate", str(out_file), "--value", "pattern")
    assert code == 0, err
    html = out_file.read_text()
    assert "addFrames" in html and all(f'"name":"{s}"' in html for s in (0, 4, 8)) and "L1H1" in html
    code, _, err = _cli(capsys, *args, "--animate", str(out_file))
    assert code == 2 and "already exists" in err


def test_text_windows_for_the_icl_score(tmp_path, capsys):
    paths = _folders(tmp_path, ["step1", "step2", "step3"])
    text = tmp_path / "digits.txt"
    text.write_text(" ".join(str(i % 10) for i in range(400)))
    code, out, err = _cli(capsys, "dynamics", *paths, "--text", str(text), "--length", "16", "--samples", "8", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["steps"] == [1, 2, 3] and all(v is not None for v in res["metrics"]["icl_score"])


@pytest.mark.parametrize(
    "extra, words",
    [
        (("--early", "3"), "--early takes positions A:B"),
        (("--late", "20:30"), "must be ranges inside 0:16"),
        (("--value", "logits"), "--value must be one of"),
        (("--animate", "x.png"), "writes an HTML file"),
        (("--samples", "0"), "--samples"),
        (("--steps", "1,2"), "2 steps given for 3 models"),
        (("--steps", "1,a,3"), "--steps takes whole numbers"),
        (("--text", "missing.txt"), "missing.txt"),
    ],
)
def test_bad_command_input_is_one_line(tmp_path, capsys, monkeypatch, extra, words):
    monkeypatch.chdir(tmp_path)
    paths = _folders(tmp_path, ["step1", "step2", "step3"])
    code, out, err = _cli(capsys, "dynamics", *paths, *extra, "--json")
    assert code == 2 and words in err and err.count("\n") == 1, err
    assert json.loads(out)["error"]


def test_a_series_without_a_task_needs_a_text(tmp_path, capsys):
    paths = []
    for i, name in enumerate(["step1", "step2"]):
        paths.append(str(checkpoint.save(make_tiny_model(seed=i), tmp_path / name, {})))
    code, _, err = _cli(capsys, "dynamics", *paths)
    assert code == 2 and "give --text FILE" in err
