"""A folder whose config ties the unembedding to the embedding (``tie_word_embeddings``) loads as one
tensor, as transformers holds it: no copy of the unembedding, the parameter count transformers
gives, the same logits; retraining moves the one tensor and export-hf writes it back tied."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402

import attn_core as al  # noqa: E402
from attn_core.checkpoint import LoadedModel, build_checked  # noqa: E402
from attn_core.hf import load_hf  # noqa: E402
from attn_core.hf.family_export import export_family, fixed_params, hf_origin  # noqa: E402
from attn_core.model import ModelConfig, Transformer  # noqa: E402
from tests.unit.test_hf_new_families import write_family  # noqa: E402

TOKENS = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-tied")
    return write_family(folder, "qwen3", tie_word_embeddings=True), folder


def test_a_tied_folder_loads_one_tensor(tied):
    reference, folder = tied
    loaded = load_hf(folder)
    model = loaded.model
    assert loaded.config.tied_embed
    assert model.unembed.W_U.data_ptr() == model.embed.W_E.data_ptr()  # a view, not a copy
    assert "unembed.W_U" not in model.state_dict()
    assert sum(p.numel() for p in model.parameters()) == loaded.config.n_params()
    theirs = sum(p.numel() for p in reference.parameters())  # transformers counts a tied tensor once
    zero = sum(dict(model.named_parameters())[n].numel() for n in fixed_params(hf_origin(loaded), loaded.config))
    assert loaded.config.n_params() == theirs + zero  # and our biases the family has none of
    with torch.no_grad():
        assert torch.allclose(model(TOKENS), reference(TOKENS).logits, atol=1e-4, rtol=1e-4)


def test_an_untied_folder_keeps_its_own_unembedding(tmp_path):
    write_family(tmp_path, "qwen3", tie_word_embeddings=False)
    model = load_hf(tmp_path).model
    assert not model.cfg.tied_embed and "unembed.W_U" in dict(model.named_parameters())


def test_training_moves_the_tied_tensor_through_both_uses():
    cfg = ModelConfig(d_vocab=20, tied_embed=True)
    model = Transformer(cfg)
    model(torch.tensor([[1, 2, 3]]))[0, -1, 5].backward()  # the logit of a token no input holds
    assert model.embed.W_E.grad[5].abs().sum() > 0  # reached through the unembedding alone
    with torch.no_grad():
        model.embed.W_E.add_(1.0)
    assert torch.equal(model.unembed.W_U, model.embed.W_E.T)


def test_a_tied_model_round_trips_through_its_state_dict():
    cfg = ModelConfig(d_vocab=20, tied_embed=True)
    model = Transformer(cfg)
    again = build_checked(ModelConfig.from_dict(cfg.to_dict()), model.state_dict())
    assert again.unembed.W_U.data_ptr() == again.embed.W_E.data_ptr()
    assert torch.equal(again(TOKENS % 20), model(TOKENS % 20))


def test_export_hf_writes_a_tied_model_tied(tied, tmp_path):
    reference, folder = tied
    loaded = load_hf(folder)
    export_family(loaded, tmp_path / "out", hf_origin(loaded))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is True
    with safe_open(tmp_path / "out" / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys()
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    with torch.no_grad():
        assert torch.allclose(back(TOKENS).logits, loaded.model(TOKENS), atol=1e-4, rtol=1e-4)
    assert al.load(str(tmp_path / "out")).config == loaded.config


def test_a_tied_model_of_our_own_exports_as_gpt2(tmp_path):
    from attn_core.hf.export import export_gpt2

    model = Transformer(ModelConfig(n_layers=1, d_model=16, d_head=4, d_vocab=12, d_mlp=64, tied_embed=True))
    model.reset_parameters(torch.Generator().manual_seed(0))
    loaded = LoadedModel(name="tied", model=model.eval(), config=model.cfg)
    export_gpt2(loaded, tmp_path / "gpt2", [f"t{i}" for i in range(12)])
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "gpt2").eval()
    with torch.no_grad():
        assert torch.allclose(back(TOKENS % 12).logits, model(TOKENS % 12), atol=1e-5)
