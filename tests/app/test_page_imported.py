"""Imported Hugging Face models on the dashboard: a tiny Llama-family folder (grouped-query
attention, rotary) and a GPT-NeoX folder (partial rotary) listed through ATTN_LAB_MODELS. The
Spectrum page's B(delta) section is checked against a dense SVD of the transformers weights;
pages that need a task say that an imported model has none."""

from pathlib import Path

import numpy as np
import pytest
import torch
from dashboard_helpers import chart, open_page, values, z_matrix

from tests.conftest import write_tiny_hf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-models")
    llama = write_tiny_hf(root / "tiny-llama", "llama", num_key_value_heads=2)
    neox = write_tiny_hf(root / "tiny-neox", "gpt_neox", rotary_pct=0.5)
    _write_tokenizer(root / "tiny-neox")
    return root, {"tiny-llama": llama, "tiny-neox": neox}


def _write_tokenizer(folder):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "cat", "sat", "on", "mat", "."])}
    vocab.update({f"w{i}": i for i in range(len(vocab), 100)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture
def env(models, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_MODELS", str(models[0]))
    return models[1]


def _dense_B(reference, family: str, layer: int, head: int) -> torch.Tensor:
    """W_Q W_K^T / sqrt(d_head) of a query head, from the transformers weights."""
    cfg = reference.config
    dh = cfg.hidden_size // cfg.num_attention_heads
    if family == "llama":
        attn = reference.model.layers[layer].self_attn
        W_Q = attn.q_proj.weight.reshape(cfg.num_attention_heads, dh, -1)[head]
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        W_K = attn.k_proj.weight.reshape(cfg.num_key_value_heads, dh, -1)[head // group]
    else:
        qkv = reference.gpt_neox.layers[layer].attention.query_key_value.weight
        W_Q, W_K = qkv.reshape(cfg.num_attention_heads, 3, dh, -1)[head, :2]
    return (W_Q.T @ W_K).detach().double() / dh**0.5


@pytest.mark.parametrize("name, family", [("tiny-llama", "llama"), ("tiny-neox", "gpt_neox")])
def test_spectrum_shows_B_of_the_offset(env, name, family):
    at = open_page(str(ROOT / "app_pages" / "2_Spectrum.py"), name)
    fig = chart(at, "offset_spectrum")
    sigma1 = next(t for t in fig["data"] if t["name"] == "σ1")
    deltas = values(sigma1["x"]).numpy()
    assert deltas[0] == 0 and deltas[-1] == -63 and len(deltas) == 64
    dense = torch.linalg.svdvals(_dense_B(env[name], family, 0, 0))
    np.testing.assert_allclose(values(sigma1["y"]).numpy()[0], dense[0].item(), rtol=1e-4)
    reference = [t["name"] for t in fig["data"] if t.get("xaxis") == "x2"]
    assert reference[0] == "un-rotated W_Q W_K^T"
    assert (len(reference) == 2) == (family == "gpt_neox")  # the offset-free part of a partial rotary head
    if family == "llama":
        head = at.selectbox(key="head")
        assert head.options[:3] == ["0 (kv 0)", "1 (kv 0)", "2 (kv 1)"]


@pytest.mark.parametrize("page", ["3_Retrain.py", "5_Grow_d_k.py"])
def test_pages_that_need_a_task_say_so(env, page):
    at = open_page(str(ROOT / "app_pages" / page), "tiny-llama")
    assert any("has no known task" in w.value for w in at.warning)


PAGES = sorted(p.name for p in (ROOT / "app_pages").glob("*.py") if not p.name.startswith("0_"))


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_an_imported_model(env, page):
    """No exception or error on any page for a grouped-query rotary model (Home is a router
    page, rendered through app.py by test_shell)."""
    open_page(str(ROOT / "app_pages" / page), "tiny-llama", timeout=180)


def test_heatmaps_take_text_an_offset_and_a_token_pair(env):
    """Typed text goes through the folder's tokenizer.json; the vocabulary view at offset -3 and
    the pair-against-offset curve are the library's B(delta) (independently: token_pair_scores)."""
    from attn_core import bilinear
    from attn_core.bilinear import offsets
    from attn_core.sources import resolve

    at = open_page(str(ROOT / "app_pages" / "1_Heatmaps.py"), "tiny-neox")
    at.radio(key="input").set_value("typed").run()
    box = at.text_area(key="typed_text")
    box.set_value("the cat sat on the mat .").run()
    assert not at.exception and not at.error
    slider = next(s for s in at.slider if s.label.startswith("Offset"))
    slider.set_value(-3).run()
    assert not at.exception and not at.error
    loaded = resolve("tiny-neox")
    layer, head = 0, 0
    want = bilinear.vocabulary_view(loaded, layer, [head], offset=-3).scores[0]
    z = z_matrix(chart(at, "vocab"))
    assert torch.allclose(z[: want.shape[0], : want.shape[1]], want, atol=1e-4, equal_nan=True)
    pair = chart(at, "positional")
    ids = bilinear.input_ids(loaded, "the cat sat on the mat .")
    query = len(ids) - 1  # the page's default query is the last token
    curve = offsets.token_pair_scores(loaded.model, layer, head, ids[query], ids[query - 1], list(range(0, -64, -1)))
    np.testing.assert_allclose(values(pair["data"][0]["y"]).numpy(), curve.score.to_numpy(), rtol=1e-4, atol=1e-5)
