"""The routed mixture-of-experts MLP (attn_core/model/moe.py): its routing against a token-by-token
reference (softmax and sigmoid scores, with and without renormalisation, a shared expert with or
without its gate), its config fields (absent
at their defaults, each bad value one sentence naming it), and retraining an imported Mixtral,
Qwen3-MoE, OLMoE or Qwen2-MoE on text: the router and the experts learn, the experts' biases (which these families do
not have) stay zero, and the run exports back to its family with the logits attn-lab computes."""

import json

import pytest
import torch

from attn_core.hooks import act_name
from attn_core.model import ModelConfig, Transformer
from attn_core.model.config import FEATURES
from attn_core.model.moe import MoE

MOE = ("n_experts", "experts_per_token", "router_scoring", "router_renorm", "router_bias", "d_shared", "shared_gate")


def _cfg(**kw) -> ModelConfig:
    base = dict(d_model=16, d_mlp=12, gated_mlp=True, mlp_act="silu", n_experts=5, experts_per_token=2)
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renorm", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_each_token_gets_its_top_experts_weighted_by_their_scores(scoring, renorm, bias):
    torch.manual_seed(0)
    moe = MoE(_cfg(router_scoring=scoring, router_renorm=renorm, router_bias=bias))
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.5)
        x = torch.randn(3, 7, 16)
        got = moe(x)
        for token in x.reshape(-1, 16):
            logits = token @ moe.W_router + (moe.b_router if bias else 0.0)
            scores = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
            top = sorted(range(5), key=lambda e: -float(scores[e]))[:2]
            w = scores[top] / (scores[top].sum() if renorm else 1.0)
            want = sum(w[i] * moe.experts[e](token) for i, e in enumerate(top))
            row = (x.reshape(-1, 16) == token).all(-1).nonzero()[0, 0]
            assert torch.allclose(got.reshape(-1, 16)[row], want, atol=1e-6)


@pytest.mark.parametrize("gate", [False, True])
def test_the_shared_expert_is_added_for_every_token(gate):
    torch.manual_seed(0)
    moe = MoE(_cfg(d_shared=9, shared_gate=gate))
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.5)
        x = torch.randn(2, 5, 16)
        routed = torch.zeros_like(x)
        w, chosen = moe.choices(x)
        for i in range(2):
            routed += w[..., i, None] * torch.stack(
                [moe.experts[e](t) for e, t in zip(chosen[..., i].flatten(), x.reshape(-1, 16))]
            ).reshape(x.shape)
        shared = moe.shared(x) * (torch.sigmoid(x @ moe.W_shared_gate) if gate else 1.0)
        assert torch.allclose(moe(x), routed + shared, atol=1e-5)


def test_a_model_without_experts_saves_the_config_it_always_did():
    assert not set(MOE) & set(ModelConfig(d_mlp=8).to_dict())
    assert set(MOE) <= set(FEATURES)
    cfg = _cfg()
    assert cfg.to_dict()["n_experts"] == 5 and ModelConfig.from_dict(cfg.to_dict()) == cfg
    for c in (cfg, _cfg(router_bias=True, d_shared=7, shared_gate=True), _cfg(gated_mlp=False, d_shared=3)):
        assert sum(p.numel() for p in Transformer(c).parameters()) == c.n_params(), c


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(n_experts=-1), "n_experts"),
        (dict(n_experts=2.5), "n_experts"),
        (dict(experts_per_token=6), "experts_per_token"),
        (dict(experts_per_token=0), "experts_per_token"),
        (dict(router_scoring="tanh"), "router_scoring"),
        (dict(router_renorm="yes"), "router_renorm"),
        (dict(n_experts=0), "experts_per_token"),
        (dict(d_mlp=0), "d_mlp"),
        (dict(d_shared=-3), "d_shared"),
        (dict(router_bias=1), "router_bias"),
        (dict(shared_gate=True), "shared_gate"),
        (dict(n_experts=0, experts_per_token=0, d_shared=8), "d_shared"),
    ],
)
def test_a_bad_expert_field_is_one_sentence_naming_it(bad, field):
    with pytest.raises(ValueError) as e:
        _cfg(**bad)
    msg = str(e.value)
    assert field in msg and "\n" not in msg, msg


def test_a_nan_router_bias_is_refused_naming_it():
    from attn_core.checkpoint import CheckpointError, build_checked

    cfg = _cfg(router_bias=True)
    tensors = Transformer(cfg).state_dict()
    tensors["blocks.0.mlp.b_router"][1] = float("nan")
    with pytest.raises(CheckpointError, match=r"blocks\.0\.mlp\.b_router"):
        build_checked(cfg, tensors)


def test_gradients_reach_the_router_and_the_chosen_experts():
    torch.manual_seed(0)
    model = Transformer(_cfg(d_vocab=20, n_layers=1))
    tokens = torch.randint(0, 20, (2, 16))
    torch.nn.functional.cross_entropy(model(tokens)[:, :-1].reshape(-1, 20), tokens[:, 1:].reshape(-1)).backward()
    moe = model.blocks[0].mlp
    assert float(moe.W_router.grad.abs().max()) > 0
    with torch.no_grad():  # the choices, as docs/maths.md reads them: from the MLP's input
        _, cache = model.run_with_cache(tokens)
        chosen = set(moe.choices(model.blocks[0].ln2(cache[act_name("resid_mid", 0)]))[1].unique().tolist())
    for e in range(5):
        assert (float(moe.experts[e].W_in.grad.abs().max()) > 0) == (e in chosen), e


def test_our_own_mixture_of_experts_is_refused_by_the_gpt2_export(tmp_path):
    from attn_core.checkpoint import CheckpointError, LoadedModel
    from attn_core.hf.export import export_gpt2

    model = Transformer(_cfg(d_model=64, d_vocab=20))
    with pytest.raises(CheckpointError, match="n_experts"):
        export_gpt2(LoadedModel(name="tiny", model=model, config=model.cfg), tmp_path / "t")
    assert not (tmp_path / "t").exists()


transformers_needed = pytest.mark.skipif(
    __import__("importlib").util.find_spec("transformers") is None, reason="needs transformers"
)


@transformers_needed
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "olmoe", "qwen2_moe"])
def test_retraining_moves_the_router_and_experts_and_exports_back(family, tmp_path):
    import transformers

    from attn_core.hf import load_hf
    from attn_core.hf.family_export import export_family, hf_origin
    from attn_core.retraining.job import TrainingJob
    from attn_core.sources import resolve
    from attn_core.training.config import JobConfig
    from tests.text_corpus import make_text, write_word_tokenizer
    from tests.unit.test_hf_new_families import write_family

    folder = tmp_path / "model"
    write_family(folder, family, max_position_embeddings=256)
    write_word_tokenizer(folder)
    text = tmp_path / "text.txt"
    text.write_text(make_text(0, lines=150))
    job = TrainingJob.open(JobConfig(source=str(folder), text=str(text), block=12, steps=4, lr=1e-2, batch_size=8))
    res = job.run()
    assert res["status"] == "completed", res["message"]
    terms = {n for n in job.snapshot().metrics()["name"] if n.startswith("term:")}
    assert not any("aux" in t or "balanc" in t or "router" in t for t in terms), terms  # no load-balancing loss
    before, after = load_hf(folder).model.state_dict(), resolve(f"run:{res['run_id']}")
    now = after.model.state_dict()
    for name in ("blocks.0.mlp.W_router", "blocks.1.mlp.W_router"):
        assert not torch.equal(before[name], now[name]), name
    moved = [
        e
        for e in range(4)
        if not torch.equal(before[f"blocks.0.mlp.experts.{e}.W_in"], now[f"blocks.0.mlp.experts.{e}.W_in"])
    ]
    assert moved, "no expert learned"
    assert all(float(v.abs().max()) == 0 for k, v in now.items() if ".experts." in k and ".b_" in k)
    out = tmp_path / "exported"
    export_family(after, out, hf_origin(after))
    assert json.loads((out / "config.json").read_text())["model_type"] == family
    back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert float((back(tokens).logits - after.model(tokens)).abs().max()) <= 1e-4


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_conversion_makes_every_expert_tensor_on_the_files_device(family):
    """The expert biases a family has no tensor for are made where the file's tensors are (the meta
    device stands in for an accelerator; a routed forward cannot run on it: its routing is data)."""
    from attn_core.hf.families import REGISTRY
    from attn_core.hf.family import convert
    from attn_core.hf.load import model_config

    raw = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48, vocab_size=100)
    raw |= dict(model_type=family, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40)
    raw["num_local_experts" if family == "mixtral" else "num_experts"] = 3
    cfg = model_config(raw)
    ours = convert(REGISTRY[family], cfg, raw, lambda n, shape: torch.randn(shape, device="meta"), lambda n: False)
    assert {t.device.type for t in ours.values()} == {"meta"}
    assert set(ours) == {n for n, _ in Transformer(cfg).named_parameters()}
