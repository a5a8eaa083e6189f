"""Softmax row entropy and first-key (sink) mass from one fused attention pass
(attn_core/regularizers/flash_rows.py, issue 34) against an independent dense computation: the
[b, h, T, T] scores formed, softmax, entropy -sum p log p and p_i0 by formula, gradients by
autograd through them in float64.

Tolerances: float32 inputs against the float64 dense reference, 1e-5 (1 + max |s|) absolute on
values and 1e-5 (1 + max |s|) max |w| on the gradients of sum w * value (H = lse - E_p[s] and the
kernel's dS = p (dP - D) cancel numbers of the size of the largest score s; measured: under 1e-6
of that over 300 draws); float64 inputs to 1e-10.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_core import regularizers as R
from attn_core.hooks import Cache, act_name
from attn_core.model import ModelConfig, Transformer
from attn_core.regularizers import flash_rows
from attn_core.regularizers.rows import fused_kernel, head_means, row_values


def dense_rows(q, k, scale, window):
    """(entropy, mass on key 0) of every row of the dense masked softmax, [b, h, T] each."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    T = k.shape[2]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    visible = torch.ones(T, T, dtype=torch.bool)
    if window is not None:
        visible = (j <= i) & ((i - j < window) if window > 0 else True)
    S = (scale * q @ k.transpose(-1, -2)).masked_fill(~visible, -1e30)
    P = S.softmax(-1)
    return -(P * S.log_softmax(-1)).sum(-1), P[..., 0]


@st.composite
def problems(draw):
    h_kv = draw(st.integers(1, 2))
    return dict(
        b=draw(st.integers(1, 2)), h=h_kv * draw(st.integers(1, 3)), h_kv=h_kv, T=draw(st.integers(1, 24)),
        d=draw(st.sampled_from([1, 4, 8])), window=draw(st.sampled_from([None, 0, 1, 2, 5, 40])),
        scale=draw(st.sampled_from([0.25, 1.0, 2.0])), seed=draw(st.integers(0, 2**16)),
    )  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_fused_rows_equal_the_dense_softmax(p):
    """Entropy and sink mass of every row, and their gradients in q and k (grouped-query keys
    shared by query heads), causal, windowed and unmasked, in float32 against float64 dense."""
    g = torch.Generator().manual_seed(p["seed"])
    q = torch.randn(p["b"], p["h"], p["T"], p["d"], generator=g, dtype=torch.float64).requires_grad_()
    k = torch.randn(p["b"], p["h_kv"], p["T"], p["d"], generator=g, dtype=torch.float64).requires_grad_()
    H_ref, sink_ref = dense_rows(q, k, p["scale"], p["window"])
    tol = 1e-5 * (1 + float((p["scale"] * q @ k.repeat_interleave(p["h"] // p["h_kv"], 1).mT).abs().max()))
    q32, k32 = q.detach().float().requires_grad_(), k.detach().float().requires_grad_()
    H, lse = flash_rows.entropy_and_lse(q32, k32, scale=p["scale"], window=p["window"])
    sink = flash_rows.sink_mass(q32, k32, lse, p["scale"], p["window"])
    assert H.dtype == sink.dtype == torch.float32
    torch.testing.assert_close(H.double(), H_ref, atol=tol, rtol=0)
    torch.testing.assert_close(sink.double(), sink_ref, atol=tol, rtol=0)
    w_H, w_sink = torch.randn(H.shape, generator=g, dtype=torch.float64), torch.randn(H.shape, generator=g).double()
    for got, ref in ((H, H_ref), (sink, sink_ref), (H + sink, H_ref + sink_ref)):  # each output alone, and both
        w = w_H if got is H else w_sink
        dense = torch.autograd.grad((ref * w).sum(), (q, k), retain_graph=True)
        fused = torch.autograd.grad((got * w.float()).sum(), (q32, k32), retain_graph=True)
        for a, b in zip(fused, dense):
            torch.testing.assert_close(a.double(), b, atol=tol * float(w.abs().max()), rtol=0)


def test_float64_rows_equal_the_dense_softmax_to_1e_10():
    g = torch.Generator().manual_seed(0)
    q = (3 * torch.randn(2, 4, 33, 8, generator=g, dtype=torch.float64)).requires_grad_()
    k = torch.randn(2, 2, 33, 8, generator=g, dtype=torch.float64).requires_grad_()
    for window in (0, 6):
        H, lse = flash_rows.entropy_and_lse(q, k, scale=0.5, window=window)
        H_ref, _ = dense_rows(q, k, 0.5, window)
        torch.testing.assert_close(H, H_ref, atol=1e-10, rtol=0)
        for a, b in zip(torch.autograd.grad(H.sum(), (q, k)), torch.autograd.grad(H_ref.sum(), (q, k))):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_kernel_choice_is_a_function_of_device_dtype_and_mask():
    bf16, f32 = torch.bfloat16, torch.float32
    assert flash_rows.choose_kernel("cpu", f32, 64, 8, 3) == "cpu"  # the CPU kernel takes a [T, T] window mask
    assert flash_rows.choose_kernel("meta", bf16, 64, 0, 768) == "cpu"
    assert flash_rows.choose_kernel("cuda", bf16, 64, 0, 64) == "flash"
    assert flash_rows.choose_kernel("cuda", torch.float16, 64, None, 128) == "flash"
    assert flash_rows.choose_kernel("cuda", f32, 64, 0, 64) == "efficient"
    assert flash_rows.choose_kernel("cuda", bf16, 64, 64, 64) == "flash"  # a window of T keys is causal
    assert flash_rows.choose_kernel("cuda", bf16, 64, 8, 64) is None  # a window on CUDA: query blocks
    assert flash_rows.choose_kernel("cuda", bf16, 64, 0, 768) is None  # merged heads' d_model: too wide
    assert flash_rows.choose_kernel("cuda", f32, 64, 0, 12) is None  # not a multiple of 8
    assert flash_rows.choose_kernel("mps", f32, 64, 0, 64) is None


def test_which_rows_take_the_fused_path():
    q = torch.zeros(1, 2, 8, 4)
    assert fused_kernel(q, "entropy", 0, None, None, 1.0, "auto") == "cpu"
    assert fused_kernel(q, "entropy", 0, None, None, 1.0, "blocked") is None
    for kind, key_mask, positions, alpha in [
        ("topk", None, None, 1.0),
        ("hoyer", None, None, 1.0),
        ("entropy", torch.ones(1, 8, dtype=torch.bool), None, 1.0),
        ("entropy", None, torch.arange(3), 1.0),
        ("entropy", None, None, 1.5),
    ]:
        assert fused_kernel(q, kind, 0, key_mask, positions, alpha, "auto") is None
        with pytest.raises(ValueError, match="fused penalty path"):
            fused_kernel(q, kind, 0, key_mask, positions, alpha, "flash")
    with pytest.raises(ValueError, match="unknown penalty path"):
        row_values(q, q, "entropy", path="fast")
    with pytest.raises(ValueError, match="unknown penalty path"):
        R.build_penalty(["entropy=1"], ModelConfig(n_layers=1, n_heads=2, d_model=8, d_head=4), path="fast")


@pytest.mark.parametrize(("kernel", "dtype", "window"), [("cpu", torch.float32, 0), ("cpu", torch.bfloat16, 3),
                                                          ("flash", torch.bfloat16, 0), ("efficient", torch.float32, None)])  # fmt: skip
def test_every_kernel_runs_on_the_meta_device(kernel, dtype, window):
    """Forward and backward of each kernel's code (CUDA's included) on meta: shapes, dtypes and
    the device follow q; the efficient kernel's padded lse is cut to the rows."""
    q = torch.empty(2, 4, 37, 8, device="meta", dtype=dtype, requires_grad=True)
    k = torch.empty(2, 2, 37, 8, device="meta", dtype=dtype, requires_grad=True)
    H, lse = flash_rows.entropy_and_lse(q, k, scale=0.35, window=window, kernel=kernel)
    sink = flash_rows.sink_mass(q, k, lse, 0.35, window)
    assert H.shape == lse.shape == sink.shape == (2, 4, 37) and H.dtype == torch.float32
    dq, dk = torch.autograd.grad((H + sink).sum(), (q, k))
    assert dq.shape == q.shape and dk.shape == k.shape and dq.device.type == dk.device.type == "meta"
    assert dq.dtype == dk.dtype == dtype


def test_bf16_rows_reduce_in_float32():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 40, 8, generator=g), torch.randn(2, 3, 40, 8, generator=g)
    exact = row_values(q, k, "entropy")
    qb, kb = q.bfloat16().requires_grad_(), k.bfloat16().requires_grad_()
    low = row_values(qb, kb, "entropy")
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, exact, atol=2e-2, rtol=0)  # bf16 inputs: about 3 significant digits
    low.sum().backward()
    assert qb.grad.dtype == kb.grad.dtype == torch.bfloat16


def model_with(**config) -> Transformer:
    cfg = ModelConfig(**{**dict(n_layers=2, n_heads=4, d_model=16, d_head=4, n_ctx=16, d_vocab=16), **config})
    model = Transformer(cfg).double()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model


def test_the_model_penalty_equals_the_dense_pattern_with_rotary_gqa_and_a_window():
    """The every-head entropy penalty of a rotary, grouped-query model with a sliding window on
    one layer (fused path) equals the one read from the dense patterns, value and every
    parameter's gradient, and the blocked path's."""
    model = model_with(positional="rotary", n_kv_heads=2, normalization="rmsnorm", sliding_window=[0, 5])
    tokens = torch.randint(0, 16, (2, 16), generator=torch.Generator().manual_seed(1))
    params = list(model.parameters())
    terms = {}
    for path in ("auto", "blocked"):
        pen = R.build_penalty(["entropy=1"], model, path=path)
        cache = pen.cache()
        model(tokens, cache=cache)
        terms[path] = pen(model, None, cache)["entropy"]
    patterns = Cache(act_name("pattern", l) for l in range(2))
    model(tokens, cache=patterns)
    terms["dense"] = R.build_penalty(["entropy=1"], model)(model, None, patterns)["entropy"]
    grads = {p: torch.autograd.grad(t, params, allow_unused=True) for p, t in terms.items()}
    for path in ("auto", "blocked"):
        torch.testing.assert_close(terms[path], terms["dense"], atol=1e-10, rtol=0)
        for a, b in zip(grads[path], grads["dense"]):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_training_with_the_entropy_penalty_runs_on_the_fused_path():
    """A few Trainer steps with every-head entropy: the fused path and the blocked one give the
    same losses (float32, 1e-4), and the fused kernel's backward runs."""
    from attn_core.tasks import get_task
    from attn_core.training.config import TrainConfig
    from attn_core.training.trainer import Trainer, init_model

    task = get_task("reverse")
    cfg = ModelConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, d_vocab=task.d_vocab, n_ctx=task.n_ctx)
    losses = {}
    for path in ("auto", "blocked"):
        pen = R.build_penalty(["entropy=0.1"], init_model(cfg, 0), path=path)
        trainer = Trainer(
            init_model(cfg, 0), task, TrainConfig(steps=3, batch_size=4, eval_every=100, device="cpu"), penalty=pen
        )
        losses[path] = [trainer.step() for _ in range(3)]
    for a, b in zip(losses["auto"], losses["blocked"]):
        assert math.isfinite(a["entropy"]) and a["entropy"] > 0
        assert a["entropy"] == pytest.approx(b["entropy"], abs=1e-4)


def test_head_means_on_the_fused_path_equal_the_blocked_means():
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 4, 30, 8, generator=g), torch.randn(2, 4, 30, 8, generator=g)
    for window in (None, 0, 4):
        fused = head_means(q, k, "entropy", window=window, scale=0.5, path="flash")
        blocked = head_means(q, k, "entropy", window=window, scale=0.5, path="blocked")
        torch.testing.assert_close(fused, blocked, atol=1e-5, rtol=0)


class CountBackwardPasses(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the CPU kernel's backward calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default:
            self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["entropy", "sink"])
def test_one_backward_pass_per_penalty_eager_and_compiled(kind):
    """Entropy needs the kernel's backward once, the sink mass once (its lse): also compiled,
    where an unused output would get a zero gradient (and a wasted pass) if it were differentiable."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 16, 4, generator=g).requires_grad_()
    k = torch.randn(2, 2, 16, 4, generator=g).requires_grad_()

    def f(q, k):
        return row_values(q, k, kind, window=0, scale=0.5).sum()

    torch._dynamo.reset()
    for fn in (f, torch.compile(f, backend="aot_eager", fullgraph=True)):
        loss = fn(q, k)
        with CountBackwardPasses() as counter:
            loss.backward()
        assert counter.calls == 1
    H, lse = flash_rows.entropy_and_lse(q, k, needs=("lse",))
    assert lse.requires_grad and not H.requires_grad
    with pytest.raises(ValueError, match="needs names"):
        flash_rows.entropy_and_lse(q, k, needs=("sink",))
