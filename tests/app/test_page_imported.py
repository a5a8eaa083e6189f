"""Imported Hugging Face models on the dashboard: a tiny Llama-family folder (grouped-query
attention, rotary) and a GPT-NeoX folder (partial rotary) listed through ATTN_LAB_MODELS. The
Spectrum page's B(delta) section is checked against a dense SVD of the transformers weights;
pages that need a task say that an imported model has none."""

from pathlib import Path

import numpy as np
import pytest
import torch
from dashboard_helpers import chart, open_page, values

from tests.conftest import write_tiny_hf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-models")
    llama = write_tiny_hf(root / "tiny-llama", "llama", num_key_value_heads=2)
    neox = write_tiny_hf(root / "tiny-neox", "gpt_neox", rotary_pct=0.5)
    return root, {"tiny-llama": llama, "tiny-neox": neox}


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
    at = open_page(str(ROOT / "pages" / "2_Spectrum.py"), name)
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
    at = open_page(str(ROOT / "pages" / page), "tiny-llama")
    assert any("has no known task" in w.value for w in at.warning)


PAGES = sorted(p.name for p in (ROOT / "pages").glob("*.py") if not p.name.startswith("0_"))


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_an_imported_model(env, page):
    """No exception or error on any page for a grouped-query rotary model (Home is a router
    page, rendered through app.py by test_shell)."""
    open_page(str(ROOT / "pages" / page), "tiny-llama", timeout=180)
