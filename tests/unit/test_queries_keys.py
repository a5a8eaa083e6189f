"""The one function that gives a layer's Q and K as the model applies them
(attn_core/bilinear/queries_keys.py): from token ids or from a forward's cache, with each head's
scale, the window, the cap and a learned sink logit read from the layer's form; its scores are the
model's own, and the engines over rows (penalties, summaries, blocked rows) take the sink from it."""

from __future__ import annotations

import math
import types

import pytest
import torch

from attn_core import regularizers as R
from attn_core.bilinear.queries_keys import layer_qk
from attn_core.hooks import act_name
from attn_core.model import ModelConfig, Transformer
from attn_core.regularizers.summaries import data_concentration, qk_cache

BASE = dict(n_layers=2, d_model=16, n_heads=4, d_head=4, d_mlp=32, d_vocab=20, n_ctx=24)
VARIANTS = {
    "plain": {},
    "merged": dict(qk="merged"),
    "gqa-rotary-window": dict(n_kv_heads=2, positional="rotary", sliding_window=[5, 0]),
    "grown": dict(d_qk=[[2, 4, 3, 4], [4, 4, 1, 2]]),
    "bias": dict(attn_bias=True),
}


def model_of(extra) -> Transformer:
    torch.manual_seed(0)
    m = Transformer(ModelConfig(**{**BASE, **extra}))
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return m


TOKENS = torch.randint(0, 20, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_both_sources_give_the_models_own_scores(variant):
    m = model_of(VARIANTS[variant])
    kept = {}
    m.run_with_hooks(TOKENS, [(act_name("attn_scores", 1), lambda t, name: kept.setdefault("S", t.detach()))])
    one = layer_qk(m, TOKENS[0].tolist(), 1)  # one input: every head, key heads as stored
    for h in range(one.n_heads):
        S = one.scores(h, 0, 24, 0, 24)
        vis = S.isfinite()
        torch.testing.assert_close(S[vis], kept["S"][0, h][vis], atol=1e-5, rtol=1e-5)
    cache = qk_cache(m)
    m(TOKENS, cache=cache)
    heads = [3, 1]
    many = layer_qk(m, cache, 1, heads)  # a forward's cache: the chosen heads, batched
    q, scale = many.folded()
    S = scale * q @ many.k.transpose(-1, -2)
    torch.testing.assert_close(S, kept["S"][:, heads], atol=1e-5, rtol=1e-5)
    assert many.window == one.window == m.cfg.window(1) and many.sink is None
    assert layer_qk(m, {}, 1) is None


def test_a_learned_sink_in_the_form_reaches_every_engine(monkeypatch):
    """A form that carries a sink logit per head (gpt-oss): the penalty's rows, the telemetry
    summaries and the blocked rows of one input are those of the softmax with the sink."""
    m = model_of({})
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0])
    attn = m.blocks[0].attn
    real = attn.form

    def form(head=None):
        f = real(head)
        return types.SimpleNamespace(window=f.window, cap=f.cap, sink=sink)

    monkeypatch.setattr(attn, "form", form)
    kept = {}
    m.run_with_hooks(TOKENS, [(act_name("attn_scores", 0), lambda t, name: kept.setdefault("S", t.detach()))])
    S = kept["S"]
    T = S.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    S = torch.cat([S.masked_fill(~causal, -math.inf), sink.view(1, 4, 1, 1).expand(2, 4, T, 1)], -1)
    P = torch.softmax(S, -1)
    ent = -torch.where(P > 0, P * P.log(), torch.zeros_like(P)).sum(-1) / torch.arange(2, T + 2).log()
    want_entropy = ent[..., 1:].mean((0, 2))  # rows with two keys or more
    pen = R.build_penalty(["entropy@L0=1", "sink@L0=1"], m)
    cache = pen.cache()
    m(TOKENS, cache=cache)
    got = R.data_values(m, cache, 0, range(4), "entropy")
    torch.testing.assert_close(got, want_entropy, atol=1e-5, rtol=1e-5)
    sink_mass = (P[..., 0] + P[..., -1])[..., 1:].mean((0, 2))
    torch.testing.assert_close(R.data_values(m, cache, 0, range(4), "sink"), sink_mass, atol=1e-5, rtol=1e-5)
    c = qk_cache(m)
    m(TOKENS, cache=c)
    torch.testing.assert_close(data_concentration(m, c)["entropy"][0], want_entropy, atol=1e-5, rtol=1e-5)
    from attn_core.bilinear.blocked import row_stats

    stats = row_stats(layer_qk(m, TOKENS[0].tolist(), 0), 2, k=2)
    torch.testing.assert_close(stats.learned, P[0, 2, :, -1], atol=1e-5, rtol=1e-5)
