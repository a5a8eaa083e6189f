"""Hostile models (issue 25): what used to load and give wrong numbers with exit 0 — a sliding
window ignored by attribution, tensors of the wrong shape, a tensor in two shards, config fields
of the wrong type or spelled twice, rotary frequencies that overflow, safetensors headers that lie
about their sizes, and files of a model folder that are links leading out. Every model is built
here (tiny Hugging Face folders are written by transformers); each refusal is one sentence."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from attn_core import bilinear  # noqa: E402
from attn_core.circuits.attribution import attribute, token_position_split  # noqa: E402
from attn_core.hooks import act_name  # noqa: E402
from attn_core.sources import resolve  # noqa: E402
from tests.conftest import make_tiny_model, write_tiny_hf  # noqa: E402

WINDOW = 5


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and 0 < len(text) < 600, text
    return text


@pytest.fixture(scope="module")
def mistral(tmp_path_factory) -> Path:
    """A tiny Mistral whose layers see the last WINDOW keys only."""
    folder = tmp_path_factory.mktemp("mistral")
    write_tiny_hf(folder, "mistral", num_key_value_heads=1, sliding_window=WINDOW)
    return folder


# --- the model's own mask in every view and attribution -----------------------------------------------


@pytest.mark.parametrize("layer", [0, 1])
def test_attribution_keys_are_the_keys_the_windowed_head_sees(mistral, layer):
    loaded = resolve(mistral)
    ids = [7] * 20  # "cat" x 20: every key looks alike, only the mask tells them apart
    view = bilinear.sequence_view(loaded, ids, layer)
    with torch.no_grad():
        _, cache = loaded.model.run_with_cache(torch.tensor([ids]))
    S = cache[act_name("attn_scores", layer)][0]
    for head in range(4):
        for query in (3, 12, 19):
            a = attribute(loaded, ids, layer, head, query)
            seen = torch.nonzero(view.mask[query]).flatten().tolist()
            assert a.keys == seen == list(range(max(0, query - WINDOW + 1), query + 1))
            assert torch.allclose(a.scores, S[head, query, seen].double(), atol=1e-5)
            assert a.top(1)[0] in seen


def test_the_positional_view_and_long_views_use_the_layer_window():
    model = make_tiny_model("reverse", sliding_window=[3], std=0.5)
    from attn_core.sources import LoadedModel

    loaded = LoadedModel("windowed", model, model.cfg)
    n = min(model.cfg.n_ctx, bilinear.MAX_VIEW_TOKENS)
    view = bilinear.positional_view(loaded, 0)
    assert torch.equal(view.mask, bilinear.layer_mask(model, 0, n).cpu())
    assert not view.mask[n - 1, 0] and view.pattern[0, n - 1, : n - 3].abs().max() == 0
    ids = list(range(10))
    split = token_position_split(loaded, ids, 0, 9)
    assert split["key"].tolist() == [7, 8, 9]
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids]))
    assert torch.allclose(
        torch.tensor(split["score"].to_numpy()), cache[act_name("attn_scores", 0)][0, 0, 9, 7:].double(), atol=1e-5
    )


def test_kernel_approximations_refuse_a_windowed_head(mistral):
    from attn_core.kernels import head_qkv

    model = resolve(mistral).model
    q, _, _ = head_qkv(model, torch.arange(WINDOW), 1, 0)  # within the window: the causal form is exact
    assert q.shape[1] == WINDOW
    with pytest.raises(ValueError, match="sliding window of 5 keys") as e:
        head_qkv(model, torch.arange(12), 1, 0)
    one_line(e)
