"""What a live job measures, made cheap (issue 28), against what it measured before: the per-head
summaries from Q and K in blocks of rows against the dense patterns, the vocabulary view in
blocks against the dense V x V view, the batched sigma_1(B(delta)) against one SVD per head and
offset, the text measurement (sized by tokens, one read) against the measurement it replaces,
figure by figure, to a stated tolerance (float32 rounding: 1e-5); the watched head's pattern
against the model's own; a job nobody watches computes no pattern."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attn_core import metrics
from attn_core import regularizers as R
from attn_core.bilinear import model_form
from attn_core.bilinear.offsets import default_offsets, offset_form, sigma1_offsets, sigma1_summaries
from attn_core.hooks import act_name
from attn_core.regularizers.penalty import vocab_rows
from attn_core.regularizers.summaries import mean_rows
from attn_core.tasks import get_task
from attn_core.text import measure as M
from attn_core.text.task import TextData, text_task
from attn_core.training import telemetry
from attn_core.training.config import JobConfig, TrainConfig
from attn_core.training.trainer import eval_tokens
from tests.conftest import make_tiny_model

TOL = dict(rel=1e-5, abs=1e-6)
KINDS = {
    "factored": {},
    "merged": {"qk": "merged"},
    "biased": {"attn_bias": True},
    "rotary-gqa": {"positional": "rotary", "n_kv_heads": 1, "normalization": "rmsnorm"},
    "entmax15": {"entmax_alpha": 1.5},
    "grown": {"d_qk": [[8, 5]]},
    "window": {"n_layers": 2, "sliding_window": [3, 0]},
}


def _model(kind: str, **extra):
    return make_tiny_model("reverse", std=0.3, **{**KINDS[kind], **extra})


def _dense_vocab(model, heads=None):
    """The vocabulary view's summaries as they were computed: the dense V x V rows of every head."""
    out = {k: torch.full((model.cfg.n_layers, model.cfg.n_heads), math.nan) for k in ("entropy", "top1")}
    for layer, hs in R.heads.by_layer(heads or R.all_heads(model.cfg)).items():
        P = vocab_rows(model, layer, hs).float()
        out["entropy"][layer, hs] = mean_rows(metrics.normalized_entropy(P), P.shape, None)
        out["top1"][layer, hs] = mean_rows(metrics.topk_mass(P, 1), P.shape, None)
    return out


@pytest.mark.parametrize("kind", list(KINDS))
def test_summaries_from_q_and_k_equal_the_dense_patterns(kind):
    model = _model(kind)
    tokens = get_task("reverse").sample(5, 0).tokens
    with torch.no_grad():
        names = [act_name("pattern", l) for l in range(model.cfg.n_layers)]
        _, patterns = model.run_with_cache(tokens, names_filter=names)
        model(tokens, cache=(qk := R.qk_cache(model)))
    assert not any("pattern" in n for n in qk)  # only Q and K were kept: every layer stayed fused
    dense, blocked = R.data_concentration(model, patterns), R.data_concentration(model, qk)
    for k in dense:
        torch.testing.assert_close(blocked[k], dense[k], rtol=1e-5, atol=1e-6)
    vocab, ref = R.vocab_concentration(model), _dense_vocab(model)
    for k in ref:
        torch.testing.assert_close(vocab[k], ref[k], rtol=1e-5, atol=1e-6)


def test_row_summaries_in_small_blocks_equal_one_block():
    q, k = torch.randn(2, 3, 37, 4, generator=torch.Generator().manual_seed(1)).unbind(0)
    q, k = q[None] * 2, k[None]
    one = R.row_summaries(q, k, block=64)
    for block in (1, 5, 16):
        for a, b in zip(R.row_summaries(q, k, block=block), one):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_batched_sigma1_over_the_offsets_equals_one_svd_per_matrix():
    model = _model("rotary-gqa", n_layers=2)
    heads = [(1, 1), (0, 0), (1, 0)]  # any order, several layers
    got = sigma1_offsets(model, heads)
    offsets = default_offsets(model)
    for i, (l, h) in enumerate(heads):
        ref = offset_form(model, l, h, offsets).singular_values[:, 0]
        torch.testing.assert_close(got[i], ref, rtol=1e-5, atol=1e-6)
    summary = sigma1_summaries(model, heads, offsets=[-1, -3])  # B(0) measured beside offsets without it
    assert summary[0]["sigma1_at_0"] == pytest.approx(
        float(offset_form(model, 1, 1, [0]).singular_values[0, 0].detach()), **TOL
    )
    assert summary[0]["offsets"] == 2


# --- the text measurement: every figure it showed ---------------------------------------------------------


@pytest.fixture
def text_setup():
    rng = np.random.default_rng(0)
    data = TextData(rng.integers(0, 100, 4000), rng.integers(0, 100, 700), 8, 100, None, {"tokens": 4700})
    model = make_tiny_model("reverse", std=0.3, d_vocab=100, n_ctx=8, n_layers=2, positional="rotary",
                            n_kv_heads=1, normalization="rmsnorm")  # fmt: skip
    return text_task(data), model


def _old_measure(model, task, heads, samples, seed):
    """The measurement as it was before issue 28: every layer's pattern cached per chunk, dense
    summaries, the host read chunk by chunk, one SVD per head and offset."""
    heads = R.parse_heads(heads, model.cfg)
    batch = task.sample(min(samples, task.data.held_out_blocks), seed + M.EVAL_SEED_OFFSET, split="test")
    names = [act_name("pattern", l) for l in R.heads.by_layer(heads)]
    with torch.no_grad():
        logits, cache = model.run_with_cache(batch.tokens, names_filter=names)
    flat, targets = logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1)
    loss = float(F.cross_entropy(flat, targets))
    data = {k: v.cpu() for k, v in R.data_concentration(model, cache, heads).items()}
    ev = {"accuracy": float((flat.argmax(-1) == targets).float().mean()), "loss": loss, "samples": len(batch.tokens)}
    out = telemetry.run_measurement(model, heads, ev, data, _dense_vocab(model, heads))
    for row in out["per_head"]:
        sv = offset_form(model, row["layer"], row["index"], default_offsets(model)).singular_values[:, 0]
        row["offset_sigma1"] = dict(sigma1_at_0=float(sv[0]), sigma1_min=float(sv.min()),
                                    sigma1_mean=float(sv.mean()), sigma1_max=float(sv.max()), offsets=len(sv))  # fmt: skip
    return {**out, "perplexity": math.exp(loss), "tokens": targets.numel()}


def _same(new, old, path=""):
    if isinstance(old, dict):
        assert set(new) == set(old), path
        for k in old:
            _same(new[k], old[k], f"{path}.{k}")
    elif isinstance(old, list):
        assert len(new) == len(old), path
        for i, (a, b) in enumerate(zip(new, old)):
            _same(a, b, f"{path}[{i}]")
    elif isinstance(old, float):
        assert new == pytest.approx(old, **TOL), path
    else:
        assert new == old, path


@pytest.mark.parametrize("heads", [None, "L1H0,L0"])
def test_the_text_measurement_keeps_every_figure_it_showed(text_setup, heads):
    """Everything the CLI, the Runs page, the card and the export read from a measurement: the
    keys, the means, every head's entropy, top-1 mass, vocabulary view, spectrum, stable rank and
    sigma_1(B(delta)) summary, the loss, perplexity and accuracy: the same to 1e-5."""
    task, model = text_setup
    new = M.text_metrics(model, task, heads, samples=40, seed=2)
    old = _old_measure(model, task, heads, samples=40, seed=2)
    _same(new, old)
    assert new["samples"] == 40 and new["tokens"] == 320


def test_the_measurement_is_sized_by_tokens(text_setup):
    task, model = text_setup
    assert task.data.held_out_blocks == 87
    assert M.held_out_count(task, 512) == 87 and M.held_out_count(task, 512, tokens=100) == 13
    assert M.held_out_count(task, 5, tokens=10**6) == 5 and M.held_out_count(task, 512, tokens=1) == 1
    small = M.text_metrics(model, task, None, samples=512, seed=2, tokens=100)
    assert small["samples"] == 13 and small["tokens"] == 104
    # the same blocks, first of the same order, as the measurement of all of them
    assert small["loss"] == pytest.approx(M.evaluate_text(model, task, 13, seed=2)["loss"], **TOL)
    # a run's evaluation: a share of what it trains between evaluations, at least one batch
    cfg = TrainConfig(steps=1000, batch_size=8, eval_every=100)
    assert eval_tokens(cfg, 128) == 8 * 128 * 7
    assert eval_tokens(TrainConfig(steps=3, batch_size=4, eval_every=100), 16) == 4 * 16
    # a job's measurement: a share of the whole run, at least a batch and MIN_MEASURE_TOKENS
    assert telemetry.measure_tokens(cfg, task) == math.ceil(telemetry.MEASURE_SHARE * 1000 * 8 * 8)
    assert telemetry.measure_tokens(TrainConfig(steps=2, batch_size=4), task) == telemetry.MIN_MEASURE_TOKENS
    assert telemetry.measure_tokens(cfg, get_task("reverse")) is None  # a toy measures its samples


def test_bf16_measurement_is_close_to_fp32(text_setup):
    task, model = text_setup
    fp32 = M.text_metrics(model, task, None, samples=40, seed=2)
    bf16 = M.text_metrics(model, task, None, samples=40, seed=2, precision="bf16")
    assert bf16["loss"] == pytest.approx(fp32["loss"], rel=2e-2)
    assert bf16["entropy_data"] == pytest.approx(fp32["entropy_data"], abs=2e-2)
    assert bf16["stable_rank"] == fp32["stable_rank"]  # spectra are float32 whatever the run's precision


# --- telemetry: what the live pages draw ---------------------------------------------------------------


def test_the_watched_heads_pattern_is_the_models_own():
    model = _model("window")
    tokens = get_task("reverse").sample(1, 4).tokens[0]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[None], names_filter=[act_name("pattern", 0)])
    A = cache[act_name("pattern", 0)][0]
    np.testing.assert_allclose(telemetry.probe_pattern(model, tokens, 0, 1), A[1].numpy(), rtol=1e-5, atol=1e-6)
    every = telemetry.probe_patterns(model, tokens)
    assert every.shape == (2, model.cfg.n_heads, len(tokens), len(tokens))
    np.testing.assert_allclose(every[0], A.numpy(), rtol=1e-5, atol=1e-6)


def test_a_job_computes_the_pattern_of_the_head_watched_and_no_other(tmp_path):
    from attn_core import checkpoint
    from attn_core.retraining.job import TrainingJob

    src = str(checkpoint.save(make_tiny_model(n_layers=2), tmp_path / "m", {"task": "reverse"}))
    cfg = JobConfig(src, {"entropy": 0.1}, steps=10**6, device="cpu", telemetry_every=5, probe_samples=4)
    job = TrainingJob.open(cfg, store=False).start()
    try:
        deadline = time.monotonic() + 60
        while job.snapshot().step < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert job.snapshot().probe_pattern is None  # nobody watches: nothing left the model's device
        job.pause()
        while job.snapshot().status != "paused" and time.monotonic() < deadline:
            time.sleep(0.01)
        job.watch(1, 0)  # picked while paused: shown at once
        while job.snapshot().pattern_of(1, 0) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        snap = job.snapshot()
        assert snap.probe_head == (1, 0) and snap.pattern_of(0, 1) is None
        np.testing.assert_allclose(
            snap.pattern_of(1, 0), telemetry.probe_pattern(job.model, job.probe.tokens[0], 1, 0), rtol=1e-6
        )
        with pytest.raises(ValueError, match="outside this model"):
            job.watch(2, 0)
    finally:
        job.stop()
        job.join(60)
    assert job.snapshot().status == "stopped"
    final = job.pattern(0, 1)  # another head of the ended run: from its final weights
    np.testing.assert_allclose(final, telemetry.probe_pattern(job.model_copy(), job.probe.tokens[0], 0, 1), rtol=1e-6)


def test_spectra_are_read_in_one_copy_and_equal_the_form():
    model = _model("grown")
    spec = R.head_spectra(model)
    form = model_form(model)
    torch.testing.assert_close(spec["singular_values"], form.singular_values.float().detach())
    torch.testing.assert_close(spec["stable_rank"], form.stable_rank.float().detach())


# --- the before/after views of a run on text read held-out text ------------------------------------------


def test_a_run_on_text_gives_its_views_held_out_blocks_of_its_text(tmp_path):
    """A text run has no toy task: its views' input (the Heatmaps page's before/after, the Runs
    page's heads side by side) is a held-out block of the text it trained on, the same block the
    task draws, never random tokens; a model without text says so in one line."""
    pytest.importorskip("transformers")
    from attn_core.retraining.job import TrainingJob
    from attn_core.runs import RunStore
    from attn_core.sources import resolve
    from attn_core.text import source as text_source
    from tests.conftest import write_tiny_hf
    from tests.text_corpus import make_text, write_word_tokenizer

    folder = tmp_path / "model"
    folder.mkdir()
    write_tiny_hf(folder, "llama", num_key_value_heads=2)
    write_word_tokenizer(folder)
    text = tmp_path / "text.txt"
    text.write_text(make_text(0, lines=150))
    store = RunStore()
    job = TrainingJob.open(JobConfig(str(folder), text=str(text), block=12, steps=2, device="cpu"), store=store)
    res = job.run()
    assert res["status"] == "completed"
    run = resolve(f"run:{res['run_id']}", store=store)
    parent = resolve(str(folder))
    assert text_source.has_sample(run) and not text_source.has_sample(parent)
    tokens = text_source.held_out_input(run, 3)
    assert tokens == job.task.sample(1, 3, split="test").tokens[0].tolist() and len(tokens) == 12
    held = job.task.data.held_out
    assert any(list(held[s : s + 12]) == tokens for s in range(0, len(held) - 11))  # held out, not trained on
    with pytest.raises(ValueError, match="has no task in its card"):
        text_source.held_out_input(parent, 0)
    text.unlink()  # the text is gone: one line that says so (cached tasks are per weights and settings)
    text_source._run_task.cache_clear()
    with pytest.raises(ValueError, match=str(text.name)):
        text_source.held_out_tokens(run, 0)


# --- the every-head penalty's blocks fused on an accelerator ---------------------------------------------


# one kind (about 20 s of compiling each): the three kinds share the wrapper and their eager arithmetic
# (softmax_rows), which the dense comparisons in tests/unit/test_penalty_rows.py cover
@pytest.mark.parametrize("kind", ["entropy"])
def test_fused_blocks_equal_eager_blocks_with_one_graph_for_every_block(monkeypatch, kind):
    """On a GPU each block of the row penalties runs through torch.compile (its scores and row
    arithmetic fused, issue 28); here the same wrapper runs on the CPU with the aot_eager backend
    (dynamo and AOTAutograd as inductor gets them): values and gradients equal the eager blocks',
    and blocks of every size (causal blocks see more keys as they go) share one traced graph."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from attn_core.regularizers import rows
    from attn_core.regularizers import softmax_rows as sr

    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 3, 70, 8, generator=g, dtype=torch.float64) * 2).unbind(0)
    q, k = q[None].requires_grad_(), k[None].requires_grad_()

    def run():
        values = rows.row_values(q, k, kind, window=0, block=16, topk=2, scale=0.5, path="blocked")
        return (values.detach(), *torch.autograd.grad((values * torch.arange(70.0, dtype=values.dtype)).sum(), (q, k)))

    eager = run()
    torch._dynamo.reset()
    counters.clear()
    for fused in (sr.fused_forward, sr.fused_backward):
        monkeypatch.setattr(fused, "devices", ["cpu"])
        monkeypatch.setattr(fused, "backend", "aot_eager")
        monkeypatch.setattr(fused, "compiled", None)
    got = run()
    assert sr.fused_forward.compiled is not None and not sr.fused_forward.failed
    assert sr.fused_backward.compiled is not None and not sr.fused_backward.failed
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # forward and backward: a first block whose rows and keys are as many, then every other block
    assert counters["stats"]["unique_graphs"] <= 4, counters["stats"]
    torch._dynamo.reset()
