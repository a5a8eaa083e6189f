"""Device discipline on a CPU-only machine (issue 21): PyTorch's ``meta`` device stands in for
CUDA. Every tensor attn_core makes must take the device (and dtype) of the tensors it meets; a
tensor made on the CPU that meets a model on a GPU fails there with "Expected all tensors to be on
the same device", and here with "Tensor on device cpu is not on the expected device meta".

Meta tensors have shapes and no data, so a path runs on meta until it *reads* data (``.item()``,
``.tolist()``, ``float()``, ``.cpu()``): :func:`read_point` runs a path and names the function
where it first read (None: it ran to the end). Paths that read are split so that their tensor
part is a function of its own, covered here to the end (``telemetry_tensors``,
``score_gradient``, the differentiable scores of the views ...).

Meta alone lets through some mixes that CUDA refuses: a matmul, ``embedding``, ``gather`` or
``index_select`` of a meta tensor with a CPU tensor runs on meta (checked below). So every path
here runs under :class:`SameDevice`, a dispatch mode that sees every aten op (forward and
backward) and raises when tensors of two devices meet, allowing only what CUDA allows too: 0-dim
CPU tensors (scalars) beside device tensors, CPU index tensors in advanced indexing, and explicit
copies between devices. The other way round meta is stricter than CUDA in one place:
``masked_fill`` with a 0-dim CPU value tensor raises on meta and runs on CUDA (nothing here does
it).

``test_static_scan`` adds an AST scan of attn_core for tensor factories without a device: every
one is on an explicit allow-list with its reason (CPU-only by design: seeded CPU generators whose
stream is the same on every machine, checkpoint I/O, host-side tables).
"""

from __future__ import annotations

import ast
import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attn_core import metrics
from attn_core import regularizers as R
from attn_core.bilinear import layer_form, model_form, positional_scores, vocab_scores
from attn_core.model import Transformer
from attn_core.tasks import get_task
from attn_core.training.config import TrainConfig
from attn_core.training.telemetry import telemetry_tensors
from attn_core.training.trainer import Trainer
from tests.conftest import make_tiny_model

META = torch.device("meta")
ROOT = Path(__file__).resolve().parents[2]

# ops whose CUDA kernels take CPU tensors beside device tensors: advanced indexing with CPU
# indices, and the copies between devices themselves
CROSS_DEVICE_OK = {
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put.default,
    torch.ops.aten.index_put_.default,
    torch.ops.aten._index_put_impl_.default,
    torch.ops.aten._to_copy.default,
    torch.ops.aten.copy_.default,
    torch.ops.aten.lift_fresh.default,
}


class SameDevice(TorchDispatchMode):
    """Raise when an aten op gets tensors (of one or more dims) on two devices."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in CROSS_DEVICE_OK:
            flat, _ = tree_flatten((args, kwargs))
            devices = {t.device.type for t in flat if isinstance(t, torch.Tensor) and t.dim() > 0}
            if len(devices) > 1:
                raise RuntimeError(
                    f"{func}: tensors on {' and '.join(sorted(devices))} meet (CUDA raises: Expected all tensors "
                    "to be on the same device)"
                )
        return func(*args, **kwargs)


READS = (
    "Cannot copy out of meta tensor",
    "data-independent implementation does not exist",  # boolean indexing: nonzero (a sync on CUDA)
    "cannot be called on meta tensors",
    "can't convert meta device type tensor",
)


def read_point(fn) -> str | None:
    """Run ``fn()`` under :class:`SameDevice`; None when it ran to the end, else
    ``"module.py:function"`` of the attn_core frame where it first read a meta tensor's data. Any
    other error (a device mix above all) fails the test."""
    try:
        with SameDevice():
            fn()
    except (RuntimeError, NotImplementedError, TypeError) as e:
        if not any(r in str(e) for r in READS):
            raise
        # comprehensions name the function they are in (Python 3.12 inlines them; 3.11 does not)
        comprehension = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")
        tb = traceback.extract_tb(e.__traceback__)
        frames = [f for f in tb if "/attn_core/" in f.filename and f.name not in comprehension]
        assert frames, f"read outside attn_core: {e}"
        return f"{Path(frames[-1].filename).name}:{frames[-1].name}"
    return None


def on_meta(fn):
    """Run ``fn()`` under :class:`SameDevice` to the end (no data read) and return its result."""
    with SameDevice():
        return fn()


def all_meta(tree) -> bool:
    flat, _ = tree_flatten(tree)
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    return bool(tensors) and all(t.device == META for t in tensors)


# --- the models ---------------------------------------------------------------------------------------

TASK = get_task("reverse")
MODELS = {
    "factored": {},
    "merged": {"qk": "merged"},
    "biased-mlp-2l": {"attn_bias": True, "d_mlp": 32, "n_layers": 2},
    "grown": {"d_qk": [[8, 5]]},
    "rotary-gqa": {"positional": "rotary", "n_kv_heads": 1, "normalization": "rmsnorm"},
    "entmax15": {"entmax_alpha": 1.5},
    "sparsemax": {"entmax_alpha": 2.0},
}


def meta_model(kind: str) -> Transformer:
    return make_tiny_model("reverse", std=0.3, **MODELS[kind]).to(META)


def tokens(n: int = 3) -> torch.Tensor:
    return TASK.sample(n, 0).tokens.to(META)


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    """An imported Hugging Face Llama (rotary, grouped-query attention, biases), on meta."""
    from attn_core.sources import resolve
    from tests.conftest import write_tiny_hf

    folder = tmp_path_factory.mktemp("llama")
    write_tiny_hf(folder, "llama", num_key_value_heads=2, attention_bias=True)
    return resolve(folder).model.to(META)


SPECS = [f"{name}=0.1" for name in R.REGULARIZERS] + ["topk:2=0.1", "vocab_topk:2@L0H1=0.1", "entropy@L0H0=0.1"]


# --- the guard itself -------------------------------------------------------------------------------


def test_meta_alone_misses_mixes_that_the_guard_catches():
    m, c = torch.randn(3, 4, device=META), torch.ones(4, 2)
    # meta itself refuses elementwise mixes ...
    with pytest.raises(RuntimeError, match="not on the expected device meta"):
        m[:, :2] * c[:3]
    # ... and lets a matmul or an embedding lookup through, which CUDA refuses: the guard does not
    assert (m @ c).device == META
    with pytest.raises(RuntimeError, match="cpu and meta meet"), SameDevice():
        m @ c
    with pytest.raises(RuntimeError, match="cpu and meta meet"), SameDevice():
        torch.nn.functional.embedding(torch.tensor([[0, 1]], device=META), c)
    # what CUDA allows passes: 0-dim CPU scalars, CPU indices, explicit copies
    with SameDevice():
        assert (m * torch.tensor(2.0)).device == META
        assert torch.where(m > 0, m, torch.tensor(0.0)).device == META
        assert m[torch.tensor([0, 2])].shape == (2, 4)
        assert c.to(META).device == META


def test_the_guard_sees_the_backward():
    x = torch.randn(3, 4, device=META, requires_grad=True)
    y = (x * 2).sum()
    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Count():
        y.backward()
    assert seen and x.grad.device == META


def test_the_original_bug_is_caught_here():
    """Issue 21's bug, on purpose: a mask made with torch.full on the CPU meeting device values."""
    values = torch.randn(2, 5, device=META)
    cpu_mask = torch.full((2, 5), True).to(values.dtype)
    with pytest.raises(RuntimeError, match="not on the expected device meta"):
        values * cpu_mask
    # and the fixed informative_rows takes the values' device
    assert metrics.informative_rows(None, values.shape + (4,), device=values.device).device == META


# --- model, penalties, summaries -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(MODELS))
def test_forward_every_penalty_and_its_backward_run_on_meta(kind):
    model = meta_model(kind)
    penalty = R.build_penalty(SPECS, model)

    def step():
        cache: dict = {}
        logits = model(tokens(), cache=cache)
        terms = penalty(model, None, cache)
        assert set(terms) == {s.label for s in penalty.specs}
        loss = logits.float().logsumexp(-1).mean() + sum(terms.values())
        loss.backward()
        return terms

    terms = on_meta(step)
    assert all_meta(terms)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all_meta(grads)


def test_penalties_of_an_imported_llama_run_on_meta(hf_llama):
    model = hf_llama
    penalty = R.build_penalty(SPECS, model)

    def step():
        cache: dict = {}
        logits = model(torch.zeros(2, 9, dtype=torch.long, device=META), cache=cache)
        loss = logits.mean() + sum(penalty(model, None, cache).values())
        loss.backward()

    on_meta(step)
    assert all(p.grad is not None and p.grad.device == META for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("kind", ["factored", "merged", "rotary-gqa", "sparsemax"])
def test_per_head_summaries_and_telemetry_run_on_meta(kind):
    model = meta_model(kind)
    L, H = model.cfg.n_layers, model.cfg.n_heads

    def summaries():
        cache: dict = {}
        model(tokens(), cache=cache)
        data = R.data_concentration(model, cache, R.parse_heads("L0H1", model.cfg))
        vocab = R.vocab_concentration(model)
        form = model_form(model)
        return data, vocab, (form.singular_values, form.stable_rank)

    data, vocab, spectrum = on_meta(summaries)
    assert all_meta((data, vocab, spectrum))
    assert data["entropy"].shape == vocab["top1"].shape == (L, H)
    values = on_meta(lambda: telemetry_tensors(model, tokens(2)))
    assert values.shape == (2, L, H) and all_meta(values)
    # the rows and the before/after measurement read their values (once) from here
    from attn_core.training import telemetry

    assert read_point(lambda: telemetry.telemetry_row(model, tokens(2), R.all_heads(model.cfg))) == (
        "telemetry.py:telemetry_row"
    )
    pattern = on_meta(lambda: telemetry.pattern_tensor(model, tokens(1)[0], 0, 1))  # a watched head's
    assert pattern.shape == (TASK.n_ctx, TASK.n_ctx) and all_meta(pattern)
    assert read_point(lambda: telemetry.probe_pattern(model, tokens(1)[0], 0, 1)) == "telemetry.py:probe_pattern"


@pytest.mark.parametrize("spec", SPECS[:8] + [None])
def test_training_steps_run_on_meta(spec):
    """The Trainer's step on meta: batch to the device, forward (and autocast), task loss, the
    penalty, backward, clipping, the AdamW update; a sync point is where it reads."""
    model = make_tiny_model("reverse", std=0.3, n_layers=2)
    cfg = TrainConfig(steps=50, batch_size=4, eval_every=50, sync_every=40, warmup_steps=2, device="cpu")
    penalty = R.build_penalty([spec], model) if spec else None
    trainer = Trainer(model, TASK, cfg, penalty=penalty, device=META)
    for _ in range(3):
        on_meta(trainer.step)
    assert trainer.step_index == 3 and all_meta(list(trainer.model.parameters()))
    assert all_meta([s for s in trainer.optimizer.state.values()][0]["exp_avg"])
    assert read_point(trainer.sync) == "device.py:host_read"  # the one host read of a step window (placement)


def test_bf16_steps_run_on_meta():
    model = make_tiny_model("reverse", std=0.3)
    cfg = TrainConfig(steps=10, batch_size=4, sync_every=9, precision="bf16", device="cpu")
    trainer = Trainer(model, TASK, cfg, penalty=R.build_penalty(["entropy=0.1", "spectral=0.1"], model), device=META)
    on_meta(trainer.step)
    assert trainer.step_index == 1


# --- growth, attribution, composition, views, QK comparison, kernels ----------------------------------


@pytest.mark.parametrize("kind", ["factored", "biased-mlp-2l", "grown"])
def test_growths_hook_and_gradient_run_on_meta(kind):
    from attn_core.grow.growth import head_batch, score_gradient, score_offset, widen

    model = meta_model(kind)
    batch = TASK.sample(3, 0)
    T = TASK.n_ctx

    def hooked():
        offset = torch.zeros(3, T, T, device=META, requires_grad=True)
        logits = model.run_with_hooks(batch.tokens.to(META), [score_offset(0, 1, offset)])
        return torch.autograd.grad(logits.logsumexp(-1).mean(), offset)[0]

    assert on_meta(hooked).shape == (3, T, T)
    # the task loss selects the scored positions by a boolean mask: a read (a sync on CUDA)
    assert read_point(lambda: score_gradient(model, TASK, batch, 0, 1)) == "tasks.py:loss"
    assert read_point(lambda: head_batch(model, TASK, batch, 0, 1)) == "tasks.py:loss"
    wider = on_meta(lambda: widen(model, 0, 1, 2, "random"))
    assert wider.cfg.head_d_qk(0, 1) == model.cfg.head_d_qk(0, 1) + 2 and all_meta(list(wider.parameters()))


@pytest.mark.parametrize("kind", ["factored", "merged", "biased-mlp-2l", "rotary-gqa"])
def test_circuits_run_on_meta(kind):
    import importlib

    C = importlib.import_module("attn_core.circuits.composition")  # the package exports a function of that name
    ov = importlib.import_module("attn_core.circuits.ov")
    from attn_core.circuits.attribution import bias_terms, head_form

    model = meta_model(kind)

    def tensors():
        out = [ov.ov_singular_values(model), head_form(model, 0, 1).svd(), ov.full_ov_form(model, 0, [1, 2, 3]).dense]
        out.append(ov.full_qk_form(model, 0).left)
        x = torch.randn(4, model.cfg.d_model, device=META, dtype=torch.float64)
        out.append(bias_terms(model, 0, 1, x[0], x))
        for l in range(model.cfg.n_layers):
            f = C.head_factors(model, l)
            out.append(C.composition_score(*(t[:, None] for t in f["ov"]), *(t[None] for t in f["qk"])))
        return out

    assert all_meta(on_meta(tensors))
    if model.cfg.n_layers > 1:
        assert all_meta(on_meta(lambda: C.k_composed_positivity(model, (0, 0), 1)))  # eigenvalues on meta too
        assert read_point(lambda: C.composition(model, n_samples=4)) == "composition.py:composition"
    assert read_point(lambda: ov.copying_scores(model)) is None


@pytest.mark.parametrize("kind", ["factored", "merged", "biased-mlp-2l", "rotary-gqa"])
def test_attribution_and_views_run_on_meta_until_they_read(kind):
    from attn_core.bilinear import views
    from attn_core.card import Card
    from attn_core.checkpoint import LoadedModel
    from attn_core.circuits.attribution import attribute

    model = meta_model(kind)
    loaded = LoadedModel(name="meta", model=model, config=model.cfg, card=Card(task="reverse"))
    ids = TASK.sample(1, 0).tokens[0].tolist()
    scores = on_meta(lambda: vocab_scores(model, 0, [0, 1], tokens=[1, 2, 3]))
    assert scores.shape == (2, 3, 3) and scores.device == META
    if model.cfg.positional == "learned":
        assert on_meta(lambda: positional_scores(model, 0)).device == META
    # the views compute on the device and read once, when they build the View (on the CPU)
    assert read_point(lambda: views.sequence_view(loaded, ids, 0)) == "views.py:_view"
    assert read_point(lambda: views.vocabulary_view(loaded, 0)) == "views.py:_view"
    # attribution first reads which keys the query sees (the model's own mask, as a list); its
    # tensor parts (head_form, svd, bias_terms) are covered in test_circuits_run_on_meta
    assert read_point(lambda: attribute(loaded, ids, 0, 1, 5)) == "checks.py:visible_keys"


def test_qk_conversions_run_on_meta():
    from attn_core.qk.convert import factored_from_merged, merged_from_factored, truncated

    model = meta_model("factored")
    merged = on_meta(lambda: merged_from_factored(model))
    back = on_meta(lambda: factored_from_merged(merged, 4))
    cut = on_meta(lambda: truncated(model, 2))
    assert all_meta([*merged.parameters(), *back.parameters(), *cut.parameters()])
    assert on_meta(lambda: layer_form(back, 0).dense).device == META


@pytest.mark.parametrize("method", ["favor", "maclaurin", "schoenbat", "nystrom", "nystromformer"])
def test_kernel_attention_runs_on_meta(method):
    from attn_core.kernels import approx_attention

    q, k, v = (torch.randn(2, 16, 8, device=META) for _ in range(3))
    out = on_meta(lambda: approx_attention(q, k, v, method, features=8, seed=0))
    assert out.shape == (2, 16, 8) and out.device == META


def test_rpe_attention_runs_on_meta():
    from attn_core.kernels.attention import rpe_attention

    q, k, v = (torch.randn(2, 16, 8, device=META) for _ in range(3))
    b = torch.randn(31, device=META)
    assert on_meta(lambda: rpe_attention(q, k, v, b, causal=True)).device == META


# --- the static scan ----------------------------------------------------------------------------------

FACTORIES = {"full", "zeros", "ones", "arange", "eye", "tensor", "empty", "rand", "randn", "randint", "randperm"}
FACTORIES |= {"linspace", "as_tensor", "tril_indices", "triu_indices"}
# (file, function) -> why a tensor factory there takes no device
CPU_BY_DESIGN = {
    ("model/layers.py", "__init__"): "parameters are made on the default device; the caller moves the module",
    ("model/attention.py", "__init__"): "parameters, as above",
    ("model/transformer.py", "__init__"): "parameters, as above",
    ("model/moe.py", "__init__"): "the router's and experts' parameters, as above",
    ("model/mla.py", "__init__"): "the MLA layer's parameters, as above",
    ("model/attention.py", "_scales"): "1/sqrt(d) made exactly in float64, then moved to the buffer's device",
    ("model/rotary.py", "offset_rotation"): "exact float64 rotations; callers move them (.to(W))",
    ("tasks.py", "sample"): "an int seed draws on the CPU: the same batch on every machine",
    ("tasks.py", "_modular_addition"): "the fixed split of pairs, made once (copied to a generator's device once)",
    ("training/trainer.py", "init_model"): "the seeded init draws on the CPU: the same model on every device",
    ("bilinear/tokens.py", "random_tokens"): "token ids for the user, read as a list",
    ("bilinear/detectors.py", "detector_inputs"): "seeded CPU inputs, moved to the model in detector_tensors",
    ("bilinear/long.py", "window_frame"): "labels of a table of CPU values",
    ("bilinear/long.py", "overview_frame"): "labels of a table of CPU values",
    ("bilinear/long.py", "view"): "indices into LayerScores, which holds CPU tensors",
    ("bilinear/views.py", "row"): "indices into a View, which holds CPU tensors",
    ("circuits/composition.py", "_random_factors"): "the random baseline: a seeded CPU generator",
    ("circuits/composition.py", "baseline_score"): "the random baseline: a seeded CPU generator",
    ("circuits/composition.py", "composition"): "the result tables (CPU), filled from blocks copied with .cpu()",
    ("grow/growth.py", "widen"): "new columns drawn by a seeded CPU generator, then moved (.to(old))",
    ("kernels/features.py", "orthogonal_gaussian"): "seeded CPU draws in float64, moved with .to(device)",
    ("kernels/features.py", "maclaurin_draw"): "seeded CPU draws in float64, moved with .to(device)",
    ("kernels/features.py", "maclaurin_features"): "degree counts read on the host (python ints)",
    ("kernels/features.py", "nystrom_factors"): "seeded CPU choice of landmarks, moved with .to(q.device)",
    ("regularizers/penalty.py", "__init__"): "the seeded host generator of sampled penalty rows",
    ("regularizers/rows.py", "sample_positions"): "sampled rows drawn on the host, moved with .to(q.device)",
    ("dynamics/metrics.py", "text_inputs"): "token ids of a text (CPU inputs, moved to the model in position_sums)",
    ("hf/export.py", "_bias"): "export works on a CPU float32 copy of the state dict (gpt2_tensors' sd)",
    ("hf/export.py", "gpt2_tensors"): "export works on a CPU float32 copy of the state dict, written to a file",
}
SCANNED = (
    "model",
    "training",
    "regularizers",
    "bilinear",
    "circuits",
    "grow",
    "qk",
    "kernels",
    "sweep",
    "text",
    "dynamics",
    "hf",
)
SCANNED_FILES = ("metrics.py", "tasks.py", "finetune.py")


def _is_factory(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
        and (node.attr in FACTORIES or node.attr == "Generator")
    )


def _factory_calls(tree: ast.AST):
    """(function, line, name) of every torch.<factory>(...) call without device= (and not *_like),
    and of every factory taken as a value (``zeros = torch.zeros``: its calls name no device)."""
    out = []

    def visit(node, fn):
        for child in ast.iter_child_nodes(node):
            name = fn
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = child.name
            if (
                isinstance(child, ast.Call)
                and _is_factory(child.func)
                and not any(k.arg == "device" for k in child.keywords)
            ):
                out.append((fn, child.lineno, child.func.attr))
            called = isinstance(node, ast.Call) and node.func is child
            if _is_factory(child) and child.attr != "Generator" and not called:  # Generator: type hints
                out.append((fn, child.lineno, f"{child.attr} taken as a value; torch.{child.attr}"))
            visit(child, name)

    visit(tree, "<module>")
    return out


def test_static_scan():
    """Every tensor factory in the scanned packages either names its device or is allowed above."""
    core = ROOT / "attn_core"
    files = [p for d in SCANNED for p in (core / d).rglob("*.py")] + [core / f for f in SCANNED_FILES]
    unexplained = []
    for path in files:
        rel = path.relative_to(core).as_posix()
        for fn, line, name in _factory_calls(ast.parse(path.read_text())):
            if (rel, fn) not in CPU_BY_DESIGN:
                unexplained.append(f"attn_core/{rel}:{line} torch.{name}(...) in {fn}() has no device=")
    assert not unexplained, (
        "tensor factories without a device (take the device of the tensors they meet, "
        "or add the place to CPU_BY_DESIGN with the reason):\n" + "\n".join(unexplained)
    )
    found = {
        (path.relative_to(core).as_posix(), fn)
        for path in files
        for fn, *_ in _factory_calls(ast.parse(path.read_text()))
    }
    stale = sorted(set(CPU_BY_DESIGN) - found)
    assert not stale, f"allow-list entries with no factory left to allow (remove them): {stale}"


# --- issue 28: the live job's measurements, off the step's critical path --------------------------------


def _text_task(d_vocab: int, block: int = 8):
    import numpy as np

    from attn_core.text.task import TextData, text_task

    rng = np.random.default_rng(0)
    return text_task(TextData(rng.integers(0, d_vocab, 400), rng.integers(0, d_vocab, 100), block, d_vocab, None, {}))


def test_text_measurement_and_evaluation_run_on_meta_until_their_one_read(hf_llama):
    """Held-out blocks to the device, the forward at bf16 with Q and K kept, the loss, accuracy
    and per-head sums accumulated on the device: all on meta, then one read at the end."""
    from attn_core.text import measure as M

    model, task = hf_llama, _text_task(hf_llama.cfg.d_vocab)
    heads = R.parse_heads(None, model.cfg)
    assert read_point(lambda: M._run(model, task, 6, 0, "test", META, heads, "bf16", 24)) == "measure.py:_run"
    assert read_point(lambda: M._run(model, task, 6, 0, "test", META, None, "fp32", None)) == "measure.py:_run"


def test_batched_offsets_spectra_run_on_meta(hf_llama):
    from attn_core.bilinear.offsets import sigma1_offsets, sigma1_summaries

    heads = [(0, 1), (1, 0), (0, 0)]
    sigma1 = on_meta(lambda: sigma1_offsets(hf_llama, heads))
    assert sigma1.shape[0] == 3 and all_meta(sigma1)
    assert read_point(lambda: sigma1_summaries(hf_llama, heads)) == "offsets.py:sigma1_summaries"


def test_a_text_run_draws_its_batches_on_the_host_and_trains_on_meta(hf_llama):
    """A text task's batches come from host memory: the trainer draws them with a CPU generator
    (on CUDA they then go through pinned memory without a wait) and steps run on the device."""
    task = _text_task(hf_llama.cfg.d_vocab)
    cfg = TrainConfig(steps=20, batch_size=2, eval_every=20, sync_every=10, device="cpu", precision="bf16")
    trainer = Trainer(hf_llama, task, cfg, penalty=R.build_penalty(["entropy=0.1"], hf_llama), device=META)
    assert trainer.data.device.type == "cpu" and trainer.graph.static
    for _ in range(2):
        on_meta(trainer.step)
    assert trainer.step_index == 2 and all_meta(list(trainer.model.parameters()))


@pytest.mark.parametrize("kind", ["entropy", "hoyer", "topk"])
def test_a_fused_blocks_arithmetic_runs_on_meta(kind):
    """What a fused block of the row penalties computes on a GPU (regularizers/softmax_rows.py's
    forward_block and backward_block, compiled there): a block's own rows, its visibility mask and
    its row numbers are made on the device of Q and K (here eagerly on meta, under SameDevice)."""
    from attn_core.regularizers import softmax_rows as sr

    q, k = (torch.randn(2, 3, 40, 8, device=META) for _ in range(2))
    positions = torch.arange(40, device=META)
    key_mask = torch.ones(2, 40, dtype=torch.bool, device=META)
    n = torch.full((2, 1, 16), 20.0, device=META)
    inputs = on_meta(lambda: sr.block_inputs(q, k, 16, 32, 0, 32, positions, key_mask))
    assert all_meta([t for t in inputs if t is not None]) and inputs[0].shape == (2, 3, 16, 8)
    value, stats = on_meta(lambda: sr.forward_block(*inputs, 0.5, 0, kind, n, 2))
    assert value.shape == (2, 3, 16) and all_meta([value, *stats])
    g = torch.ones(2, 3, 16, device=META)
    P, c, d_sink = on_meta(lambda: sr.backward_block(*inputs, 0.5, 4, kind, n, g, list(stats), 2))
    assert P.shape == (2, 3, 16, 32) and c.shape == (2, 3, 16, 1) and all_meta([P, c])
    sink = torch.zeros(3, device=META)  # with a sink logit per head: its column, then its gradient
    value, stats = on_meta(lambda: sr.forward_block(*inputs, 0.5, 0, kind, n, 2, sink))
    P, c, d_sink = on_meta(lambda: sr.backward_block(*inputs, 0.5, 4, kind, n, g, list(stats), 2, sink))
    assert P.shape == (2, 3, 16, 32) and d_sink.shape == (3,) and all_meta([value, P, c, d_sink])


# --- a model built under a device: every parameter and buffer is made there ------------------------------

BUILT = {
    "sinks, biases, untied": dict(attn_sinks=True, attn_bias=True, tied_embed=False, normalization="rmsnorm"),
    "tied, qk-norm per head": dict(tied_embed=True, qk_norm="head", normalization="rmsnorm"),
    "qk-norm across heads, rotary": dict(qk_norm="all", normalization="rmsnorm", positional="rotary"),
    "merged": dict(qk="merged"),
}


@pytest.mark.parametrize("kind", list(BUILT))
def test_a_model_built_under_meta_makes_every_tensor_there(kind):
    """``torch.device(...)`` as a context places what the model makes without ``device=`` (its
    parameters: the sinks, the unembedding and its bias among them): built under meta, nothing is
    on the CPU, and the shapes are those of a CPU build (what ``checkpoint_bytes`` reads)."""
    from attn_core.training.checkpoints import checkpoint_bytes, to_bytes

    cpu = make_tiny_model("reverse", n_layers=2, **BUILT[kind])
    with META:
        built = Transformer(cpu.cfg)
    tensors = dict(built.named_parameters()) | dict(built.named_buffers())
    assert tensors and all(t.device == META for t in tensors.values())
    assert {k: v.shape for k, v in built.state_dict().items()} == {k: v.shape for k, v in cpu.state_dict().items()}
    for params in ("all", "attn"):
        assert checkpoint_bytes(cpu.cfg, params) == len(to_bytes(cpu, 0, params))
