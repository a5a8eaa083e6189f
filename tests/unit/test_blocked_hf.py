"""Blocked scores on folders built by transformers: equal to its ``output_attentions`` (Llama at
2048 tokens; Mistral with a sliding window and one key head), causal (the first 1024 queries of
8192 tokens are a 1024-token prefix's), and the mode split of a key equals ``attribute``'s."""

import math

import pytest
import torch

pytest.importorskip("transformers")

from attn_core.bilinear.blocked import layer_qk, row_stats  # noqa: E402
from attn_core.circuits.attribution import attribute  # noqa: E402
from attn_core.circuits.long_split import mode_split  # noqa: E402
from attn_core.sources import resolve  # noqa: E402
from tests.conftest import make_tiny_model, write_tiny_hf  # noqa: E402

TOL = dict(atol=2e-5, rtol=1e-4)


def _ids(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, 100, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _against(reference, loaded, ids, k=4):
    with torch.no_grad():
        ref = reference(torch.tensor([ids]), output_attentions=True)
    for layer in range(2):
        qk = layer_qk(loaded.model, ids, layer)
        for head in (0, 3):
            A = ref.attentions[layer][0, head].double()
            stats = row_stats(qk, head, k=k)
            ent = -torch.where(A > 0, A * A.log(), torch.zeros_like(A)).sum(-1)
            assert torch.allclose(stats.entropy.double(), ent, atol=2e-4, rtol=1e-3), (layer, head)
            assert torch.allclose(stats.sink.double(), A[:, 0], atol=2e-5)
            real = stats.top_keys >= 0
            top, _ = A.topk(k, -1)
            assert torch.allclose(
                torch.where(real, stats.top_weights.double(), 0), torch.where(real, top, 0), atol=2e-5
            )
            got = A.gather(1, stats.top_keys.clamp_min(0))
            assert torch.allclose(got[real], stats.top_weights.double()[real], atol=2e-5)


def test_llama_2048_tokens_equal_output_attentions(tmp_path):
    reference = write_tiny_hf(tmp_path, "llama", num_key_value_heads=2, max_position_embeddings=2048)
    _against(reference, resolve(tmp_path), _ids(2048))


def test_mistral_window_and_one_key_head_equal_output_attentions(tmp_path):
    reference = write_tiny_hf(
        tmp_path, "mistral", num_key_value_heads=1, sliding_window=37, max_position_embeddings=300
    )
    loaded = resolve(tmp_path)
    assert loaded.config.sliding_window == [37, 37]
    _against(reference, loaded, _ids(300))


def test_the_first_queries_of_a_long_input_are_its_prefixs(tmp_path):
    write_tiny_hf(tmp_path, "llama", num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=8192)
    model = resolve(tmp_path).model
    ids = _ids(8192, seed=3)
    long_qk, short_qk = layer_qk(model, ids, 1), layer_qk(model, ids[:1024], 1)
    long, short = row_stats(long_qk, 2, k=5), row_stats(short_qk, 2, k=5)
    assert long.n == 8192 and short.n == 1024
    assert torch.equal(long.top_keys[:1024], short.top_keys)
    for name in ("lse", "top_weights", "entropy", "sink"):
        assert torch.allclose(getattr(long, name)[:1024], getattr(short, name), atol=1e-5, rtol=1e-5), name
    assert torch.allclose(long.offsets[:1024], short.offsets, atol=1e-5, equal_nan=True)


def _same_split(a, b):
    assert a.keys == b.keys and a.terms.shape == b.terms.shape
    assert torch.allclose(a.terms, b.terms, atol=1e-5) and torch.allclose(a.bias_parts, b.bias_parts, atol=1e-5)
    assert torch.allclose(a.sigma, b.sigma, atol=1e-6)


def test_mode_split_equals_attribute_with_rotary(tmp_path):
    write_tiny_hf(tmp_path, "llama", num_key_value_heads=2, attention_bias=True)
    loaded = resolve(tmp_path)
    ids, q = _ids(40), 33
    full = attribute(loaded, ids, 1, 3, q)
    qk = layer_qk(loaded.model, ids, 1)
    keys = row_stats(qk, 3, k=5).top_keys[q].tolist()
    part = mode_split(loaded.model, qk, 3, q, keys)
    at = [full.keys.index(k) for k in keys]
    assert torch.allclose(part.terms, full.terms[at], atol=1e-5) and part.term_names == full.term_names
    assert torch.allclose(part.scores.float(), qk.scores(3, q, q + 1, 0, q + 1)[0, keys], atol=1e-4)
    with pytest.raises(ValueError, match="does not see key 39"):
        mode_split(loaded.model, qk, 3, q, [39])


def test_mode_split_equals_attribute_with_the_singular_modes(save_model):
    from attn_core.checkpoint import save

    model = make_tiny_model("reverse", std=0.5, n_heads=2, attn_bias=True)
    save_model("m")  # a user-model root for resolve
    import os
    from pathlib import Path

    folder = Path(os.environ["ATTN_LAB_MODELS"]) / "split"
    save(model, folder, card={"task": "reverse"})
    loaded = resolve("split")
    ids = loaded.task.sample(1, seed=0).tokens[0].tolist()
    q = len(ids) - 1
    full = attribute(loaded, ids, 0, 1, q)
    qk = layer_qk(loaded.model, ids, 0)
    part = mode_split(loaded.model, qk, 1, q, full.keys)
    _same_split(part, full)
    assert math.isclose(float(part.scores.sum()), float(full.scores.sum()), abs_tol=1e-4)
