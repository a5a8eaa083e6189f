"""Concentration regularizers: specs and validation, and that each gradient pushes its metric the
right way on a small fixed problem."""

import math

import pytest
import torch

from attn_core import metrics
from attn_core import regularizers as R
from attn_core.bilinear import layer_form, model_form
from attn_core.hooks import act_name
from attn_core.model import ModelConfig, Transformer


# Not conftest's make_tiny_model: W_Q/W_K/W_QK are redrawn from the init's own generator afterwards.
def tiny_model(seed: int = 0, **kw) -> Transformer:
    cfg = ModelConfig(**{**dict(n_layers=2, n_heads=2, d_model=16, d_head=4, n_ctx=8, d_vocab=10), **kw})
    model = Transformer(cfg)
    g = torch.Generator().manual_seed(seed)
    model.reset_parameters(g)
    with torch.no_grad():  # sharper than GPT-2's 0.02 init, so the patterns are neither uniform nor one-hot
        for block in model.blocks:
            for name in ("W_Q", "W_K", "W_QK"):
                if hasattr(block.attn, name):
                    getattr(block.attn, name).normal_(0, 0.5, generator=g)
    return model


TOKENS = torch.randint(0, 10, (6, 8), generator=torch.Generator().manual_seed(1))


def data_metric(model: Transformer, fn) -> float:
    """Mean over every head and informative row of fn(pattern, mask), on the fixed batch."""
    cache = {}
    with torch.no_grad():
        model(TOKENS, cache=cache)
    vals = []
    for l in range(model.cfg.n_layers):
        A, mask = R.data_rows(model, cache, l)
        vals.append(R.mean_rows(fn(A, mask), A.shape, mask))
    return float(torch.cat(vals).mean())


def vocab_metric(model: Transformer, fn) -> float:
    with torch.no_grad():
        vals = [
            R.mean_rows(fn(P, None), P.shape, None) for P in (R.vocab_rows(model, l) for l in range(model.cfg.n_layers))
        ]
    return float(torch.cat(vals).mean())


def spectrum_metric(model: Transformer, which: str) -> float:
    with torch.no_grad():
        form = model_form(model)
        return float((form.spectral_norm if which == "spectral" else form.nuclear_norm).mean())


# How each regularizer's own metric (measured independently) must move when we descend it.
EXPECTED = {
    "entropy": (lambda m: data_metric(m, metrics.normalized_entropy), "down"),
    "hoyer": (lambda m: data_metric(m, metrics.hoyer), "up"),
    "topk": (lambda m: data_metric(m, lambda p, mask: metrics.topk_mass(p, 1, mask)), "up"),
    "sink": (lambda m: data_metric(m, metrics.first_key_mass), "down"),
    "vocab_entropy": (lambda m: vocab_metric(m, metrics.normalized_entropy), "down"),
    "vocab_hoyer": (lambda m: vocab_metric(m, metrics.hoyer), "up"),
    "vocab_topk": (lambda m: vocab_metric(m, lambda p, mask: metrics.topk_mass(p, 1, mask)), "up"),
    "spectral": (lambda m: spectrum_metric(m, "spectral"), "down"),
    "nuclear": (lambda m: spectrum_metric(m, "nuclear"), "down"),
}


def descend(model: Transformer, penalty, steps: int = 5, lr: float = 0.05) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        cache = {}
        model(TOKENS, cache=cache)
        loss = sum(penalty(model, None, cache).values())
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("name", list(R.REGULARIZERS))
def test_gradient_pushes_metric_the_right_way(name):
    model = tiny_model()
    metric, direction = EXPECTED[name]
    before = metric(model)
    penalty = R.build_penalty({name: 1.0}, model)
    descend(model, penalty)
    after = metric(model)
    assert math.isfinite(after)
    if direction == "down":
        assert after < before - 1e-4, (before, after)
    else:
        assert after > before + 1e-4, (before, after)


@pytest.mark.parametrize("name", ["topk", "vocab_topk"])
def test_topk_k_is_used(name):
    model = tiny_model()
    spec = R.parse_spec(f"{name}:3=1")
    pen = R.build_penalty([spec], model)
    assert spec.k == 3 and list(pen.heads) == [f"{name}:3"]
    cache = {}
    model(TOKENS, cache=cache)
    v1 = R.regularizer_value(R.RegSpec(name, 1.0), model, R.all_heads(model.cfg), cache)
    v3 = R.regularizer_value(spec, model, R.all_heads(model.cfg), cache)
    assert 0 <= v3 < v1 <= 1  # the 3 largest weights hold more mass than the largest alone


def test_penalty_values_agree_with_the_metrics():
    """The regularizer is the mean over heads of the same per-head numbers the telemetry shows."""
    model = tiny_model()
    cache = {}
    with torch.no_grad():
        model(TOKENS, cache=cache)
    pen = R.build_penalty({"entropy": 1.0, "vocab_entropy": 1.0}, model)
    values = pen.values(model, cache)
    data = R.data_concentration(model, cache)["entropy"]
    vocab = R.vocab_concentration(model)["entropy"]
    assert values["entropy"] == pytest.approx(float(data.mean()), rel=1e-5)
    assert values["vocab_entropy"] == pytest.approx(float(vocab.mean()), rel=1e-5)
    terms = pen(model, None, cache)
    assert float(terms["entropy"]) == pytest.approx(values["entropy"], rel=1e-5)


def test_strength_scales_the_term_and_zero_turns_it_off():
    model = tiny_model()
    cache = {}
    model(TOKENS, cache=cache)
    t1 = R.build_penalty({"nuclear": 0.5}, model)(model, None, cache)["nuclear"]
    t2 = R.build_penalty({"nuclear": 2.0}, model)(model, None, cache)["nuclear"]
    assert float(t2.detach()) == pytest.approx(4 * float(t1.detach()), rel=1e-5)
    off = R.build_penalty({"nuclear": 0.0}, model)
    assert not off and off(model, None, cache) == {}
    assert off.regularized_heads == R.all_heads(model.cfg)


def test_head_selection_restricts_the_gradient():
    model = tiny_model()
    pen = R.build_penalty(["spectral@L1H0=1"], model)
    assert pen.regularized_heads == ((1, 0),)
    sum(pen(model, None, {}).values()).backward()
    g0, g1 = model.blocks[0].attn.W_Q.grad, model.blocks[1].attn.W_Q.grad
    assert g0 is None or g0.abs().max() == 0
    assert g1[0].abs().max() > 0 and g1[1].abs().max() == 0


def test_default_selection_and_per_spec_override():
    model = tiny_model()
    pen = R.build_penalty(["entropy=0.1", "vocab_entropy@L0H1=0.1"], model, heads="L1")
    assert pen.heads["entropy"] == ((1, 0), (1, 1))
    assert pen.heads["vocab_entropy@L0H1"] == ((0, 1),)
    assert pen.regularized_heads == ((0, 1), (1, 0), (1, 1))
    described = {d["label"]: d["resolved_heads"] for d in pen.describe()}
    assert described["entropy"] == ["L1H0", "L1H1"]


def test_entmax_model_gives_finite_gradients():
    model = R.with_entmax(tiny_model(), 2.0)
    assert model.cfg.entmax_alpha == 2.0
    cache = {}
    model(TOKENS, cache=cache)
    assert (cache[act_name("pattern", 0)] == 0).any()  # sparsemax gives exact zeros
    pen = R.build_penalty({"entropy": 1.0, "hoyer": 1.0, "vocab_entropy": 1.0}, model)
    sum(pen(model, None, cache).values()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert R.with_entmax(model, None) is model


def test_merged_heads_are_supported():
    model = tiny_model(qk="merged")
    metric, _ = EXPECTED["nuclear"]
    before = metric(model)
    descend(model, R.build_penalty({"nuclear": 1.0}, model))
    assert metric(model) < before


@pytest.mark.parametrize(
    "text, spec",
    [
        ("entropy=0.1", R.RegSpec("entropy", 0.1)),
        ("topk:2=0.5", R.RegSpec("topk", 0.5, k=2)),
        ("vocab_entropy@L1H2,L0=0.05", R.RegSpec("vocab_entropy", 0.05, heads="L1H2,L0")),
        (" Spectral = 1e-2 ", R.RegSpec("spectral", 0.01)),
    ],
)
def test_parse_spec(text, spec):
    assert R.parse_spec(text) == spec
    assert R.parse_spec(str(spec)) == spec


@pytest.mark.parametrize(
    "specs, message",
    [
        (["entropy=-0.1"], "must be a finite number >= 0"),
        ({"entropy": -1}, "must be a finite number >= 0"),
        (["entropy=inf"], "must be a finite number >= 0"),
        (["entropy=abc"], "must be a number"),
        (["entropyy=0.1"], "unknown regularizer 'entropyy'; choose from entropy, hoyer"),
        ({"sparsity": 1}, "unknown regularizer"),
        (["entropy"], "NAME[:K][@HEADS]=LAMBDA"),
        (["hoyer:2=1"], "k only applies to topk"),
        (["topk:0=1"], "regularizer 'topk': k must be 1..1,048,576 (a whole number), got 0"),
        (["topk:x=1"], "must be a positive integer"),
        (["entropy@L2=1"], "layer L2 is out of range: this model has 2 layers"),
        (["entropy@L0H5=1"], "head L0H5 is out of range: this model has 2 heads per layer"),
        (["entropy@layer0=1"], "is not L<layer> or L<layer>H<head>"),
        (["entropy=1", "entropy=2"], "given twice"),
        ({"entropy": "a lot"}, "must be a number"),
    ],
)
def test_bad_specs_say_what_is_wrong(specs, message):
    with pytest.raises(ValueError) as e:
        R.build_penalty(specs, tiny_model())
    assert message in str(e.value)


def test_bad_default_heads():
    with pytest.raises(ValueError, match="layer L3 is out of range"):
        R.build_penalty({"entropy": 1}, tiny_model(), heads="L3")
    with pytest.raises(ValueError, match="head L1H2 is out of range"):
        R.build_penalty({"entropy": 1}, tiny_model(), heads=[(1, 2)])


def test_format_heads_round_trips():
    cfg = tiny_model().cfg
    heads = R.parse_heads("L1,L0H1", cfg)
    assert heads == ((0, 1), (1, 0), (1, 1))
    assert R.format_heads(heads, cfg) == "L0H1,L1"
    assert R.parse_heads(R.format_heads(heads, cfg), cfg) == heads
    assert R.format_heads(R.all_heads(cfg), cfg) == "all"


def test_data_regularizer_needs_the_cache():
    model = tiny_model()
    with pytest.raises(ValueError, match="forward cache"):
        R.build_penalty({"entropy": 1}, model)(model, None, {})


def test_grown_heads_have_finite_spectral_gradients():
    """Heads narrower than their layer's stored width (attn_core.grow) are zero-padded; the
    spectral penalties must not differentiate through that padding."""
    model = tiny_model(n_layers=1, d_qk=[[2, 4]])
    model.zero_qk_padding()
    for name in ("spectral", "nuclear"):
        model.zero_grad()
        pen = R.build_penalty({name: 1.0}, model)
        sum(pen(model, None, {}).values()).backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None), name
    with torch.no_grad():
        sigma = R.layer_singular_values(model, 0)
        assert torch.allclose(sigma, layer_form(model, 0).singular_values, atol=1e-5)
