"""Attention sinks (attn_core.bilinear.sinks, Gu et al. 2024) against dense computations written
here (a loop over each query's visible keys, ``bilinear.visible_keys``) and against transformers'
own ``output_attentions`` on folders it built; the sink-free concentration (metrics.drop_keys);
the probes (attn_core.text.probes)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import metrics
from attn_core.bilinear import sequence_view, visible_keys
from attn_core.bilinear.sinks import EPS, Sinks, eligible_keys, key_importance, min_queries, sinks
from attn_core.hooks import act_name
from attn_core.sources import resolve
from attn_core.text.probes import check_length, probes, text_windows
from tests.conftest import make_tiny_model, write_tiny_gpt2, write_tiny_hf
from tests.text_corpus import make_text, write_word_tokenizer


def dense_importance(A: np.ndarray, model, layer: int) -> np.ndarray:
    """importance[h, k] = mean over probes and over the queries that see k of A[p, h, q, k], by
    loops over visible_keys (an independent reading of the definition)."""
    n, H, T, _ = A.shape
    total = np.zeros((H, T))
    count = np.zeros(T)
    for q in range(T):
        for k in visible_keys(model, layer, T, q):
            total[:, k] += A[:, :, q, k].sum(0)
            count[k] += n
    return total / count


# --- the definition ---------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 12), window=st.integers(0, 6), heads=st.integers(1, 3), seed=st.integers(0, 10_000))
def test_key_importance_matches_a_loop(T, window, heads, seed):
    g = torch.Generator().manual_seed(seed)
    i = torch.arange(T)
    mask = i[None, :] <= i[:, None]
    if window:
        mask &= i[:, None] - i[None, :] < window
    A = metrics.row_probs(torch.randn(heads, T, T, generator=g, dtype=torch.float64), mask)
    got = key_importance(A, mask)
    for k in range(T):
        qs = [q for q in range(T) if mask[q, k]]
        assert torch.allclose(got[:, k], A[:, qs, k].mean(-1), atol=1e-12)
    assert eligible_keys(mask).tolist() == [int(mask[:, k].sum()) >= min_queries(T) for k in range(T)]


def test_min_queries_keeps_local_heads_out():
    """A previous-token head gives a key seen by m queries importance 1/m: no key it may call a
    sink reaches eps with m >= min_queries; a head that always looks at token 0 is a sink."""
    T = 64
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    prev = torch.zeros(T, T, dtype=torch.float64)
    prev[0, 0] = 1
    prev[torch.arange(1, T), torch.arange(T - 1)] = 1
    first = torch.zeros(T, T, dtype=torch.float64)
    first[:, 0] = 1
    A = torch.stack([prev, first])[None]  # [1 layer, 2 heads, T, T] as one probe's patterns
    imp = key_importance(A[0], mask)[None]  # [1, 2, T]
    s = Sinks(imp, eligible_keys(mask)[None], EPS, 1, "made by hand")
    assert imp[0, 0, -1] == 0 and imp[0, 0, -2] == 0.5  # the last keys' "importance" of a local head
    assert s.is_sink.tolist() == [[False, True]] and s.rate == 0.5 and s.rate_first == 0.5
    assert s.heads()[1]["sink_keys"] == [0] and s.heads()[1]["first"] == 1.0
    js = s.to_json()
    assert js["sink_heads"] == 1 and js["n_heads"] == 2 and js["min_queries"] == 16 and js["eligible_keys"] == 49


# --- the model's sinks against dense computations ------------------------------------------------------


@pytest.mark.parametrize("config", [{}, {"n_layers": 2, "sliding_window": [0, 3]}, {"qk": "merged"}])
def test_sinks_match_the_patterns_read_densely(config):
    model = make_tiny_model("reverse", std=0.4, **config)
    tokens = torch.randint(0, model.cfg.d_vocab, (5, model.cfg.n_ctx), generator=torch.Generator().manual_seed(3))
    got = sinks(model, tokens, eps=0.2)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        A = cache[act_name("pattern", layer)].double().numpy()
        np.testing.assert_allclose(got.importance[layer].numpy(), dense_importance(A, model, layer), atol=1e-9)
    assert got.importance.shape == (model.cfg.n_layers, model.cfg.n_heads, model.cfg.n_ctx)
    strongest = got.importance.masked_fill(~got.eligible[:, None], -1).amax(-1)
    assert got.is_sink.tolist() == (strongest > 0.2).tolist()
    assert got.rate == pytest.approx(float((strongest > 0.2).double().mean()))


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral-window"])
def test_sinks_match_transformers_output_attentions(family, tmp_path):
    """The importance computed from transformers' own attentions (output_attentions=True) on a
    folder it built: GPT-2, Llama (rotary, grouped-query) and Mistral with a sliding window."""
    if family == "gpt2":
        reference = write_tiny_gpt2(tmp_path)
        window = 0
    elif family == "llama":
        reference = write_tiny_hf(tmp_path, "llama", num_key_value_heads=2)
        window = 0
    else:
        window = 5
        reference = write_tiny_hf(tmp_path, "mistral", num_key_value_heads=1, sliding_window=window)
    loaded = resolve(tmp_path)
    T = min(16, loaded.config.n_ctx)
    tokens = torch.randint(0, 100, (4, T), generator=torch.Generator().manual_seed(7))
    got = sinks(loaded.model, tokens)
    with torch.no_grad():
        attentions = reference(tokens, output_attentions=True).attentions
    i = np.arange(T)
    seen = i[None, :] <= i[:, None]
    if window:
        seen &= i[:, None] - i[None, :] < window
    for layer, A in enumerate(attentions):
        A = A.double().numpy()
        assert A.max() > 0.5
        ref = (A * seen).sum((0, 2)) / (seen.sum(0) * A.shape[0])
        np.testing.assert_allclose(got.importance[layer].numpy(), ref, atol=1e-5)


def test_bad_input_is_one_sentence():
    model = make_tiny_model("reverse")
    with pytest.raises(ValueError, match="eps"):
        sinks(model, torch.zeros(2, 4, dtype=torch.long), eps=1.5)
    with pytest.raises(ValueError, match="exceed the model context"):
        sinks(model, torch.zeros(2, model.cfg.n_ctx + 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[n, T\]"):
        sinks(model, torch.zeros(4, dtype=torch.long))


# --- concentration without the sinks ------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(T=st.integers(2, 10), seed=st.integers(0, 10_000), drop=st.lists(st.integers(0, 9), max_size=3))
def test_drop_keys_renormalizes_over_the_rest(T, seed, drop):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    p = metrics.row_probs(torch.randn(2, T, T, generator=g, dtype=torch.float64), mask)
    keys = torch.zeros(T, dtype=torch.bool)
    keys[[k for k in drop if k < T]] = True
    q, m = metrics.drop_keys(p, mask, keys)
    got = metrics.concentration(p, mask, k=2, exclude=keys)
    for h in range(2):
        for i in range(T):
            rest = [j for j in range(T) if mask[i, j] and not keys[j]]
            if not rest:
                assert not m[h, i].any()
                continue
            row = p[h, i, rest] / p[h, i, rest].sum()
            assert torch.allclose(q[h, i, rest], row, atol=1e-12) and m[h, i].sum() == len(rest)
            assert torch.allclose(got["entropy"][h, i], -(row * row.log()).sum(), atol=1e-9)
            assert torch.allclose(got["topk_mass"][h, i], row.topk(min(2, len(rest))).values.sum(), atol=1e-12)


def test_a_sink_heads_pattern_concentration_without_its_sink():
    """A head putting 0.9 on token 0 looks concentrated; without the sink its rows are uniform."""
    T = 8
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    A = torch.zeros(T, T, dtype=torch.float64)
    for i in range(T):
        A[i, : i + 1] = 0.1 / i if i else 1.0
        A[i, 0] = 0.9 if i else 1.0
    keys = eligible_keys(mask) & (key_importance(A, mask) > EPS)
    assert keys.tolist() == [True] + [False] * (T - 1)
    with_sink = metrics.concentration(A, mask)["normalized_entropy"]
    without = metrics.concentration(A, mask, exclude=keys)["normalized_entropy"]
    assert with_sink[-1] < 0.4 and torch.allclose(without[2:], torch.ones(T - 2, dtype=torch.float64))


def test_view_concentration_table_without_sinks():
    loaded = resolve("sort-2l-mlp")  # its layer-0 heads sink on token 0 (measured)
    view = sequence_view(loaded, loaded.task.sample(1, 0, split="test").tokens[0].tolist(), 0)
    table = view.concentration_table(1, without_sinks=True)
    sinks_of = view.sink_keys()
    assert sinks_of.any()
    for i, h in enumerate(view.heads):
        row = table[(table["head"] == h) & (table["metric"] == "normalized_entropy")].iloc[0]
        assert row["sink_keys"] == " ".join(map(str, torch.nonzero(sinks_of[i]).flatten().tolist()))
        p, m = metrics.drop_keys(view.pattern[i], view.mask, sinks_of[i])
        ok = m.sum(-1) >= 2
        expect = metrics.normalized_entropy(p, m)[ok].mean()
        assert row["mean"] == pytest.approx(float(expect), abs=1e-6)
    plain = view.concentration_table(1)
    assert "sink_keys" not in plain and len(plain) == len(table)


# --- probes -------------------------------------------------------------------------------------------------


def test_text_windows_are_even_and_disjoint():
    a, b = np.arange(100), np.arange(1000, 1030)
    w = text_windows([a, b], 5, 10)
    assert w.shape == (5, 10)
    starts = w[:, 0].tolist()
    assert starts == sorted(starts) and starts[0] == 0 and starts[-1] == 1020  # both streams, spread over them
    assert all((row == torch.arange(row[0], row[0] + 10)).all() for row in w)  # no window spans a boundary
    assert text_windows([a], 50, 10).shape == (10, 10)  # never more than there are
    with pytest.raises(ValueError, match="too few tokens"):
        text_windows([np.arange(5)], 3, 10)


def test_probes_of_a_text_and_of_a_task(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    write_tiny_gpt2(folder)
    write_word_tokenizer(folder)
    text = tmp_path / "text.txt"
    text.write_text(make_text(0, lines=80))
    loaded = resolve(folder)
    p = probes(loaded, text, n=6, cache_root=tmp_path / "cache")
    assert p.tokens.shape == (6, 16) and "windows of 16 tokens of" in p.what
    assert int(p.tokens.max()) < 100
    zoo = resolve("induction-2l")
    q = probes(zoo, n=3, length=10, seed=2)
    assert q.tokens.shape == (3, 10) and "held-out" in q.what
    assert torch.equal(q.tokens, zoo.task.sample(3, 2, split="test").tokens[:, :10])
    with pytest.raises(ValueError, match="give --text FILE"):
        probes(loaded)
    with pytest.raises(ValueError, match="no tokenizer.json"):
        probes(zoo, text)
    with pytest.raises(ValueError, match="--length"):
        check_length(1, 16)
    assert check_length(None, 16) == 16 and check_length(None, 1000) == 64


def test_sinks_on_zoo_models_are_finite():
    from attn_core.text.probes import measure_sinks

    s = measure_sinks(resolve("sort-2l-mlp"), n=8)
    assert torch.isfinite(s.importance).all() and 0 <= s.rate <= 1 and not math.isnan(s.rate_first)
    assert s.n_probes == 8 and s.length == 12
