"""What a retrain trains (--train qk|attn|all) and the KL term that keeps it near its start
(--kl): frozen parameters do not move and get no optimizer state; the KL term equals a dense
computation of KL(p_start || p_model) and shares the frozen weights instead of copying them."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import finetune
from attn_core import regularizers as R
from attn_core.retraining.job import TrainingJob
from attn_core.tasks import get_task
from attn_core.training.config import JobConfig


def _names(model, train, regs, fixed=()):
    penalty = R.build_penalty(regs, model)
    return finetune.select_trainable(model, train, finetune.regularized_layers(penalty), fixed)


def test_what_each_choice_trains(tiny_model):
    model = tiny_model("induction", n_layers=2, attn_bias=True, d_mlp=32)
    assert _names(model, "qk", ["entropy@L1H0=0.1"]) == [
        "blocks.1.attn.W_Q",
        "blocks.1.attn.W_K",
        "blocks.1.attn.b_Q",
        "blocks.1.attn.b_K",
    ]
    assert _names(model, "qk", ["entropy@L1=0"]) == _names(model, "qk", ["entropy@L1=0.1"])  # a baseline trains alike
    assert {n.split(".")[1] for n in _names(model, "qk", [])} == {"0", "1"}  # no regularizer: every layer
    attn = _names(model, "attn", ["entropy=0.1"])
    assert len(attn) == 2 * 8 and all(".attn." in n for n in attn)
    everything = _names(model, "all", [], fixed={"unembed.b_U"})
    assert len(everything) == len(list(model.parameters())) - 1 and "unembed.b_U" not in everything
    assert not model.unembed.b_U.requires_grad
    merged = tiny_model("induction", qk="merged")
    assert _names(merged, "qk", ["entropy=0.1"]) == ["blocks.0.attn.W_QK"]
    with pytest.raises(ValueError, match="--train must be one of all, attn, qk"):
        _names(model, "mlp", [])


def test_qk_training_moves_only_the_form_and_keeps_no_state_for_the_rest():
    job = TrainingJob.open(
        JobConfig(source="induction-2l", regularizers=["entropy@L1=0.5"], train="qk", steps=3, lr=1e-2), store=False
    )
    before = {n: p.detach().clone() for n, p in job.model.named_parameters()}
    assert job.run()["status"] == "completed"
    moved = {n for n, p in job.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved == {"blocks.1.attn.W_Q", "blocks.1.attn.W_K"}
    state = job.trainer.optimizer.state
    assert {id(p) for p in state} == {id(job.model.blocks[1].attn.W_Q), id(job.model.blocks[1].attn.W_K)}
    assert job.retraining.details(job.model, job.task)["trained"] == {
        "train": "qk",
        "kl": 0.0,
        "tensors": 2,
        "parameters": 2 * 4 * 64 * 16,
    }


def test_kl_term_equals_a_dense_computation(tiny_model):
    """KL(p_start || p_model) per position, against float64 softmaxes of both models (fp32 logs:
    a relative 1e-3 of a KL of order 1e-2)."""
    model = tiny_model("reverse", std=0.3, n_layers=2, d_mlp=16)
    finetune.select_trainable(model, "qk", {1})
    kl = finetune.KLPenalty(2.0, model.cfg)
    batch = get_task("reverse").sample(4, seed=0)
    cache: dict = {}
    model(batch.tokens, cache=cache)
    assert float(kl(model, batch, cache)["kl"].detach()) == pytest.approx(
        0.0, abs=1e-6
    )  # the start is the model itself
    ref = kl.reference
    shared = dict(ref.named_parameters())
    for n, p in model.named_parameters():  # frozen: the same storage; trainable: a copy
        assert (shared[n].data_ptr() == p.data_ptr()) == (not p.requires_grad), n
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        model.blocks[1].attn.W_Q.add_(
            torch.randn(model.blocks[1].attn.W_Q.shape, generator=torch.Generator().manual_seed(1))
        )
    cache = {}
    model(batch.tokens, cache=cache)
    term = kl(model, batch, cache)["kl"]
    fresh = tiny_model("reverse", std=0.3, n_layers=2, d_mlp=16)
    fresh.load_state_dict(start)
    with torch.no_grad():
        p_ref = torch.softmax(fresh(batch.tokens).double(), -1)
        logp = torch.log_softmax(model(batch.tokens).double(), -1)
    dense = (p_ref * (p_ref.log() - logp)).sum(-1).mean()
    assert float(term.detach()) == pytest.approx(2.0 * float(dense), rel=1e-3) and float(term.detach()) > 1e-3
    term.backward()
    assert model.blocks[1].attn.W_Q.grad is not None and model.blocks[1].attn.W_Q.grad.abs().sum() > 0
    assert all(p.grad is None for p in ref.parameters())


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 9),
    v=st.integers(2, 40),
    rows_bytes=st.sampled_from([1, 100, 2**24]),
    seed=st.integers(0, 2**16),
)
def test_mean_kl_and_its_gradient_equal_the_dense_formula(n, v, rows_bytes, seed):
    """finetune.mean_kl (row chunks of any size, its own backward) against autograd through the
    dense float64 formula mean_rows sum_v p (log p - log_softmax(z)): value and gradient."""
    g = torch.Generator().manual_seed(seed)
    z = (3 * torch.randn(n, v, generator=g, dtype=torch.float64)).requires_grad_()
    log_p = torch.log_softmax(3 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
    weights = torch.randn((), generator=g, dtype=torch.float64)  # a gradient arriving from above
    dense = (log_p.exp() * (log_p - torch.log_softmax(z, -1))).sum(-1).mean()
    (want,) = torch.autograd.grad(weights * dense, z)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(finetune, "ROWS_BYTES", rows_bytes)
        got = finetune.mean_kl(z, log_p)
        (grad,) = torch.autograd.grad(weights * got, z)
    assert float(got.detach()) == pytest.approx(float(dense.detach()), rel=1e-9, abs=1e-12)
    assert torch.allclose(grad, want, rtol=1e-9, atol=1e-12)


def test_kl_needs_the_forward_cache(tiny_model):
    model = tiny_model("reverse")
    with pytest.raises(ValueError, match="reads blocks.0.hook_resid_post"):
        finetune.KLPenalty(1.0, model.cfg)(model, get_task("reverse").sample(2), {})


def test_kl_keeps_a_retrain_closer_to_its_start():
    """The same retrain with and without --kl: the KL term is logged, and the model moves less."""

    def run(kl: float):
        cfg = JobConfig(source="reverse-1l", regularizers=["entropy=1"], steps=15, lr=1e-2, kl=kl, seed=1)
        job = TrainingJob.open(cfg, store=False)
        start = [p.detach().clone() for p in job.model.parameters()]
        job.run()
        moved = sum(float((p.detach() - s).norm() ** 2) for p, s in zip(job.model.parameters(), start)) ** 0.5
        return job, moved

    plain, far = run(0.0)
    kept, near = run(20.0)
    assert "term:kl" in set(kept.snapshot().metrics()["name"]) and "term:kl" not in set(
        plain.snapshot().metrics()["name"]
    )
    assert near < far


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(train="mlp"), "train must be one of all, attn, qk"),
        (dict(kl=-1), "kl must be a number in 0..1e6"),
        (dict(kl=True), "kl must be a number"),
        (dict(text_field="body"), "--text-field and --eval-text need --text"),
        (dict(eval_text="x.txt"), "--text-field and --eval-text need --text"),
        (dict(block=64), "--block needs --text"),
        (dict(text="c.txt", block=1), "block must be an integer of at least 2"),
        (dict(text=""), "text must be a path"),
    ],
)
def test_bad_settings_are_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as e:
        JobConfig(source="reverse-1l", **changes)
    assert "\n" not in str(e.value)


def test_the_command_names_the_new_flags():
    cfg = JobConfig(source="m", text="my text.txt", text_field="body", block=64, train="qk", kl=0.5)
    assert cfg.command().endswith("--text 'my text.txt' --text-field body --block 64 --train qk --kl 0.5")
    assert JobConfig(**{k: v for k, v in cfg.to_dict().items() if k != "regularizers"}).command() == cfg.command()


def test_the_kl_term_asks_only_for_the_last_residual_stream(tiny_model):
    """A penalty's cache() names what the forward keeps: with the KL term the regularizers'
    Q and K plus the last residual stream, so the other layers keep their fused attention."""
    model = tiny_model("induction", n_layers=2)
    regs = R.build_penalty(["entropy@L1=0.1"], model)
    combined, _ = finetune.setup(model, "all", 0.5, regs)
    names = combined.cache().names
    assert names == set(regs.cache().names) | {"blocks.1.hook_resid_post"}
    alone, _ = finetune.setup(model, "all", 0.5, R.build_penalty([], model))
    assert isinstance(alone, finetune.KLPenalty) and alone.cache().names == {"blocks.1.hook_resid_post"}
    plain, _ = finetune.setup(model, "all", 0.0, regs)
    assert plain is regs  # no KL: the regularizers' own penalty, unwrapped
    assert finetune.setup(model, "all", 0.0, R.build_penalty([], model))[0] is None


def test_the_kl_term_stays_on_the_models_device(tiny_model):
    """On the meta device (CUDA's stand-in): the starting model, its forward and the term are
    all made where the model is."""
    model = tiny_model("reverse", n_layers=2).to("meta")
    finetune.select_trainable(model, "qk", {1})
    kl = finetune.KLPenalty(1.0, model.cfg)
    kl.start(model)
    assert {p.device.type for p in kl.reference.parameters()} == {"meta"}
    assert {b.device.type for b in kl.reference.buffers()} == {"meta"}
    tokens = get_task("reverse").sample(2).tokens.to("meta")
    cache = kl.cache()
    model(tokens, cache=cache)
    term = kl(model, get_task("reverse").sample(2).to("meta"), cache)["kl"]
    assert term.device.type == "meta" and term.shape == ()
    term.backward()  # mean_kl's own backward too
    assert model.blocks[1].attn.W_Q.grad.device.type == "meta"
