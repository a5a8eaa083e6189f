"""The device part of a training step (attn_core/training/step.py): the static (masked) form of the
loss against the exact one, eager against compiled training (a stated tolerance), the fallback to
eager when compiling fails, and what the CPU path keeps (its data stream, its loss, PyTorch's
default AdamW)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import regularizers as R
from attn_core.tasks import TASKS, get_task
from attn_core.training.config import JobConfig, TrainConfig
from attn_core.training.step import StepGraph, masked_accuracy, masked_loss
from attn_core.training.trainer import Trainer
from tests.conftest import make_tiny_model

TASK = get_task("reverse")


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(TASKS)), seed=st.integers(0, 10_000), n=st.integers(1, 9))
def test_the_masked_loss_is_the_tasks_loss(name, seed, n):
    task = get_task(name)
    batch = task.sample(n, seed)
    logits = torch.randn(*batch.tokens.shape, task.d_vocab, generator=torch.Generator().manual_seed(seed)) * 3
    flat = logits.flatten(0, 1)
    loss = masked_loss(flat, batch.targets.flatten(), batch.mask.flatten())
    assert loss.item() == pytest.approx(task.loss(logits, batch).item(), rel=1e-6, abs=1e-7)
    acc = masked_accuracy(flat, batch.targets.flatten(), batch.mask.flatten())
    assert acc.item() == pytest.approx(task.accuracy(logits, batch), abs=1e-7)


def test_static_and_exact_steps_give_the_same_values_and_gradients():
    model = make_tiny_model(std=0.3)
    penalty = R.build_penalty(["entropy=0.1", "vocab_hoyer=0.05"], model)
    twin = copy.deepcopy(model)
    exact = StepGraph(model, TASK, penalty, torch.device("cpu"), "fp32")
    static = StepGraph(twin, TASK, penalty, torch.device("cpu"), "fp32")
    assert not exact.static
    static.static = True  # the form CUDA and compiled steps use, here on the CPU
    batch = TASK.sample(6, 3)
    index = batch.mask.flatten().nonzero().squeeze(1)
    a = exact(batch, type(batch)(batch.tokens, batch.targets.flatten(), index))
    b = static(batch)
    for x, y in zip(a[:3], b[:3]):
        assert x.item() == pytest.approx(y.item(), rel=1e-6)
    assert a[3].keys() == b[3].keys()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)


def test_the_cpu_path_keeps_its_stream_loss_and_optimizer():
    t = Trainer(make_tiny_model(), TASK, TrainConfig(steps=3, batch_size=4, device="cpu"))
    assert t.data.device.type == "cpu" and not t.graph.static and not t.graph.compiled
    assert not t.optimizer.defaults.get("fused")
    # the batches are the task's own, drawn from a CPU generator seeded like before
    assert torch.equal(t._batch()[0].tokens, TASK.sample(4, torch.Generator().manual_seed(0)).tokens)


def _train(compile: bool, steps: int = 6) -> tuple[Trainer, list[dict]]:
    model = make_tiny_model(d_model=12, d_head=6)
    rows: list[dict] = []
    cfg = TrainConfig(
        steps=steps, batch_size=4, eval_every=steps, eval_samples=8, warmup_steps=1, device="cpu", compile=compile
    )
    t = Trainer(model, TASK, cfg, callbacks=[rows.append], penalty=R.build_penalty(["entropy=0.1"], model))
    t.run()
    return t, rows


@pytest.mark.slow  # inductor's first compile on a fresh machine: about 25 s of CPU
def test_compiled_training_agrees_with_eager():
    """torch.compile (inductor, C++ on the CPU) against the eager loop, with a penalty: every
    step's loss, task loss, accuracy and penalty term within 1e-5 and the final weights within
    1e-5 (float rounding of fused kernels and of the masked mean, which AdamW carries a little)."""
    eager, a = _train(False)
    compiled, b = _train(True)
    assert compiled.graph.compiled and compiled.graph.note == "" and compiled.graph.static
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 7))
    for x, y in zip(a, b):
        for key in ("loss", "task_loss", "accuracy", "entropy"):
            assert y[key] == pytest.approx(x[key], abs=1e-5), (x["step"], key)
    for p, q in zip(eager.model.parameters(), compiled.model.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-5)


def test_a_step_that_cannot_compile_trains_eagerly_and_says_so():
    """No C++ compiler for inductor (a real failure of compiling): the step falls back to eager,
    the run completes and its message says why."""
    from torch._inductor import config as inductor

    from attn_core.training.record import record_run

    model = make_tiny_model(d_model=10, d_head=5)
    cfg = TrainConfig(steps=3, batch_size=4, eval_every=3, eval_samples=8, device="cpu", compile=True)
    t = Trainer(model, TASK, cfg)
    with inductor.patch({"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False}):
        outcome = record_run(t)
    assert outcome.status == "completed" and not t.graph.compiled
    assert "torch.compile failed" in outcome.message and "the step runs eagerly" in outcome.message
    assert t.step_index == 3 and all(torch.isfinite(p).all() for p in t.params)


def test_compile_is_a_checked_setting_recorded_in_the_command():
    assert JobConfig("reverse-1l", compile=True).command().endswith("--compile")
    assert JobConfig("reverse-1l", compile=True).train_config({}).compile is True
    with pytest.raises(ValueError, match="compile must be true or false"):
        TrainConfig(compile="yes")
    with pytest.raises(ValueError, match="compile must be true or false"):
        JobConfig("reverse-1l", compile=1)


def test_the_compiled_step_has_no_graph_break_and_no_recompile_after_warm_up(monkeypatch):
    """The compiled step (forward, loss, penalty, backward; the clipping; AdamW) is traced in its
    first step and never again, while the schedule changes the learning rate every step, with
    bf16 autocast inside the traced forward (whether a device has autocast is asked outside it:
    asking inside broke the graph there and retraced its remainder on every step, issue 28).
    Counted by dynamo's own counters, with the aot_eager backend (dynamo and AOTAutograd as
    inductor gets them, without its C++ compile)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from attn_core.training import step as step_module

    monkeypatch.setattr(step_module, "BACKEND", "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    model = make_tiny_model(d_model=12, d_head=6)
    cfg = TrainConfig(
        steps=8, batch_size=4, eval_every=8, eval_samples=8, warmup_steps=3, device="cpu", compile=True,
        precision="bf16",
    )  # fmt: skip
    t = Trainer(model, TASK, cfg, penalty=R.build_penalty(["entropy=0.1"], model))
    for _ in range(2):  # warm-up: the first trace of each region
        t.step()
    graphs, frames, breaks = counters["stats"]["unique_graphs"], dict(counters["frames"]), dict(counters["graph_break"])
    lrs = []
    for _ in range(5):
        lrs.append(t.step()["lr"])
    assert t.graph.compiled and t.graph.note == ""
    assert len(set(lrs)) == 5  # the learning rate changed every step ...
    assert counters["stats"]["unique_graphs"] == graphs and dict(counters["frames"]) == frames  # ... nothing retraced
    assert not counters["recompiles"] and dict(counters["graph_break"]) == breaks
    # three regions: the forward with its backward (one graph, no break), the clipping, the
    # optimizer's step; the only breaks are the optimizer's own (its no_grad boundary, and the
    # schedule's wrapper of step), as when torch.compile takes an optimizer's step alone
    b = t._batch()[0]
    forward = torch._dynamo.explain(t.graph._static_values)(b.tokens, b.targets, b.mask)
    assert forward.graph_count == 1 and forward.graph_break_count == 0
    assert all("Adam.step" in k or "graph_break()" in k for k in breaks), list(breaks)
    assert graphs == 3 and float(t.optimizer.param_groups[0]["lr"]) == pytest.approx(lrs[-1])
    torch._dynamo.reset()


def test_the_compiled_clipping_mutates_no_input_and_clips_as_clip_grad_norm():
    """Issue 34: ``skipping cudagraphs due to mutated inputs`` at the clipping (``_foreach_mul_``
    on the gradients) kept the compiled step off CUDA graphs. The compiled form returns new
    gradients: its traced graph (dynamo's, as inductor gets it) holds no in-place op, and its
    products are ``clip_grad_norm_``'s."""
    from attn_core.training.step import clip_gradients, clipped_gradients

    graphs = []

    def keep(gm, inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(5, 3, generator=g) * 10, torch.randn(7, generator=g)]
    total, scaled = torch.compile(clipped_gradients, backend=keep, fullgraph=True)([x.clone() for x in grads], 1.0)
    torch._dynamo.reset()
    assert len(graphs) == 1
    called = [n.target for n in graphs[0].graph.nodes if n.op in ("call_function", "call_method")]
    names = [getattr(t, "__name__", str(t)) for t in called]
    assert not [n for n in names if n.endswith("_") and not n.endswith("__")], names  # no in-place op
    params = [torch.nn.Parameter(torch.zeros_like(x)) for x in grads]
    for p, x in zip(params, grads):
        p.grad = x.clone()
    expected = torch.nn.utils.clip_grad_norm_(params, 1.0)
    assert torch.equal(total, expected) and all(torch.equal(a, p.grad) for a, p in zip(scaled, params))
    for p, x in zip(params, grads):
        p.grad = x.clone()
    assert torch.equal(clip_gradients(params, 1.0), expected)


def test_the_compile_time_is_measured_apart(monkeypatch):
    """The first call of each compiled region (tracing, compiling and one run) is counted in
    ``StepGraph.compile_s``; an eager step compiles nothing."""
    from attn_core.training import step as step_module

    monkeypatch.setattr(step_module, "BACKEND", "aot_eager")
    torch._dynamo.reset()
    compiled, eager = _train(True, steps=2)[0], _train(False, steps=2)[0]
    torch._dynamo.reset()
    assert compiled.graph.compiled and compiled.graph._first == {"forward", "clip", "update"}
    assert compiled.graph.compile_s > 0 and eager.graph.compile_s == 0
