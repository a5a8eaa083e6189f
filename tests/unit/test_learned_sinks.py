"""Learned sinks (gpt-oss) and YaRN rotary scaling in the model: the sink logit in each row's
denominator (the pattern, its sink share, through the form as a differentiable view), the config
fields absent at their defaults, and YaRN's frequencies and attention factor against transformers'
own rope init."""

import math

import pytest
import torch

from attn_core.model import ModelConfig, Transformer, attention_weights
from attn_core.model.config import FEATURES
from attn_core.model.rotary import attention_factor, inverse_frequencies


def _cfg(**kw) -> ModelConfig:
    base = dict(n_layers=2, n_heads=3, d_model=24, d_head=8, n_ctx=32, d_vocab=20, attn_sinks=True)
    return ModelConfig(**{**base, **kw})


def test_the_sink_joins_each_rows_denominator():
    torch.manual_seed(0)
    S, z = torch.randn(3, 5, 5), torch.tensor([0.5, -1.0, 2.0])
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    A = attention_weights(S, mask, sinks=z)
    for h in range(3):
        for i in range(5):
            e = S[h, i, : i + 1].exp()
            want = e / (e.sum() + z[h].exp())
            assert torch.allclose(A[h, i, : i + 1], want, atol=1e-6)
            assert float(A[h, i, i + 1 :].abs().sum()) == 0.0
    one = attention_weights(S[1], mask, sinks=z[1])  # one head: a 0-dim sink
    assert torch.allclose(one, A[1])


def test_the_model_pattern_and_the_forms_sink_share_add_up_to_one():
    from attn_core.hooks import act_name

    torch.manual_seed(0)
    model = Transformer(_cfg())
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sinks.copy_(torch.tensor([1.0, -2.0, 3.0]))
        tokens = torch.randint(0, 20, (2, 9))
        logits, cache = model.run_with_cache(tokens)
        assert torch.allclose(model(tokens), logits, atol=1e-5)  # no fused path forgets the sink
        form = model.blocks[1].attn.form()
        X = cache[act_name("attn_in", 1)]
        mask = form.visibility(9).dense()
        S = form.scores(X)
        A = cache[act_name("pattern", 1)]
        assert torch.allclose(form.weights(S, mask), A, atol=1e-6)
        share = form.sink_share(S, mask)
        assert torch.allclose(A.sum(-1) + share, torch.ones_like(share), atol=1e-6)
        assert float(share.min()) > 0.01  # the sink takes a real share
        assert torch.allclose(form[2].sink_share(S[:, 2], mask), share[:, 2])


def test_the_forms_sink_is_a_view_of_the_parameter_and_is_written_back():
    model = Transformer(_cfg())
    attn = model.blocks[0].attn
    form = attn.form()
    form[1].head_sinks().backward()
    assert attn.sinks.grad.tolist() == [0.0, 1.0, 0.0]
    before = attn.sinks.tolist()
    new = form.replace(sink=torch.tensor([4.0, 5.0, 6.0]))
    attn.set_form(new, head=2)
    assert attn.sinks.tolist() == [*before[:2], 6.0]


def test_sink_fields_are_absent_at_their_defaults_and_counted():
    for name in ("attn_sinks", "glu_limit", "glu_alpha"):
        assert name in FEATURES and name not in ModelConfig().to_dict()
    for cfg in (_cfg(), _cfg(gated_mlp=True, mlp_act="silu", d_mlp=12, glu_limit=7.0, glu_alpha=1.702)):
        assert sum(p.numel() for p in Transformer(cfg).parameters()) == cfg.n_params()
        assert ModelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(attn_sinks=1), "attn_sinks"),
        (dict(entmax_alpha=1.5), "attn_sinks"),
        (dict(glu_limit=float("nan"), gated_mlp=True, mlp_act="silu", d_mlp=8), "glu_limit"),
        (dict(glu_limit=7.0, d_mlp=8), "glu_limit"),
        (dict(glu_alpha=2.0), "glu_alpha"),
    ],
)
def test_a_bad_sink_or_glu_field_is_one_sentence_naming_it(bad, field):
    with pytest.raises(ValueError) as e:
        _cfg(**bad)
    assert field in str(e.value) and "\n" not in str(e.value)


transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    "params",
    [
        dict(factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False, original_max_position_embeddings=4096),
        dict(factor=8.0, original_max_position_embeddings=512),  # beta defaults, truncate
        dict(factor=40.0, mscale=1.0, mscale_all_dim=1.0, original_max_position_embeddings=4096),
        dict(factor=4.0, mscale=0.707, mscale_all_dim=1.0, original_max_position_embeddings=2048, beta_fast=16.0),
        dict(factor=16.0, attention_factor=1.5, original_max_position_embeddings=1024, truncate=True),
    ],
)
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_yarn_frequencies_and_attention_factor_are_transformers(params, partial):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from attn_core.hf.load import model_config

    rope = {"rope_type": "yarn", "rope_theta": 150000.0, **params}
    if partial != 1.0:
        rope["partial_rotary_factor"] = partial
    raw = dict(model_type="llama", hidden_size=64, num_attention_heads=4, num_hidden_layers=1, intermediate_size=8,
               vocab_size=10, max_position_embeddings=8192, rope_parameters=rope)  # fmt: skip
    ref_cfg = transformers.LlamaConfig(**{k: v for k, v in raw.items() if k != "model_type"})
    want_inv, want_factor = ROPE_INIT_FUNCTIONS["yarn"](ref_cfg, "cpu")
    cfg = model_config(raw)
    assert cfg.rope_scaling["type"] == "yarn"
    assert torch.allclose(inverse_frequencies(cfg), want_inv, rtol=1e-6, atol=0)
    assert math.isclose(attention_factor(cfg), want_factor, rel_tol=1e-12)


def test_yarn_puts_its_factor_on_the_rotated_dims_of_q_and_k():
    """B~ of a partially rotary YaRN head has a^2 on its rotated dims only: the form's scores are the
    model's (q and k as the model forms them) at every offset."""
    from attn_core.hooks import act_name

    yarn = dict(type="yarn", factor=8.0, beta_fast=32.0, beta_slow=1.0, truncate=True,
                original_max_position_embeddings=16, attention_factor=1.3)  # fmt: skip
    cfg = _cfg(positional="rotary", rotary_dim=4, rope_scaling=yarn, attn_sinks=False)
    torch.manual_seed(0)
    model = Transformer(cfg)
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.randint(0, 20, (1, 7)))
        X, S = cache[act_name("attn_in", 0)][0], cache[act_name("attn_scores", 0)][0]
        form = model.blocks[0].attn.form()
        for delta in (0, -3):
            B = form.core(offset=delta).dense  # [h, d, d]
            rows = torch.arange(-delta, 7)
            got = torch.einsum("hid,id->hi", X[rows] @ B, X[rows + delta])
            assert torch.allclose(got, S[:, rows, rows + delta], atol=1e-5), delta


def test_the_sink_metric_reports_the_learned_share_and_token_0s():
    """Each head's learned share is the mean over probes and queries of 1 - sum_k A[q, k], its
    token-0 share the first key's importance; the CLI's table and the figure show both."""
    from attn_core.bilinear.sinks import sinks
    from attn_core.figures.sinks import importance_plot
    from attn_core.hooks import act_name

    torch.manual_seed(0)
    model = Transformer(_cfg())
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sinks.copy_(torch.tensor([2.0, -1.0, 0.0]))
        probes = torch.randint(0, 20, (3, 10))
        found = sinks(model, probes)
        _, cache = model.run_with_cache(probes)
    for l in range(2):
        A = cache[act_name("pattern", l)].double()
        assert torch.allclose(found.learned[l], (1 - A.sum(-1)).mean((0, 2)), atol=1e-9)
        assert torch.allclose(found.first[l], A[..., 0].mean((0, 2)), atol=1e-9)
    assert float(found.learned[0, 0]) > float(found.learned[0, 1]) > 0.0  # a larger logit takes more
    rows = found.to_json()["heads"]
    assert rows[0]["learned"] == pytest.approx(float(found.learned[0, 0]))
    plot = importance_plot(found)
    assert plot.meta["learned_mean"] == pytest.approx(found.learned_mean)
    assert list(plot.fig.data[0].x)[0] == -1 and plot.fig.data[0].z.shape == (6, 11)
    plain = sinks(Transformer(_cfg(attn_sinks=False)), probes)
    assert plain.learned is None and plain.to_json()["learned_mean"] is None
