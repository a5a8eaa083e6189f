"""Device discipline (issue 21) for what was written after the first guard: training dynamics
(``attn_core.dynamics``: the per-checkpoint metrics, the Zhai entropy floor), the head detectors,
the Hugging Face conversion and partial checkpoints. The guard is ``test_device_meta``'s:
``meta`` stands in for CUDA and :class:`SameDevice` raises when tensors of two devices meet, so a
tensor made on the CPU inside these paths fails here. Paths that read data are split: the tensor
part runs on meta to the end, and the read is where the test says it is."""

from __future__ import annotations

import pytest
import torch

from attn_core import dynamics as D
from attn_core.bilinear import detector_inputs, detector_tensors, model_form
from attn_core.circuits import copying_scores
from attn_core.dynamics.bound import floor_logits
from attn_core.dynamics.metrics import k_composition_max, position_sums
from attn_core.hf.families import REGISTRY
from attn_core.hf.family import convert
from attn_core.hf.gpt2 import convert_state_dict
from attn_core.hf.load import model_config
from attn_core.hooks import act_name
from attn_core.model import Transformer
from tests.conftest import TINY_HF, make_tiny_model
from tests.unit.test_device_meta import META, TASK, all_meta, meta_model, on_meta, read_point

KINDS = ["factored", "merged", "biased-mlp-2l", "rotary-gqa", "sparsemax"]


def inputs(samples: int = 3) -> D.Inputs:
    return D.task_inputs(TASK, samples=samples)  # CPU inputs, as the CLI and the page make them


# --- the per-checkpoint metrics -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_position_sums_run_on_meta(kind):
    model = meta_model(kind)
    L, H, T = model.cfg.n_layers, model.cfg.n_heads, TASK.n_ctx
    sums = on_meta(lambda: position_sums(model, inputs()))
    assert all_meta(sums)
    assert sums["loss"].shape == (T,) and sums["entropy"].shape == sums["floor"].shape == (L, H)
    assert sums["rows"].shape == (L,) and sums["scored"].shape == ()
    assert all(t.dtype == torch.float64 for t in sums.values())
    # the CPU values are read once, in position_losses
    assert read_point(lambda: D.position_losses(model, inputs())) == "metrics.py:position_losses"


@pytest.mark.parametrize("kind", KINDS)
def test_detector_tensors_run_on_meta(kind):
    model = meta_model(kind)
    scores = on_meta(lambda: detector_tensors(model, detector_inputs(model, 3, 0, 8)))
    assert all_meta(scores) and all(t.shape == (model.cfg.n_layers, model.cfg.n_heads) for t in scores.values())
    assert on_meta(lambda: detector_tensors(model, detector_inputs(model, 2, 0, 8), rows="all"))["self"].device == META
    assert read_point(lambda: D.metrics.head_detector_scores(model, 2, 0, 8)) == "detectors.py:head_detector_scores"


@pytest.mark.parametrize("kind", ["factored", "merged", "biased-mlp-2l", "rotary-gqa"])
def test_what_measure_computes_from_the_model_runs_on_meta(kind):
    """measure's tensor parts, each to the end on meta: the forward's sums, the detectors, the
    copying scores, the spectrum of B, the largest K-composition per head; then where it reads."""
    model = meta_model(kind)
    L, H = model.cfg.n_layers, model.cfg.n_heads

    def parts():
        form = model_form(model)
        K = torch.randn(L * H, L * H, device=META)  # composition's scores table [n, n]
        return (
            position_sums(model, inputs(2)),
            detector_tensors(model, detector_inputs(model, 2, 0, 8)),
            (form.singular_values, form.stable_rank),
            k_composition_max(K, L, H),
        )

    sums, detectors, spectrum, kmax = on_meta(parts)
    assert all_meta((sums, detectors, spectrum, kmax)) and kmax.shape == (L, H)
    assert read_point(lambda: copying_scores(model)) is None
    assert (
        read_point(lambda: D.checkpoint_metrics(model, inputs(2), detector_samples=2)) == "metrics.py:position_losses"
    )
    # a partial checkpoint skips the forward: its first read is the composition table (with two
    # layers or more; with one there is no pair to read) or else the spectrum
    first = "composition.py:composition" if L > 1 else "summaries.py:head_spectra"
    assert read_point(lambda: D.checkpoint_metrics(model, None, partial=True)) == first


def test_k_composition_max_takes_the_device_and_dtype_of_its_table():
    K = torch.randn(6, 6, dtype=torch.float64)
    K[:, :2] = torch.nan  # layer 0 reads nothing
    kmax = k_composition_max(K, 3, 2)
    assert kmax.dtype == torch.float64 and torch.isnan(kmax[0]).all()
    for l in (1, 2):  # against a dense loop over the writers of earlier layers
        for h in range(2):
            assert kmax[l, h] == max(float(K[w, 2 * l + h]) for w in range(2 * l))
    assert on_meta(lambda: k_composition_max(K.to(META), 3, 2)).device == META


# --- the entropy floor -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["factored", "rotary-gqa"])
def test_the_entropy_floor_runs_on_the_scores_device(kind):
    model = meta_model(kind)
    T = TASK.n_ctx

    def floors():
        cache: dict = {}
        model(TASK.sample(2, 0).tokens.to(META), cache=cache)
        S = cache[act_name("attn_scores", 0)]
        mask = model.mask(T, model.cfg.window(0))
        return (
            D.spectral_norm(S, mask),
            D.row_floors(S, mask),
            D.normalized_row_floors(S, mask),
            D.entropy_floor(torch.arange(1, T + 1, device=META), 2.0),
            D.entropy_floor(T, torch.ones(3, device=META)),  # the device of whichever is a tensor
            floor_logits(T, 1.5, device=META),
        )

    out = on_meta(floors)
    assert all_meta(out) and all(t.dtype == torch.float64 for t in out)
    assert out[1].shape == out[2].shape == (2, model.cfg.n_heads, T)


def test_floor_logits_on_a_device_equal_the_cpu_ones():
    # floor_logits attains the floor: the same values whatever the device argument (CPU here)
    cpu = floor_logits(5, 1.25)
    assert torch.equal(floor_logits(5, 1.25, device="cpu"), cpu) and cpu.dtype == torch.float64
    assert floor_logits(1, 1.0, device=META).shape == (1,)


# --- Hugging Face conversion -----------------------------------------------------------------------------

FAMILIES = {
    "gpt_neox": {**TINY_HF, "model_type": "gpt_neox", "max_position_embeddings": 64},
    "llama": {**TINY_HF, "model_type": "llama", "max_position_embeddings": 64, "num_key_value_heads": 2},
    "qwen2": {**TINY_HF, "model_type": "qwen2", "max_position_embeddings": 64},
}


def _meta_get(n, shape):
    return torch.randn(shape, device=META)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_conversion_keeps_the_files_device(family):
    """Every tensor a converter makes (the zero biases a file lacks, b_U) is on the device of the
    tensors it reads: with nothing optional in the file (``has`` always False), all are made here."""
    cfg = model_config(FAMILIES[family])
    ours = on_meta(lambda: convert(REGISTRY[family], cfg, FAMILIES[family], _meta_get, lambda n: False))
    cpu = sorted(k for k, t in ours.items() if t.device != META)
    assert not cpu, f"made on the CPU: {cpu}"
    model = Transformer.from_tensors(cfg, ours)
    assert on_meta(lambda: model(torch.zeros(2, 5, dtype=torch.long, device=META))).device == META


def test_gpt2_conversion_keeps_the_files_device():
    hf = {"model_type": "gpt2", "n_embd": 16, "n_head": 2, "n_layer": 2, "n_positions": 16, "vocab_size": 20}
    cfg = model_config(hf)
    d, f, V = cfg.d_model, cfg.d_mlp, cfg.d_vocab
    shapes = {"wte.weight": (V, d), "wpe.weight": (16, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for l in range(2):
        p = f"h.{l}."
        shapes |= {p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,)}
        shapes |= {p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,)}
        shapes |= {p + f"ln_{i}.{w}": (d,) for i in (1, 2) for w in ("weight", "bias")}
        shapes |= {p + "mlp.c_fc.weight": (d, f), p + "mlp.c_fc.bias": (f,)}
        shapes |= {p + "mlp.c_proj.weight": (f, d), p + "mlp.c_proj.bias": (d,)}
    sd = {"transformer." + k: torch.randn(s, device=META) for k, s in shapes.items()}
    cfg, ours = on_meta(lambda: convert_state_dict(sd, hf))  # tied: W_U from W_E, b_U made here
    cpu = sorted(k for k, t in ours.items() if t.device != META)
    assert not cpu, f"made on the CPU: {cpu}"


# --- partial checkpoints -----------------------------------------------------------------------------------


def test_a_partial_checkpoint_takes_the_references_tensors_to_the_cpu_in_float32(tmp_path):
    """A partial checkpoint's other tensors come from the run's final model, which may be on a GPU
    or in bf16: they join the file's (CPU, float32) as CPU float32 copies."""
    from attn_core.card import Card
    from attn_core.checkpoint import LoadedModel
    from attn_core.training.checkpoints import load_checkpoint, to_bytes

    model = make_tiny_model("reverse", std=0.3)
    path = tmp_path / "step-000000001.safetensors"
    path.write_bytes(to_bytes(model, 1, "attn"))
    ref = make_tiny_model("reverse", std=0.3).to(torch.bfloat16)
    loaded = load_checkpoint(path, LoadedModel(name="ref", model=ref, config=ref.cfg, card=Card(task="reverse")))
    params = dict(loaded.model.named_parameters())
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params.values())
    assert torch.equal(params["embed.W_E"], ref.embed.W_E.float())  # from the reference
    assert torch.equal(params["blocks.0.attn.W_Q"], model.blocks[0].attn.W_Q)  # from the file
    # a reference on another device is copied (a read) in load_checkpoint, never passed on
    meta_ref = LoadedModel(name="ref", model=ref.to(META), config=ref.cfg, card=Card(task="reverse"))
    assert read_point(lambda: load_checkpoint(path, meta_ref)) == "checkpoints.py:load_checkpoint"
