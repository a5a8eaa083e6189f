"""Multi-head latent attention (attn_core/model/mla.py) and the DeepSeek-V3 family: tiny random
folders made by transformers here (nothing downloaded), with the query latent and without it,
rotary pairs interleaved or not. transformers' eager attention is the reference for every head's
pattern and the logits; the form's terms add up to the model's own scores; the absorbed B's
spectrum is the dense float64 B's; an edit goes into the head's own up-projection; bad config
fields are refused in one line naming them."""

import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attn_core.hf import load_hf  # noqa: E402
from attn_core.hf.family_export import export_family, hf_origin  # noqa: E402
from attn_core.hooks import act_name  # noqa: E402

TINY = dict(
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=4,
    num_hidden_layers=2,
    intermediate_size=48,
    vocab_size=100,
    moe_intermediate_size=16,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_group=4,
    topk_group=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    q_lora_rank=16,
    kv_lora_rank=12,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=6,
    max_position_embeddings=64,
    rope_scaling=None,
    attn_implementation="eager",
)
# YaRN as DeepSeek's configs give it, over few original positions so that the ramp is inside the
# rotary dims; mscale != mscale_all_dim, so that both the rotary dims' attention factor (0.92) and
# the softmax scale's mscale^2 (1.87) differ from 1
YARN = {"rope_type": "yarn", "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
        "original_max_position_embeddings": 16, "rope_theta": 10000.0}  # fmt: skip
CASES = {
    "v3": {},
    "v3-no-interleave": dict(rope_interleave=False),
    "v3-no-query-latent": dict(q_lora_rank=None, first_k_dense_replace=0, n_group=1, topk_group=1),
    "v3-yarn": dict(rope_parameters=YARN, max_position_embeddings=640),
}


def write_deepseek(folder, **overrides):
    """A random tiny DeepSeek-V3 model saved into ``folder`` by transformers; returns it. Weights
    far from uniform attention and a random e_score_correction_bias (it changes the choice)."""
    cfg = transformers.DeepseekV3Config(**{**TINY, **overrides})
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3 if p.dim() > 1 else 0.1)
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.normal_(0.0, 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    return model


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, write_deepseek(folder, **CASES[request.param]), folder


def _tokens(n: int = 20, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 100, (batch, n), generator=torch.Generator().manual_seed(1))


def _close_logits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Within 1e-4 relative (of the largest logit)."""
    return float((got - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max()))


def test_patterns_and_logits_match_transformers(case):
    name, reference, folder = case
    loaded = load_hf(folder)
    tokens = _tokens()
    with torch.no_grad():
        ref = reference(tokens, output_attentions=True)
        plain = loaded.model(tokens)  # the fused path
        logits, cache = loaded.model.run_with_cache(tokens)
    for layer in range(2):
        A_ref = ref.attentions[layer]
        assert A_ref.max() > 0.5, (name, layer)
        err = float((cache[act_name("pattern", layer)] - A_ref).abs().max())
        assert err <= 1e-5, (name, layer, err)
    assert _close_logits(logits, ref.logits), (name, float((logits - ref.logits).abs().max()))
    assert _close_logits(plain, ref.logits), name


def test_features_reach_the_config(case):
    name, _, folder = case
    cfg = load_hf(folder).config
    want = dict(
        kv_lora_rank=12,
        q_lora_rank=0 if name == "v3-no-query-latent" else 16,
        d_head=8,
        rotary_dim=4,
        d_v=6,
        n_experts=8,
        experts_per_token=3,
        router_scoring="sigmoid",
        router_renorm=True,
        router_choice_bias=True,
        routed_scale=2.5,
        d_mlp=16,
        d_shared=16,
        router_groups=0 if name == "v3-no-query-latent" else 4,
        attn_scale=12**-0.5,  # (qk_nope_head_dim + qk_rope_head_dim)^-1/2
    )
    if name == "v3-yarn":  # times mscale^2, mscale = 0.1 mscale_all_dim ln(factor) + 1
        want["attn_scale"] = 12**-0.5 * (0.1 * math.log(40.0) + 1) ** 2
        assert cfg.rope_scaling["attention_factor"] == pytest.approx(
            (0.0707 * math.log(40) + 1) / (0.1 * math.log(40) + 1)
        )
    got = {k: getattr(cfg, k) for k in want}
    assert got.pop("attn_scale") == pytest.approx(want.pop("attn_scale"), rel=1e-12)
    assert got == want
    assert cfg.n_params() == sum(p.numel() for p in load_hf(folder).model.parameters())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A DeepSeek-V3 folder with a word-level tokenizer.json, and a long text for it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.unit.test_cli_new_families import WORDS

    root = tmp_path_factory.mktemp("deepseek_v3")
    write_deepseek(root, max_position_embeddings=2048)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    text = root.parent / "deepseek_v3.txt"
    text.write_text(" ".join(WORDS[1 + (i * 7) % 99] for i in range(1100)))
    return root, text


@pytest.mark.parametrize(
    "command",
    ["spectrum", "ranks", "scores", "long-scores", "heads", "sinks", "circuits", "attribute", "edit", "diff",
     "export-hf", "retrain", "retrain-vocab"],
)  # fmt: skip
def test_each_command_runs_on_deepseek(folder, command, capsys, tmp_path, monkeypatch):
    from tests.unit.test_cli_new_families import commands, run

    root, text = folder
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    code, out, err = run(capsys, *commands(root, text, tmp_path)[command])
    assert code == 0, err
    json.loads(out)


@torch.no_grad()
def _dense_B(reference, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B in residual-stream terms, B on the latents), float64, from transformers' own tensors:
    s W_DQ diag(w_q) W_UQ^h (W_UK^h)^T diag(w_kv) W_DKV^T (module doc of attn_core/model/mla.py)."""
    cfg, at = reference.config, reference.model.layers[layer].self_attn
    n, r, dv, rkv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    s = at.scaling  # (n + r)^-1/2, times YaRN's mscale^2 where the config scales the rotary
    q_b = at.q_b_proj if cfg.q_lora_rank else at.q_proj
    W_UQ = q_b.weight.double().reshape(-1, n + r, q_b.weight.shape[-1])[head, :n].T  # [r_q, n]
    W_UK = at.kv_b_proj.weight.double().reshape(-1, n + dv, rkv)[head, :n].T  # [r_kv, n]
    latent = s * W_UQ @ W_UK.T
    D_kv = at.kv_a_proj_with_mqa.weight.double()[:rkv].T * at.kv_a_layernorm.weight.double()
    D_q = at.q_a_proj.weight.double().T * at.q_a_layernorm.weight.double() if cfg.q_lora_rank else None
    return (latent if D_q is None else D_q @ latent) @ D_kv.T, latent


def test_the_forms_terms_add_up_to_the_models_own_scores(case):
    """S_ij = g_q(i) g_kv(j) x_i B x_j^T + g_q(i) x_i B_R(j - i) x_j^T at every offset, and the
    form's own scores are the model's."""
    from attn_core import bilinear as bl

    name, _, folder = case
    model = load_hf(folder).model
    T = 12
    with torch.no_grad():
        _, cache = model.run_with_cache(_tokens(T, 1))
        for layer in range(2):
            X = cache[act_name("attn_in", layer)][0]
            S = cache[act_name("attn_scores", layer)][0]
            form = model.blocks[layer].attn.form()
            assert torch.equal(form.scores(X), S), (name, layer)
            g_q, g_kv = bl.qk_gains(model, layer, X)
            B = bl.layer_form(model, layer).bilinear(X) * g_q[:, :, None] * g_kv[:, None, :]
            for delta in range(-(T - 1), 1):
                rows = torch.arange(-delta, T)
                rope = form.rope_core(delta).bilinear(X) * g_q[:, :, None]
                got = (B + rope)[:, rows, rows + delta]
                want = S[:, rows, rows + delta]
                assert float((got - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max())), (name, delta)


def test_spectrum_is_the_dense_float64_absorbed_B(case):
    from attn_core.bilinear.spectrum import spectrum_rows

    name, reference, folder = case
    model = load_hf(folder).model
    rows = spectrum_rows(model)
    n = model.cfg.d_head
    for row in rows:
        dense, latent = _dense_B(reference, row["layer"], row["head"])
        want = torch.linalg.svdvals(dense)
        assert row["rank_cap"] == n and len(row["singular_values"]) == n
        assert torch.allclose(torch.tensor(row["singular_values"], dtype=torch.float64), want[:n], rtol=1e-5), name
        assert float(want[n:].abs().max()) <= 1e-9 * float(want[0])  # rank <= qk_nope_head_dim
        got = model.blocks[row["layer"]].attn.form(row["head"]).latent().singular_values.double()
        assert torch.allclose(got, torch.linalg.svdvals(latent)[:n], rtol=1e-5), name


def test_an_edit_goes_into_the_heads_own_up_projection(case):
    """Dropping modes of one head changes its B as asked and every other head's B not at all (bit
    for bit); only that head's W_UQ rows (q_b_proj's) change, and the rotary term is kept."""
    from attn_core.bilinear import layer_form
    from attn_core.surgery import apply_factors, head_form64, head_modes, mode_factors

    name, _, folder = case
    model = load_hf(folder).model
    layer, head = 1, 2
    before = {k: v.clone() for k, v in model.state_dict().items()}
    forms = [layer_form(model, l).dense.clone() for l in range(2)]
    modes = head_modes(model, layer, head)
    assert modes.kind == "singular" and modes.k == model.cfg.d_head
    U, S, Vh = head_form64(model, layer, head).svd()
    f = mode_factors(modes, rank=3, scale=((0, 0.5),))
    apply_factors(model, layer, head, f)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed == [f"blocks.{layer}.attn.W_UQ"], changed
    W = model.state_dict()[f"blocks.{layer}.attn.W_UQ"]
    assert torch.equal(W[torch.arange(4) != head], before[f"blocks.{layer}.attn.W_UQ"][torch.arange(4) != head])
    after = [layer_form(model, l).dense for l in range(2)]
    for l in range(2):
        for h in range(4):
            if (l, h) != (layer, head):
                assert torch.equal(after[l][h], forms[l][h]), (name, l, h)
    want = (U * (f * S)) @ Vh
    got = head_form64(model, layer, head).dense
    assert float((got - want).abs().max()) <= 1e-5 * float(S[0]), name


def test_export_goes_back_to_the_family(case, tmp_path):
    """export-hf writes deepseek_v3 again (the rotary columns back in the file's order): transformers
    gives the same logits and attn-lab reads the same model."""
    name, _, folder = case
    loaded = load_hf(folder)
    origin = hf_origin(loaded)
    assert origin["model_type"] == "deepseek_v3"
    summary = export_family(loaded, tmp_path / "out", origin)
    assert summary["model_type"] == "deepseek_v3"
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written.get("rope_parameters") == json.loads((folder / "config.json").read_text()).get("rope_parameters")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    tokens = _tokens()
    with torch.no_grad():
        assert _close_logits(back(tokens).logits, loaded.model(tokens)), name
    again = load_hf(tmp_path / "out")
    assert again.config == loaded.config
    mine, theirs = loaded.model.state_dict(), again.model.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine), name


def _config(folder, **changes):
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (folder / "config.json").write_text(json.dumps(raw))


def _nan_choice_bias(folder):
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    tensors[CHOICE_BIAS][1] = float("nan")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


CHOICE_BIAS = "model.layers.1.mlp.gate.e_score_correction_bias"
# what to break, the field the refusal names
BROKEN = {
    "kv-rank": (lambda f: _config(f, kv_lora_rank=10), "kv_lora_rank"),
    "q-rank": (lambda f: _config(f, q_lora_rank=8), "q_lora_rank"),
    "q-rank-missing": (lambda f: _config(f, q_lora_rank=None), "q_lora_rank"),
    "nope-dim": (lambda f: _config(f, qk_nope_head_dim=6), "qk_nope_head_dim"),
    "rope-dim-odd": (lambda f: _config(f, qk_rope_head_dim=3), "qk_rope_head_dim"),
    "value-dim": (lambda f: _config(f, v_head_dim=5), "v_head_dim"),
    "experts-more-than-weights": (lambda f: _config(f, n_routed_experts=12), "n_routed_experts"),
    "experts-fewer-than-weights": (lambda f: _config(f, n_routed_experts=4, n_group=2), "n_routed_experts"),
    "top-k-above-experts": (lambda f: _config(f, num_experts_per_tok=9), "num_experts_per_tok"),
    "top-k-above-groups": (lambda f: _config(f, num_experts_per_tok=5, topk_group=2), "num_experts_per_tok"),
    "top-groups-above-groups": (lambda f: _config(f, topk_group=5), "topk_group"),
    "groups-uneven": (lambda f: _config(f, n_group=3), "n_group"),
    "kv-heads": (lambda f: _config(f, num_key_value_heads=2), "num_key_value_heads"),
    "choice-bias-nan": (_nan_choice_bias, CHOICE_BIAS),
    "dense-layers": (lambda f: _config(f, first_k_dense_replace=3), "first_k_dense_replace"),
    "shared-negative": (lambda f: _config(f, n_shared_experts=-1), "n_shared_experts"),
    "scaling-nan": (lambda f: _config(f, routed_scaling_factor=float("nan")), "routed_scaling_factor"),
    "yarn-mscale": (
        lambda f: _config(f, rope_scaling={"type": "yarn", "factor": 40, "mscale_all_dim": "one"}),
        "mscale_all_dim",
    ),
}


@pytest.fixture(params=list(BROKEN))
def broken(request, tmp_path):
    breaks, field = BROKEN[request.param]
    write_deepseek(tmp_path)
    breaks(tmp_path)
    return tmp_path, field


def test_bad_fields_are_refused_in_one_line_naming_them(broken, capsys):
    from attn_core.cli import main
    from tests.refusals import refuses

    folder, field = broken
    refuses(lambda: load_hf(folder), field)
    with pytest.raises(SystemExit) as e:
        main(["spectrum", str(folder)])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert field in err and len(err.strip().splitlines()) == 1, err


def test_attribution_splits_a_score_into_the_modes_and_the_rotary_term(case):
    """attribute: one term per singular mode of the absorbed B (with the latent gains) and the
    rotary term; they add up to the model's own score of every key."""
    from attn_core.circuits.attribution import attribute

    name, _, folder = case
    loaded = load_hf(folder)
    ids = _tokens(9, 1)[0].tolist()
    with torch.no_grad():
        _, cache = loaded.model.run_with_cache(torch.tensor([ids]))
    for layer, head in ((0, 1), (1, 3)):
        a = attribute(loaded, ids, layer, head, query=8)
        assert a.term_names[-1] == "rotary term" and len(a.term_names) == loaded.config.d_head + 1
        want = cache[act_name("attn_scores", layer)][0, head, 8, a.keys].double()
        assert torch.allclose(a.terms.sum(-1), want, atol=1e-5), (name, layer, head)


def test_the_vocabulary_view_carries_the_rotary_term(tmp_path):
    """f_x(y) at offset delta is what the model scores for token x's input as a query and token y's
    as a key delta positions apart: g_q g_kv x B y^T + g_q x B_R(delta) y^T."""
    from attn_core.bilinear.views import vocab_inputs, vocab_scores

    write_deepseek(tmp_path)
    model = load_hf(tmp_path).model
    a, b, T = 5, 9, 7
    with torch.no_grad():
        x = vocab_inputs(model, 1, [a, b])  # [2, d]
        form = model.blocks[1].attn.form()
        for delta in (0, -1, -6):
            i, j = T - 1, T - 1 + delta
            X = torch.zeros(T, model.cfg.d_model)
            X[j], X[i] = x[1], x[0]  # at offset 0 the key is the query itself: token a's pair (a, a)
            want = form.scores(X)[:, i, j]
            got = vocab_scores(model, 1, offset=delta, tokens=[a, b])[:, 0, 0 if delta == 0 else 1]
            assert torch.allclose(got, want, atol=1e-5), delta


@pytest.mark.parametrize("groups,top_groups,renorm", [(4, 2, True), (2, 1, False), (1, 1, True)])
def test_the_router_chooses_as_deepseeks(groups, top_groups, renorm):
    """route() against transformers' DeepseekV3TopkRouter on many tokens: sigmoid scores, the
    correction bias for choosing only, group-limited top-k, renormalised, times the scaling factor."""
    from attn_core.model import ModelConfig
    from attn_core.model.moe import route

    hf = transformers.DeepseekV3Config(
        **{**TINY, "n_group": groups, "topk_group": top_groups, "norm_topk_prob": renorm, "routed_scaling_factor": 1.7}
    )
    router = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3TopkRouter(hf)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.normal_(0.0, 0.5, generator=g)
        router.e_score_correction_bias.normal_(0.0, 0.3, generator=g)
    cfg = ModelConfig(d_model=32, d_mlp=16, n_experts=8, experts_per_token=3, router_scoring="sigmoid",
                      router_renorm=renorm, router_groups=groups if groups > 1 else 0,
                      router_top_groups=top_groups if groups > 1 else 0, router_choice_bias=True, routed_scale=1.7)  # fmt: skip
    x = torch.randn(500, 32, generator=g)
    with torch.no_grad():
        _, w_ref, idx_ref = router(x)
        w, idx = route(x @ router.weight.T, cfg, router.e_score_correction_bias)
    order, order_ref = idx.sort(-1), idx_ref.sort(-1)
    assert torch.equal(order.values, order_ref.values)
    assert torch.allclose(w.gather(-1, order.indices), w_ref.gather(-1, order_ref.indices), atol=1e-6)


V2 = dict(
    {k: v for k, v in TINY.items() if k not in ("n_group", "topk_group", "rope_scaling")},
    q_lora_rank=None,
    n_shared_experts=2,
    routed_scaling_factor=1.5,
)
V2_CASES = {
    "v2-lite-greedy": dict(topk_method="greedy"),
    "v2-group-limited": dict(topk_method="group_limited_greedy", n_group=4, topk_group=2, q_lora_rank=16),
    "v2-lite-yarn": dict(topk_method="greedy", rope_parameters=YARN, max_position_embeddings=640),
}


def _as_hub_config(folder):
    """config.json with YaRN spelled as the published DeepSeek configs spell it: ``rope_scaling``
    with ``type``, ``rope_theta`` beside it."""
    raw = json.loads((folder / "config.json").read_text())
    params = raw.pop("rope_parameters")
    raw["rope_theta"] = params.pop("rope_theta")
    raw["rope_scaling"] = {"type": params.pop("rope_type"), **params}
    (folder / "config.json").write_text(json.dumps(raw))
    return raw["rope_scaling"]


@pytest.mark.parametrize("name", list(V2_CASES))
def test_deepseek_v2_matches_transformers_and_exports_back(name, tmp_path):
    """DeepSeek-V2 (V2-Lite: no query latent): softmax routing, greedy or group-limited (a group's
    best expert), the routed scaling factor, adjacent rotary pairs; patterns, logits, export."""
    cfg = transformers.DeepseekV2Config(**{**V2, **V2_CASES[name]})
    torch.manual_seed(0)
    reference = transformers.DeepseekV2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for key, p in reference.named_parameters():
            p.uniform_(0.5, 1.5) if "norm" in key and p.dim() == 1 else p.normal_(0.0, 0.3 if p.dim() > 1 else 0.1)
    reference.save_pretrained(tmp_path / "m", safe_serialization=True)
    scaling = _as_hub_config(tmp_path / "m") if name == "v2-lite-yarn" else None
    loaded = load_hf(tmp_path / "m")
    assert loaded.config.router_scoring == "softmax" and not loaded.config.router_renorm
    assert loaded.config.router_groups == (4 if name == "v2-group-limited" else 0)
    tokens = _tokens()
    with torch.no_grad():
        ref = reference(tokens, output_attentions=True)
        plain = loaded.model(tokens)
        logits, cache = loaded.model.run_with_cache(tokens)
        for layer in range(2):
            assert float((cache[act_name("pattern", layer)] - ref.attentions[layer]).abs().max()) <= 1e-5
            X, S = cache[act_name("attn_in", layer)][0], cache[act_name("attn_scores", layer)][0]
            assert torch.equal(loaded.model.blocks[layer].attn.form().scores(X), S)  # the form's are the model's
        assert _close_logits(logits, ref.logits) and _close_logits(plain, ref.logits)
        export_family(loaded, tmp_path / "out", hf_origin(loaded))
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
        assert _close_logits(back(tokens).logits, plain)
    assert load_hf(tmp_path / "out").config == loaded.config
    assert json.loads((tmp_path / "out" / "config.json").read_text()).get("rope_scaling") == scaling


def test_al_load_opens_deepseek(folder):
    import attn_core as al

    root, _ = folder
    model = al.load(str(root))
    assert model.config.mla and model.card.details["architecture"] == "deepseek_v3"


def test_retraining_reaches_the_router_and_experts_not_the_choice_bias(case):
    """--train all: the router, the experts and the shared expert learn from the next-token loss;
    the correction bias only chooses, so no gradient reaches it (it stays as loaded)."""
    from attn_core.finetune import select_trainable

    _, _, folder = case
    model = load_hf(folder).model
    trained = select_trainable(model, "all", set())
    assert "blocks.1.mlp.W_router" in trained and "blocks.1.attn.W_UQ" in trained
    tokens = _tokens()
    logits = model(tokens)
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 100), tokens[:, 1:].reshape(-1)).backward()
    mlp = model.blocks[1].mlp
    assert float(mlp.W_router.grad.abs().max()) > 0
    assert float(mlp.shared.W_in.grad.abs().max()) > 0
    assert sum(float(e.W_in.grad.abs().max()) > 0 for e in mlp.experts if e.W_in.grad is not None) >= 3
    assert mlp.b_choice.grad is None
    qk = select_trainable(model, "qk", {0, 1})
    assert {n.rsplit(".", 1)[-1] for n in qk} == {"W_DQ", "W_UQ", "W_QR", "W_KR", "W_UK"} - (
        set() if model.cfg.q_lora_rank else {"W_DQ"}
    )


@torch.no_grad()
def test_the_ov_map_is_the_value_rows_of_kv_b_proj(case):
    """W_OV^h = W_DKV diag(w_kv) W_UV^h W_O^h (v from kv_b_proj's value rows), against the dense
    float64 product of transformers' tensors."""
    from attn_core.circuits.ov import ov_form

    name, reference, folder = case
    model = load_hf(folder).model
    cfg = reference.config
    n, dv, rkv, h = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank, cfg.num_attention_heads
    for layer in range(2):
        at = reference.model.layers[layer].self_attn
        D_kv = at.kv_a_proj_with_mqa.weight.double()[:rkv].T * at.kv_a_layernorm.weight.double()
        W_UV = at.kv_b_proj.weight.double().reshape(h, n + dv, rkv)[:, n:].transpose(1, 2)  # [h, r_kv, dv]
        W_O = at.o_proj.weight.double().T.reshape(h, dv, -1)
        want = D_kv @ W_UV @ W_O  # [h, d, d]
        got = ov_form(model, layer).dense.double()
        assert torch.allclose(got, want, atol=1e-5), (name, layer)


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v2"])
def test_conversion_makes_every_tensor_on_the_files_device(family):
    """Every tensor the DeepSeek converters make is on the device of the file's tensors (the meta
    device stands in for an accelerator), and they are exactly the model's parameters."""
    from attn_core.hf.families import REGISTRY
    from attn_core.hf.family import convert
    from attn_core.hf.load import model_config
    from attn_core.model import Transformer

    raw = {k: v for k, v in TINY.items() if k != "attn_implementation"} | dict(model_type=family)
    if family == "deepseek_v2":
        raw |= dict(topk_method="group_limited_greedy")
    cfg = model_config(raw)
    ours = convert(REGISTRY[family], cfg, raw, lambda n, shape: torch.randn(shape, device="meta"), lambda n: False)
    assert {t.device.type for t in ours.values()} == {"meta"}
    assert set(ours) == {n for n, _ in Transformer(cfg).named_parameters()}


def test_a_retrain_job_moves_the_router_and_experts_and_exports_back(tmp_path):
    """A retrain on text (a job, as the CLI and the Retrain page run it): the routers and experts
    learn, no load-balancing term is added, the correction bias stays, and the run exports back to
    deepseek_v3 with the same logits in transformers."""
    from attn_core.retraining.job import TrainingJob
    from attn_core.sources import resolve
    from attn_core.training.config import JobConfig
    from tests.text_corpus import make_text, write_word_tokenizer

    folder = tmp_path / "model"
    write_deepseek(folder, max_position_embeddings=256)
    write_word_tokenizer(folder)
    text = tmp_path / "text.txt"
    text.write_text(make_text(0, lines=150))
    job = TrainingJob.open(JobConfig(source=str(folder), text=str(text), block=12, steps=4, lr=1e-2, batch_size=8))
    res = job.run()
    assert res["status"] == "completed", res["message"]
    terms = {n for n in job.snapshot().metrics()["name"] if n.startswith("term:")}
    assert not any("aux" in t or "balanc" in t or "router" in t for t in terms), terms
    before, after = load_hf(folder).model.state_dict(), resolve(f"run:{res['run_id']}")
    now = after.model.state_dict()
    assert not torch.equal(before["blocks.1.mlp.W_router"], now["blocks.1.mlp.W_router"])
    assert not torch.equal(before["blocks.1.attn.W_UQ"], now["blocks.1.attn.W_UQ"])
    assert torch.equal(before["blocks.1.mlp.b_choice"], now["blocks.1.mlp.b_choice"])
    assert any(not torch.equal(before[f"blocks.1.mlp.experts.{e}.W_in"], now[f"blocks.1.mlp.experts.{e}.W_in"])
               for e in range(8))  # fmt: skip
    export_family(after, tmp_path / "exported", hf_origin(after))
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported", attn_implementation="eager").eval()
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert _close_logits(back(tokens).logits, after.model(tokens))


def test_the_kernel_methods_see_the_mla_heads_own_attention(tmp_path):
    """head_qkv (what the kernel approximations start from) gives q, k of the whole MLA head at its
    own scale: softmax(q k^T) with the causal mask is the model's pattern."""
    from attn_core.kernels.errors import head_qkv

    folder = tmp_path / "m"
    write_deepseek(folder)
    model = load_hf(folder).model
    tokens = _tokens(10, 1)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        for layer, head in ((0, 0), (1, 3)):
            q, k, _ = head_qkv(model, tokens, layer, head)
            S = (q @ k.transpose(-1, -2)).masked_fill(~torch.ones(10, 10, dtype=torch.bool).tril(), float("-inf"))
            A = torch.softmax(S, -1)
            assert torch.allclose(A, cache[act_name("pattern", layer)][:, head], atol=1e-6)


def test_blocked_scores_are_the_models_own(case):
    """The blocked path (long inputs) gives each MLA head's S as the model does (its scale too)."""
    from attn_core.bilinear.blocked import layer_qk

    name, _, folder = case
    model = load_hf(folder).model
    ids = _tokens(16, 1)[0].tolist()
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids]))
        for layer in range(2):
            qk = layer_qk(model, ids, layer)
            S = cache[act_name("attn_scores", layer)][0]
            for h in range(model.cfg.n_heads):
                got, want = qk.scores(h, 0, 16, 0, 16), S[h]
                seen = torch.isfinite(got)
                assert torch.allclose(got[seen], want[seen], atol=1e-5, rtol=1e-5), (name, layer, h)


def test_diff_measures_the_absorbed_B(case):
    """layer_distances of an MLA model and a copy with one head edited: ||B_a - B_b||_F /
    (||B_a||_F + ||B_b||_F) of the absorbed B's, densely (no rotation planes: B has none)."""
    from attn_core.bilinear import layer_form
    from attn_core.surgery import apply_factors, head_modes, mode_factors
    from attn_core.surgery.diff import layer_distances

    name, _, folder = case
    a, b = load_hf(folder).model, load_hf(folder).model
    apply_factors(b, 1, 2, mode_factors(head_modes(b, 1, 2), rank=2))
    D = layer_distances(a, b, 1)
    Ba, Bb = layer_form(a, 1).dense.double(), layer_form(b, 1).dense.double()
    want = torch.linalg.matrix_norm(Ba[:, None] - Bb[None]) / (
        torch.linalg.matrix_norm(Ba)[:, None] + torch.linalg.matrix_norm(Bb)[None]
    )
    assert torch.allclose(D.double(), want, atol=1e-5), name
    assert float(D[2, 2]) > 0.01 and float(D[0, 0]) < 1e-6


def test_the_long_mode_split_gives_the_two_terms(case):
    """mode_split from a long input's kept Q and K: an MLA head's score as its absorbed B's term and
    the rotary term, adding up to the model's score."""
    from attn_core.bilinear.blocked import layer_qk
    from attn_core.circuits.long_split import mode_split

    name, _, folder = case
    model = load_hf(folder).model
    ids = _tokens(16, 1)[0].tolist()
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids]))
        qk = layer_qk(model, ids, 1)
        split = mode_split(model, qk, 3, 15, list(range(16)))
    assert split.term_names == ["absorbed B", "rotary term"]
    want = cache[act_name("attn_scores", 1)][0, 3, 15].double()
    assert torch.allclose(split.terms.sum(-1), want, atol=1e-5), name


def test_a_transplant_copies_the_heads_own_up_projection_rows(folder, tmp_path, capsys):
    """edit --from B --with-ov on DeepSeek-V3: the head's W_UQ, W_QR, W_UK (q_b_proj's and
    kv_b_proj's rows of that head), W_UV and W_O rows come from B; every other head's stay."""
    from tests.unit.test_cli_new_families import run

    root, text = folder
    other = tmp_path / "other"
    write_deepseek(other, max_position_embeddings=2048, kv_lora_rank=12)  # the same shape, other weights
    with torch.no_grad():  # write_deepseek seeds alike: move B's weights away from A's
        ref = transformers.AutoModelForCausalLM.from_pretrained(other)
        for p in ref.parameters():
            p.add_(0.05)
        ref.save_pretrained(other)
    out = tmp_path / "edited"
    args = ["edit", root, "--head", "L1H2", "--from", other, "--with-ov", "--text", text, "--samples", 2,
            "--length", 16, "--out", out, "--json"]  # fmt: skip
    code, _, err = run(capsys, *args)
    assert code == 0, err
    a, b, c = (load_hf(f).model.state_dict() for f in (root, other, out))
    for name in ("W_UQ", "W_QR", "W_UK", "W_UV", "W_O"):
        key = f"blocks.1.attn.{name}"
        assert torch.equal(c[key][2], b[key][2]), name
        keep = torch.arange(4) != 2
        assert torch.equal(c[key][keep], a[key][keep]), name
    assert torch.equal(c["blocks.1.attn.W_DKV"], a["blocks.1.attn.W_DKV"])  # the shared latent stays


def test_a_token_pairs_score_against_the_offset_is_the_models(tmp_path):
    """token_pair_scores (the Heatmaps page's positional view of a rotary model): for an MLA head,
    what the model scores for the two tokens' inputs delta positions apart, gains included."""
    from attn_core.bilinear.offsets import token_pair_scores
    from attn_core.bilinear.views import vocab_inputs

    write_deepseek(tmp_path)
    model = load_hf(tmp_path).model
    a, b, T = 5, 9, 8
    frame = token_pair_scores(model, 1, 2, a, b, offsets=[-1, -3, -7])
    with torch.no_grad():
        x = vocab_inputs(model, 1, [a, b])
        for delta, got in zip(frame["delta"], frame["score"]):
            i, j = T - 1, T - 1 + int(delta)
            X = torch.zeros(T, model.cfg.d_model)
            X[i], X[j] = x[0], x[1]
            assert got == pytest.approx(float(model.blocks[1].attn.form(2).scores(X)[i, j]), abs=1e-5)


def test_the_gallery_draws_the_mla_two_terms_with_the_other_score_parts(tmp_path):
    """The gallery's Heatmaps page of its tiny DeepSeek-V3 folder draws the parts of the score as
    the page does: the latent gains and the two terms, whose cells add up to the model's scores;
    a model without parts (the tiny Llama) draws none."""
    from attn_core import bilinear, sources
    from attn_core.gallery import pages
    from attn_core.gallery.models import tiny_deepseek, tiny_llama

    m = sources.resolve(str(tiny_deepseek(tmp_path / "tiny-deepseek")))
    assert m.config.mla
    entries = {e.what: e for e in pages.heatmaps(m, quick=True)}
    assert "parts of the score: the gains" in entries
    plot = entries["parts of the score: MLA's two terms"].plot
    table = plot.data
    layer = m.config.n_layers - 1
    tokens = bilinear.random_tokens(m, 0, min(24, m.config.n_ctx))
    parts = bilinear.score_parts(m, tokens, layer, 0)
    seen = parts.mask.reshape(-1).numpy()
    total = (table["absorbed"] + table["rotary"]).to_numpy()[seen]
    assert torch.allclose(torch.tensor(total).double(), parts.capped.reshape(-1)[seen].double(), atol=1e-5)
    plain = sources.resolve(str(tiny_llama(tmp_path / "tiny-llama")))
    assert not [e for e in pages.heatmaps(plain, quick=True) if e.what.startswith("parts of the score")]


def test_a_learned_sink_on_an_mla_model_is_refused_by_name(folder):
    """MLA with learned sinks (no family has both) is refused in one sentence naming attn_sinks,
    and so is an edit of an MLA head's sink logit."""
    import dataclasses

    import attn_core as al

    root, _ = folder
    cfg = load_hf(root).config
    with pytest.raises(ValueError, match="attn_sinks") as e:
        dataclasses.replace(cfg, attn_sinks=True)
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(ValueError, match="sink") as e:
        al.edit(str(root), "L1H0", sink=0.5, text=root.parent / "deepseek_v3.txt", samples=2)
    assert "no learned sink logit" in str(e.value) and len(str(e.value).splitlines()) == 1
