"""Soft-capped heads (Gemma 2's c tanh(S / c)): attribute's terms add up to the score before the cap
exactly, the capped score (the model's own) beside it, in Python, JSON and text; the vocabulary
view's penalties read the capped scores, as the model computes them."""

import json

import pytest
import torch

from attn_core.bilinear.score_parts import score_parts
from attn_core.checkpoint import LoadedModel
from attn_core.circuits import attribute, attribute_report
from attn_core.cli import main
from attn_core.hooks import act_name
from tests.conftest import make_tiny_model

IDS = [1, 5, 7, 9, 3, 4, 8, 2]


def _own_scores(model, layer, head, query):
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([IDS]))
    return cache[act_name("attn_scores", layer)][0, head, query].double()


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    pytest.importorskip("transformers")
    from attn_core.hf import load_hf
    from tests.unit.test_hf_new_families import write_family

    folder = tmp_path_factory.mktemp("gemma2")
    write_family(folder, "gemma2")
    return load_hf(folder), folder


def test_a_capped_rotary_head_splits_its_score_before_the_cap(gemma2):
    loaded, _ = gemma2
    for layer, head, query in [(0, 1, 7), (1, 2, 6)]:
        a = attribute(loaded, IDS, layer, head, query)
        parts = score_parts(loaded, IDS, layer, head)
        assert a.cap == 4.0
        assert torch.allclose(a.scores, parts.uncapped[query, a.keys].double(), atol=1e-5)  # S, the terms' sum
        assert torch.allclose(a.capped, _own_scores(loaded.model, layer, head, query)[a.keys], atol=1e-5)
        assert float(a.scores.abs().max()) > 4.0  # the cap bends some: before and after differ


def test_a_capped_plain_head_splits_by_singular_mode():
    model = make_tiny_model(n_layers=1, attn_softcap=0.5, std=0.5)
    loaded = LoadedModel(name="capped", model=model, config=model.cfg)
    a = attribute(loaded, IDS, 0, 1, 7)
    assert a.term_names is None and a.cap == 0.5  # singular modes of B
    assert torch.allclose(a.capped, _own_scores(model, 0, 1, 7)[a.keys], atol=1e-5)
    assert float(a.scores.abs().max()) > 0.5


def test_the_report_and_the_cli_show_both_scores(gemma2, capsys):
    loaded, folder = gemma2
    doc = attribute_report(loaded, 1, 2, 6, IDS)
    assert doc["softcap"] == 4.0 and "before the soft cap" in doc["score"]
    for k in doc["keys"]:
        assert k["score"] == pytest.approx(sum(t["contribution"] for t in k["terms"]) + k["bias"], abs=1e-6)
        assert k["capped_score"] == pytest.approx(4.0 * torch.tanh(torch.tensor(k["score"] / 4.0)).item(), abs=1e-6)
    tokens = " ".join(map(str, IDS))
    for extra in (["--json"], []):
        with pytest.raises(SystemExit) as e:
            main(["attribute", str(folder), "--layer", "1", "--head", "2", "--tokens", tokens, *extra])
        out = capsys.readouterr().out
        assert e.value.code == 0
        if extra:
            assert "capped_score" in json.loads(out)["keys"][0]
        else:
            assert "before the head's soft cap" in out and "capped" in out.splitlines()[2]


def test_vocabulary_penalties_read_the_capped_scores(gemma2):
    from attn_core.bilinear.views import vocab_scores
    from attn_core.regularizers.penalty import build_penalty, vocab_rows

    model = gemma2[0].model
    for layer in range(2):
        S = vocab_scores(model, layer)
        assert float(S.detach().abs().max()) <= 4.0  # capped: the rows are softmax of the model's own scores
        assert torch.allclose(vocab_rows(model, layer), torch.softmax(S, -1))
    penalty = build_penalty(["vocab_entropy=0.1", "vocab_hoyer=0.1", "vocab_topk:2=0.1"], model)
    total = sum(penalty(model).values())
    total.backward()
    W_Q = model.blocks[0].attn.W_Q
    assert torch.isfinite(total.detach()) and W_Q.grad is not None and float(W_Q.grad.abs().max()) > 0
    model.zero_grad()


def test_the_attribution_figure_marks_the_capped_scores(gemma2):
    from attn_core.figures.attribution import attribution_plot

    a = attribute(gemma2[0], IDS, 1, 2, 6)
    plot = attribution_plot(a, top=4)
    marks = [t for t in plot.fig.data if t.name and t.name.startswith("capped")]
    assert len(marks) == 1 and "before the soft cap" in plot.fig.layout.title.text
    want = [float(a.capped[a.keys.index(k)]) for k in a.top(4)]
    assert list(marks[0].y) == pytest.approx(want)


def test_the_long_input_mode_split_of_a_capped_head_is_attributes(gemma2):
    from attn_core.bilinear.blocked import layer_qk, row_stats
    from attn_core.circuits.long_split import mode_split

    loaded = gemma2[0]
    ids = [(7 * i) % 100 for i in range(40)]
    full = attribute(loaded, ids, 1, 2, 33)  # layer 1 is global: every earlier key is seen
    qk = layer_qk(loaded.model, ids, 1)
    keys = row_stats(qk, 2, k=5).top_keys[33].tolist()
    part = mode_split(loaded.model, qk, 2, 33, keys)
    at = [full.keys.index(k) for k in keys]
    assert part.cap == 4.0 and torch.allclose(part.terms, full.terms[at], atol=1e-5)
    assert torch.allclose(part.capped, full.capped[at], atol=1e-5)
