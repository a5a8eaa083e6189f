"""GPT-2 import: a random tiny GPT-2 saved by transformers, loaded through attn_core.hf (and
sources.resolve, as any model NAME), must give the same attention patterns and logits."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from attn_core import bilinear as bl  # noqa: E402
from attn_core import hf  # noqa: E402
from attn_core.checkpoint import CheckpointError  # noqa: E402
from attn_core.hooks import act_name  # noqa: E402
from attn_core.sources import resolve  # noqa: E402
from tests.conftest import write_tiny_gpt2  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2-tiny")
    return write_tiny_gpt2(folder), folder


def _reference(model, tokens):
    with torch.no_grad():
        return model(tokens, output_attentions=True)


def test_patterns_and_scores_match_transformers(saved):
    model, folder = saved
    loaded = resolve(folder)  # a GPT-2 folder works wherever a model NAME does
    assert loaded.task is None and loaded.card.task is None
    cfg = loaded.config
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp, cfg.n_ctx, cfg.d_vocab) == (
        2,
        4,
        32,
        8,
        128,
        16,
        100,
    )
    assert cfg.attn_bias and cfg.mlp_act == "gelu_tanh" and cfg.ln_eps == model.config.layer_norm_epsilon
    tokens = torch.randint(0, 100, (3, 16), generator=torch.Generator().manual_seed(1))
    ref = _reference(model, tokens)
    with torch.no_grad():
        logits, cache = loaded.model.run_with_cache(tokens)
    assert torch.allclose(logits, ref.logits, atol=1e-4, rtol=1e-4)
    for layer in range(2):
        A_ref = ref.attentions[layer]
        assert A_ref.max() > 0.5  # peaked patterns: a real test
        assert torch.allclose(cache[act_name("pattern", layer)], A_ref, atol=1e-5)
        view = bl.sequence_view(loaded, tokens[0].tolist(), layer)  # scores through B'
        assert torch.allclose(view.pattern, A_ref[0], atol=1e-5)
        assert torch.allclose(view.scores, cache[act_name("attn_scores", layer)][0], atol=1e-4, rtol=1e-5)


def test_views_and_spectrum_work_on_gpt2(saved):
    _, folder = saved
    loaded = resolve(folder)
    assert bl.token_names(loaded)[:2] == ["tok0", "tok1"]
    assert bl.input_ids(loaded, "tok3 7") == [3, 7]
    recs = bl.spectrum_rows(loaded.model, augmented=True)
    assert len(recs) == 8 and len(recs[0]["singular_values"]) == 8  # B' is 33 x 33, still rank <= d_head
    assert bl.model_form(loaded.model, augmented=True).shape == (2, 4, 33, 33)
    assert bl.vocabulary_view(loaded, 1, heads=[2]).scores.shape == (1, 100, 100)
    assert bl.positional_view(loaded, 0).scores.shape == (4, 16, 16)
    assert set(bl.head_detectors(loaded.model, n_samples=2)["detector"]) == set(bl.DETECTORS)


def test_in_memory_model_and_folded_scales(tmp_path):
    """scale_attn_by_inverse_layer_idx and scale_attn_weights=False change the scores' scale;
    it is folded into W_Q, b_Q, so the patterns still match."""
    model = write_tiny_gpt2(
        tmp_path, scale_attn_by_inverse_layer_idx=True, scale_attn_weights=False, tie_word_embeddings=False
    )  # loaded from memory below, not from tmp_path
    loaded = hf.from_transformers(model)
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(2))
    ref = _reference(model, tokens)
    with torch.no_grad():
        logits, cache = loaded.model.run_with_cache(tokens)
    for layer in range(2):
        assert torch.allclose(cache[act_name("pattern", layer)], ref.attentions[layer], atol=1e-5)
    assert torch.allclose(logits, ref.logits, atol=1e-4, rtol=1e-4)


def test_refusals(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 1, "n_positions": 8, "vocab_size": 10})
    )
    assert hf.is_hf_folder(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04")
    with pytest.raises(CheckpointError, match="never read"):
        resolve(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        resolve(tmp_path)
    with pytest.raises(CheckpointError, match="activation"):
        hf.model_config({"model_type": "gpt2", "activation_function": "relu6"})
    with pytest.raises(CheckpointError, match="divisible"):
        hf.model_config(
            {"model_type": "gpt2", "n_embd": 30, "n_head": 4, "n_layer": 1, "n_positions": 8, "vocab_size": 10}
        )
    with pytest.raises(CheckpointError, match="lacks 'n_layer'"):
        hf.model_config({"model_type": "gpt2", "n_embd": 32, "n_head": 4})
    assert not hf.is_hf_folder(tmp_path / "missing")


def test_missing_tensor_is_named(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder = saved
    sd = load_file(str(folder / "model.safetensors"))
    sd.pop("transformer.h.1.attn.c_attn.bias")
    save_file(sd, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    with pytest.raises(CheckpointError, match="h.1.attn.c_attn.bias"):
        resolve(tmp_path)


def test_cli_takes_a_gpt2_folder_as_name(saved):
    from typer.testing import CliRunner

    from attn_core.cli import app

    _, folder = saved
    runner = CliRunner()
    spec = runner.invoke(app, ["spectrum", str(folder), "--json"])
    assert spec.exit_code == 0 and len(json.loads(spec.stdout)) == 8
    doc = runner.invoke(
        app, ["scores", str(folder), "--layer", "1", "--head", "2", "--tokens", "tok5 tok6 7", "--json"]
    )
    assert doc.exit_code == 0, doc.output
    assert json.loads(doc.stdout)["token_ids"] == [5, 6, 7]
    bad = runner.invoke(app, ["scores", str(folder), "--head", "4"])
    assert bad.exit_code == 2 and "head 4 is outside 0..3" in bad.output
