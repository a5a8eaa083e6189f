"""AppTest of the Heatmaps page's parts of the score: a QK-norm model (Qwen3) shows the per-token
gains g_q(i), g_k(j) of the head beside its scores, a soft-capped model (Gemma 2) its scores after
the cap or, toggled, before it; both equal what the layer's form computes on the page's input,
and the capped scores are the model's own. A gpt-oss head (biases, a learned sink) shows its affine
form's terms and each query's mass on its sink beside token 0's. A model without any of these
shows no such section."""

from pathlib import Path

import pytest
import torch
from dashboard_helpers import chart, has_chart, open_page, values, z_matrix

from attn_core import bilinear
from attn_core.sources import resolve
from tests.unit.test_hf_new_families import write_family

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "1_Heatmaps.py")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-form-models")
    for family in ("qwen3", "gemma2", "gpt_oss"):
        write_family(root / f"tiny-{family}", family)
    write_family(root / "long-gpt_oss", "gpt_oss", max_position_embeddings=2048)
    return root


@pytest.fixture
def env(models, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_MODELS", str(models))


def _page_input(at, name):
    """The page's input (random tokens of its seed and length) and its layer and head."""
    loaded = resolve(name)
    p = at.query_params
    tokens = bilinear.random_tokens(loaded, int(p["seed"]), int(p["length"]))
    return loaded, tokens, int(p["layer"]), int(p["head"])


def test_a_qk_norm_head_shows_its_gains(env):
    at = open_page(PAGE, "tiny-qwen3")
    at.selectbox(key="head").select(1).run()
    assert not at.exception and not at.error
    loaded, tokens, layer, head = _page_input(at, "tiny-qwen3")
    assert head == 1
    parts = bilinear.score_parts(loaded, tokens, layer, head)
    fig = chart(at, "score_gains")
    assert torch.allclose(values(fig["data"][0]["y"]), parts.g_q, rtol=1e-5)
    assert torch.allclose(values(fig["data"][1]["y"]), parts.g_k, rtol=1e-5)
    assert not torch.allclose(parts.g_q, torch.ones_like(parts.g_q))  # a real factor, not ones
    assert not has_chart(at, "score_cap")  # Qwen3 has no cap


def test_a_capped_head_shows_its_scores_before_and_after_the_cap(env):
    at = open_page(PAGE, "tiny-gemma2")
    assert not has_chart(at, "score_gains")  # Gemma 2 has no QK-norm
    loaded, tokens, layer, head = _page_input(at, "tiny-gemma2")
    own = bilinear.sequence_view(loaded, tokens, layer).scores[head]  # the model's own (capped) scores
    mask = ~torch.isnan(z_matrix(chart(at, "score_cap")))
    after = z_matrix(chart(at, "score_cap"))
    assert torch.allclose(after[mask], own[mask], atol=1e-5)
    at.toggle(key="after_cap").set_value(False).run()
    assert not at.exception and not at.error
    before = z_matrix(chart(at, "score_cap"))
    parts = bilinear.score_parts(loaded, tokens, layer, head)
    assert torch.allclose(before[mask], parts.uncapped[mask], atol=1e-5)
    assert before[mask].abs().max() > parts.cap >= after[mask].abs().max()  # the cap binds on this input


def test_a_plain_model_has_no_score_parts():
    at = open_page(PAGE, "induction-2l")
    assert not any(h.value == "The parts of the score" for h in at.header)


def test_a_gpt_oss_head_shows_its_bias_terms_and_its_sink_share(env):
    at = open_page(PAGE, "tiny-gpt_oss")
    assert not at.exception and not at.error
    loaded, tokens, layer, head = _page_input(at, "tiny-gpt_oss")
    parts = bilinear.score_parts(loaded, tokens, layer, head)
    terms = chart(at, "score_terms")
    assert torch.allclose(values(terms["data"][0]["y"]), torch.tensor(list(parts.term_shares().values())), atol=1e-6)
    sink = chart(at, "score_sink")
    assert torch.allclose(values(sink["data"][0]["y"]), parts.sink_share, atol=1e-6)
    assert float(parts.sink_share.min()) > 0.0


def test_the_sinks_section_of_a_gpt_oss_model_shows_the_learned_share(env):
    at = open_page(PAGE, "tiny-gpt_oss")
    at.toggle(key="sinks_section").set_value(True).run()
    at.radio(key="heatmap_probes").set_value("input").run()
    assert not at.exception and not at.error
    loaded, tokens, _, _ = _page_input(at, "tiny-gpt_oss")
    found = bilinear.sinks(loaded.model, [tokens])
    fig = chart(at, "sinks")
    z = values(fig["data"][0]["z"]).double()
    assert torch.allclose(z[:, 0], found.learned.reshape(-1), atol=1e-6)  # the 'sink' column, left of token 0
    assert torch.allclose(z[:, 1:], found.importance.reshape(z.shape[0], -1), atol=1e-6, equal_nan=True)
    learned = next(m for m in at.metric if m.label == "mass on the learned sinks")
    assert learned.value == f"{found.learned_mean:.0%}"


@pytest.mark.parametrize("n", [600, 1100])
def test_a_long_input_to_a_gpt_oss_model_keeps_its_sinks(env, n):
    """A long input (600 tokens, as 1100) to a model with learned sinks is drawn from the blocked
    rows, which keep the sink (the exact-window view's pattern would leave it out)."""
    at = open_page(PAGE, "long-gpt_oss")
    at.number_input(key="random_length").set_value(n).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any(f"{n} tokens (" in i.value and "blocked scores" in i.value for i in at.info), [i.value for i in at.info]
