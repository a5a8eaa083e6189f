"""The attention module owns the form: ``Attention.form`` hands out a layer's (or a head's)
:class:`BilinearScore`, whose scores are the model's own pre-softmax scores (QK-norm per head and
across heads, a score scale, a soft cap, a sliding window, a local rotary base, NoPE layers,
grouped-query heads, biases, merged heads), whose core and gains give them back as
S_ij = g_q(i) g_k(j) x_i B~ x_j^T, and which ``set_form`` writes back."""

import pytest
import torch

from attn_core.hooks import act_name
from attn_core.model import ModelConfig, Transformer
from tests.unit.test_model_features import BASE, VARIANTS, _model

SMALL = dict(n_layers=2, n_heads=4, d_model=32, d_head=8, d_mlp=48, n_ctx=32, d_vocab=50)
OTHERS = {
    "gpt2-like": dict(SMALL, attn_bias=True),
    "merged": dict(SMALL, qk="merged"),
    "grown": dict(SMALL, d_qk=[[8, 5, 8, 3], [8, 8, 8, 8]]),
    "rotary-gqa-bias": dict(BASE, attn_bias=True),
}


def _other(name: str) -> Transformer:
    torch.manual_seed(1)
    model = Transformer(ModelConfig(**OTHERS[name])).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    if name == "grown":
        model.zero_qk_padding()
    return model


def _models():
    return [(v, _model(**f)) for v, f in VARIANTS.items()] + [(n, _other(n)) for n in OTHERS]


@pytest.mark.parametrize("name, model", _models(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_forms_scores_are_the_models_own(name, model):
    model = model.double()
    ids = torch.randint(0, model.cfg.d_vocab, (2, 12))
    _, cache = model.run_with_cache(ids)
    for layer, block in enumerate(model.blocks):
        X, S = cache[act_name("attn_in", layer)], cache[act_name("attn_scores", layer)]
        form = block.attn.form()
        assert torch.allclose(form.scores(X), S, atol=1e-10), (name, layer)
        for h in range(model.cfg.n_heads):
            assert torch.allclose(block.attn.form(h).scores(X), S[:, h], atol=1e-10), (name, layer, h)
        if form.cap is None and form.inv_freq is None:  # S = g_q g_k x B~ y^T exactly
            g_q, g_k = form.gains(X)
            X1 = torch.cat([X, torch.ones_like(X[..., :1])], -1)  # [x | 1]: the biases in B'
            core = form.core(augmented=True).bilinear(X1.unsqueeze(1))
            assert torch.allclose(g_q[..., :, None] * g_k[..., None, :] * core, S, atol=1e-10), (name, layer)


@pytest.mark.parametrize("name", list(OTHERS))
def test_set_form_writes_the_new_form_back(name):
    model = _other(name)
    attn = model.blocks[1].attn
    X = torch.randn(1, 6, model.cfg.d_model)
    before = attn.form().scores(X).detach()
    new = attn.form(2)
    if new.merged:
        new = new.replace(dense=new.dense.detach() * 2)
    else:
        bias_q = None if new.bias_q is None else new.bias_q.detach() * 2
        new = new.replace(left=new.left.detach() * 2, bias_q=bias_q)
    attn.set_form(new, 2)
    after = attn.form().scores(X).detach()
    assert torch.allclose(after[:, 2], before[:, 2] * 2, atol=1e-5)
    assert torch.equal(after[:, [0, 1, 3]], before[:, [0, 1, 3]])


def test_a_head_outside_the_layer_is_refused():
    with pytest.raises(IndexError, match="head 9"):
        _other("merged").blocks[0].attn.form(9)
