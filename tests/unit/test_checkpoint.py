"""The checkpoint format (docs/checkpoints.md): a save/load round trip is bit exact, through a
folder, a lone .safetensors file and bytes; saves never overwrite; every bad checkpoint (a pickle
above all) is refused with its reason in one line."""

import json
import pickle
import shutil

import pytest
import torch
from safetensors.torch import save_file

from attn_core import checkpoint
from attn_core.checkpoint import CheckpointError
from tests.conftest import make_tiny_model


def tiny():
    return make_tiny_model(seed=3, d_mlp=8, n_ctx=8, d_vocab=11, attn_bias=True)


def test_save_load_round_trip_is_bit_exact(tmp_path):
    m = tiny()
    card = {"task": "copy", "note": "round trip"}
    checkpoint.save(m, tmp_path / "m", card)
    back = checkpoint.load_path(tmp_path / "m")
    assert back.card.to_dict() == card and back.config == m.cfg
    for (k, v), w in zip(m.state_dict().items(), back.model.state_dict().values()):
        assert torch.equal(v, w), k
    lone = checkpoint.load_path(tmp_path / "m" / checkpoint.WEIGHTS)  # config travels in the safetensors metadata
    assert lone.config == m.cfg


def test_save_refuses_to_overwrite(tmp_path):
    checkpoint.save(tiny(), tmp_path / "m", {"v": 1})
    with pytest.raises(CheckpointError, match="already exists"):
        checkpoint.save(tiny(), tmp_path / "m", {"v": 2})
    assert json.loads((tmp_path / "m" / checkpoint.CARD).read_text()) == {"v": 1}


def _folder(tmp_path, tensors=None, config=None, raw=None):
    d = tmp_path / "bad"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    m = tiny()
    (d / checkpoint.CONFIG).write_text(json.dumps(config if config is not None else m.cfg.to_dict()))
    if raw is not None:
        (d / checkpoint.WEIGHTS).write_bytes(raw)
    else:
        save_file(
            tensors if tensors is not None else {k: v.contiguous() for k, v in m.state_dict().items()},
            str(d / checkpoint.WEIGHTS),
        )
    return d


@pytest.mark.parametrize(
    "case", ["shape", "missing", "nan", "truncated", "pickle", "torch_save", "absurd", "unknown_key", "not_json"]
)
def test_each_bad_checkpoint_is_refused_with_its_reason(tmp_path, case):
    m = tiny()
    good = {k: v.contiguous() for k, v in m.state_dict().items()}
    cfg = m.cfg.to_dict()
    raw, tensors, config, expect = None, None, None, ""
    if case == "shape":
        tensors = {**good, "blocks.0.attn.W_Q": torch.zeros(2, 16, 5)}
        expect = "shape"
    elif case == "missing":
        tensors = {k: v for k, v in good.items() if k != "blocks.0.attn.W_V"}
        expect = "missing tensors"
    elif case == "nan":
        tensors = {**good, "embed.W_E": torch.full_like(good["embed.W_E"], float("nan"))}
        expect = "NaN"
    elif case == "truncated":
        d = _folder(tmp_path)
        data = (d / checkpoint.WEIGHTS).read_bytes()
        raw, expect = data[: len(data) // 2], "truncated"
    elif case == "pickle":
        raw, expect = pickle.dumps({"embed.W_E": [1.0]}), "pickle"
    elif case == "torch_save":
        torch.save(good, tmp_path / "t.pt")
        raw, expect = (tmp_path / "t.pt").read_bytes(), "pickle"
    elif case == "absurd":
        config, expect = {**cfg, "d_model": 10**9}, "d_model"
    elif case == "unknown_key":
        config, expect = {**cfg, "wat": 1}, "unknown keys"
    folder = _folder(tmp_path, tensors=tensors, config=config, raw=raw)
    if case == "not_json":
        (folder / checkpoint.CONFIG).write_text("{not json")
        expect = "not valid JSON"
    with pytest.raises(CheckpointError, match=expect) as info:
        checkpoint.load_path(folder)
    assert "\n" not in str(info.value)


def test_safetensors_whose_header_length_starts_with_0x80_is_not_taken_for_a_pickle(tmp_path):
    """The header length's low byte is arbitrary; 128 (0x80) once made a saved run unloadable."""
    m = tiny()
    for pad in range(300):
        data = checkpoint.to_safetensors_bytes(m, {"task": "copy", "pad": "x" * pad})
        if data[0] == 0x80:
            break
    assert data[0] == 0x80
    back = checkpoint.load_bytes(data)
    assert back.card.task == "copy"


def test_bytes_round_trip_and_pickle_refused():
    m = tiny()
    back = checkpoint.load_bytes(checkpoint.to_safetensors_bytes(m, {"task": "copy"}), name="up")
    assert back.config == m.cfg and back.card.task == "copy" and back.key.startswith("up:")
    for (k, v), w in zip(m.state_dict().items(), back.model.state_dict().values()):
        assert torch.equal(v, w), k
    with pytest.raises(CheckpointError, match="pickle"):
        checkpoint.load_bytes(pickle.dumps(m.state_dict()))


def test_save_overwrite_replaces_atomically(tmp_path):
    checkpoint.save(tiny(), tmp_path / "m", {"v": 1})
    checkpoint.save(tiny(), tmp_path / "m", {"v": 2}, overwrite=True)
    assert json.loads((tmp_path / "m" / checkpoint.CARD).read_text()) == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary or old folder left behind
