"""A family's hostile config or weights (a norm weight of the wrong shape or missing, a cap of 0,
negative or NaN, expert counts that disagree with the weights or top-k above them, a NaN router,
gpt-oss's sink tensor of the wrong length, NaN or missing, its NaN router bias, its SwiGLU fields and YaRN fields, layer types that do not match the layer count, a head_dim that disagrees where
the family fixes it) is one line naming the field: from the Python loader, and exit 2 from the CLI."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from attn_core.cli import main  # noqa: E402
from attn_core.hf import load_hf  # noqa: E402
from tests.refusals import refuses  # noqa: E402
from tests.unit.test_hf_new_families import write_family  # noqa: E402

Q_NORM = "model.layers.0.self_attn.q_norm.weight"
ROUTER = "model.layers.1.block_sparse_moe.gate.weight"
EXPERT = "model.layers.1.mlp.experts.2.up_proj.weight"
SINKS = "model.layers.1.self_attn.sinks"
OSS_ROUTER_BIAS = "model.layers.0.mlp.router.bias"


def _config(folder, **changes):
    raw = json.loads((folder / "config.json").read_text())
    raw.update(changes)
    (folder / "config.json").write_text(json.dumps(raw))  # NaN is written as the JSON reader's NaN


def _weights(folder, change):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


# (family, what to break, the field the refusal names)
CASES = {
    "norm-wrong-shape": ("qwen3", lambda f: _weights(f, lambda t: t.update({Q_NORM: torch.ones(3)})), Q_NORM),
    "norm-missing": ("qwen3", lambda f: _weights(f, lambda t: t.pop(Q_NORM)), Q_NORM),
    "olmo2-norm-per-head": (
        "olmo2",
        lambda f: _weights(f, lambda t: t.update({"model.layers.1.self_attn.k_norm.weight": torch.ones(8)})),
        "model.layers.1.self_attn.k_norm.weight",
    ),
    "cap-zero": ("gemma2", lambda f: _config(f, attn_logit_softcapping=0), "attn_logit_softcapping"),
    "cap-negative": ("gemma2", lambda f: _config(f, final_logit_softcapping=-30.0), "final_logit_softcapping"),
    "cap-nan": ("gemma2", lambda f: _config(f, attn_logit_softcapping=float("nan")), "attn_logit_softcapping"),
    "cap-gemma3-unused-still-checked": (
        "gemma3_text",
        lambda f: _config(f, attn_logit_softcapping=-1.0),
        "attn_logit_softcapping",
    ),
    "cap-string": ("gemma2", lambda f: _config(f, attn_logit_softcapping="50"), "attn_logit_softcapping"),
    "layer-types-short": ("gemma2", lambda f: _config(f, layer_types=["sliding_attention"]), "layer_types"),
    "layer-types-unknown": ("exaone4", lambda f: _config(f, layer_types=["local", "global"]), "layer_types"),
    "no-rope-layers-long": ("smollm3", lambda f: _config(f, no_rope_layers=[1, 0, 1]), "no_rope_layers"),
    "head-dim-fixed-olmo2": ("olmo2", lambda f: _config(f, head_dim=16), "head_dim"),
    "head-dim-fixed-phi3": ("phi3", lambda f: _config(f, head_dim=4), "head_dim"),
    "query-scalar-zero": ("gemma3_text", lambda f: _config(f, query_pre_attn_scalar=0), "query_pre_attn_scalar"),
    "multiplier-negative": ("granite", lambda f: _config(f, residual_multiplier=-1.0), "residual_multiplier"),
    "experts-more-than-weights": ("mixtral", lambda f: _config(f, num_local_experts=6), "num_local_experts"),
    "experts-fewer-than-weights": ("qwen3_moe", lambda f: _config(f, num_local_experts=3), "num_local_experts"),
    "experts-zero": ("mixtral", lambda f: _config(f, num_local_experts=0), "num_local_experts"),
    "experts-two-counts": ("qwen3_moe", lambda f: _config(f, num_experts=8), "num_experts"),
    "top-k-above-experts": ("mixtral", lambda f: _config(f, num_experts_per_tok=5), "num_experts_per_tok"),
    "top-k-zero": ("qwen3_moe", lambda f: _config(f, num_experts_per_tok=0), "num_experts_per_tok"),
    "router-nan": ("mixtral", lambda f: _weights(f, lambda t: t[ROUTER].fill_(float("nan"))), ROUTER),
    "expert-missing": ("qwen3_moe", lambda f: _weights(f, lambda t: t.pop(EXPERT)), EXPERT),
    "olmoe-clip-qkv": ("olmoe", lambda f: _config(f, clip_qkv=8.0), "clip_qkv"),
    "olmoe-top-k-above-experts": ("olmoe", lambda f: _config(f, num_experts_per_tok=9), "num_experts_per_tok"),
    "qwen2-moe-shared-expert-missing": (
        "qwen2_moe",
        lambda f: _weights(f, lambda t: t.pop("model.layers.0.mlp.shared_expert_gate.weight")),
        "model.layers.0.mlp.shared_expert_gate.weight",
    ),
    "qwen2-moe-sparse-step": ("qwen2_moe", lambda f: _config(f, decoder_sparse_step=2), "decoder_sparse_step"),
    "dense-layers-among-experts": ("qwen3_moe", lambda f: _config(f, mlp_only_layers=[1]), "mlp_only_layers"),
    "gpt-oss-sinks-wrong-length": (
        "gpt_oss",
        lambda f: _weights(f, lambda t: t.update({SINKS: torch.zeros(3)})),
        SINKS,
    ),
    "gpt-oss-sinks-nan": ("gpt_oss", lambda f: _weights(f, lambda t: t[SINKS].fill_(float("nan"))), SINKS),
    "gpt-oss-sinks-missing": ("gpt_oss", lambda f: _weights(f, lambda t: t.pop(SINKS)), SINKS),
    "gpt-oss-router-bias-nan": (
        "gpt_oss",
        lambda f: _weights(f, lambda t: t[OSS_ROUTER_BIAS].fill_(float("nan"))),
        OSS_ROUTER_BIAS,
    ),
    "gpt-oss-experts-more-than-weights": ("gpt_oss", lambda f: _config(f, num_local_experts=6), "num_local_experts"),
    "gpt-oss-top-k-above-experts": ("gpt_oss", lambda f: _config(f, num_experts_per_tok=5), "num_experts_per_tok"),
    "gpt-oss-swiglu-limit-nan": ("gpt_oss", lambda f: _config(f, swiglu_limit=float("nan")), "swiglu_limit"),
    "gpt-oss-swiglu-alpha-negative": ("gpt_oss", lambda f: _config(f, swiglu_alpha=-1.0), "swiglu_alpha"),
    "gpt-oss-width-disagrees": ("gpt_oss", lambda f: _config(f, intermediate_size=40), "intermediate_size"),
    "gpt-oss-yarn-factor-negative": (
        "gpt_oss",
        lambda f: _config(f, rope_parameters={"rope_type": "yarn", "factor": -2.0, "rope_theta": 1e4}),
        "factor",
    ),
    "gpt-oss-yarn-truncate-string": (
        "gpt_oss",
        lambda f: _config(f, rope_parameters={"rope_type": "yarn", "factor": 4.0, "truncate": "no"}),
        "truncate",
    ),
    "gpt-oss-sliding-window-negative": ("gpt_oss", lambda f: _config(f, sliding_window=-4), "sliding_window"),
}


@pytest.fixture(params=list(CASES))
def broken(request, tmp_path):
    family, breaks, field = CASES[request.param]
    write_family(tmp_path, family)
    breaks(tmp_path)
    return tmp_path, field


def test_the_loader_refuses_in_one_line_naming_the_field(broken):
    folder, field = broken
    refuses(lambda: load_hf(folder), field)


def test_the_cli_exits_2_naming_the_field(broken, capsys):
    folder, field = broken
    with pytest.raises(SystemExit) as e:
        main(["spectrum", str(folder)])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert field in err and len(err.strip().splitlines()) == 1, err


def test_a_missing_tensor_is_named_as_the_file_spells_it(tmp_path):
    write_family(tmp_path, "qwen3")
    _weights(tmp_path, lambda t: t.pop(Q_NORM))
    msg = refuses(lambda: load_hf(tmp_path), Q_NORM)
    assert f"'{Q_NORM}'" in msg  # not the prefix twice (model.model.layers...)
