"""A family's hostile config or weights (a norm weight of the wrong shape or missing, a cap of 0,
negative or NaN, layer types that do not match the layer count, a head_dim that disagrees where
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
