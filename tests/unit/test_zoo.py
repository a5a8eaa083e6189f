import json
import pickle
import shutil

import pytest
import torch
from safetensors.torch import save_file

from attn_core import zoo
from attn_core.model import ModelConfig
from attn_core.train import evaluate, init_model

SHIPPED = [m["name"] for m in zoo.list_models()]


def tiny():
    return init_model(ModelConfig(n_layers=1, n_heads=2, d_model=16, d_head=8, d_mlp=8, n_ctx=8, d_vocab=11,
                                  attn_bias=True), seed=3)


def test_zoo_has_the_promised_models():
    assert len(SHIPPED) >= 6
    infos = zoo.list_models()
    assert {m["n_layers"] for m in infos} >= {1, 2}
    assert {m["qk"] for m in infos} == {"factored", "merged"}
    assert any(m["d_mlp"] == 0 for m in infos) and any(m["d_mlp"] > 0 for m in infos)
    total = sum(f.stat().st_size for f in zoo.ZOO_DIR.rglob("*") if f.is_file())
    assert total <= 15 * 2**20
    for m in infos:
        assert (zoo.ZOO_DIR / m["name"] / zoo.WEIGHTS).stat().st_size <= 2 * 2**20


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_meets_its_card_on_fresh_samples(name):
    loaded = zoo.load(name)
    card = loaded.card.to_dict()
    for key in ("task", "metrics", "seed", "steps", "wall_time_s", "command"):
        assert key in card, key
    assert card["wall_time_s"] <= 180
    res = evaluate(loaded.model, loaded.task, samples=512, seed=424242)
    assert res["accuracy"] >= loaded.task.accuracy_bar
    assert res["accuracy"] >= card["metrics"]["accuracy"] - 0.03


def test_save_load_round_trip_is_bit_exact(tmp_path):
    m = tiny()
    card = {"task": "copy", "note": "round trip"}
    zoo.save(m, tmp_path / "m", card)
    back = zoo.load(tmp_path / "m")
    assert back.card.to_dict() == card and back.config == m.cfg
    for (k, v), w in zip(m.state_dict().items(), back.model.state_dict().values()):
        assert torch.equal(v, w), k
    lone = zoo.load(tmp_path / "m" / zoo.WEIGHTS)  # config travels in the safetensors metadata
    assert lone.config == m.cfg


def test_save_refuses_to_overwrite(tmp_path):
    zoo.save(tiny(), tmp_path / "m", {"v": 1})
    with pytest.raises(zoo.CheckpointError, match="already exists"):
        zoo.save(tiny(), tmp_path / "m", {"v": 2})
    assert json.loads((tmp_path / "m" / zoo.CARD).read_text()) == {"v": 1}


def _folder(tmp_path, tensors=None, config=None, raw=None):
    d = tmp_path / "bad"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    m = tiny()
    (d / zoo.CONFIG).write_text(json.dumps(config if config is not None else m.cfg.to_dict()))
    if raw is not None:
        (d / zoo.WEIGHTS).write_bytes(raw)
    else:
        save_file(tensors if tensors is not None else {k: v.contiguous() for k, v in m.state_dict().items()},
                  str(d / zoo.WEIGHTS))
    return d


@pytest.mark.parametrize("case", ["shape", "missing", "nan", "truncated", "pickle", "torch_save", "absurd",
                                  "unknown_key", "not_json"])
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
        data = (d / zoo.WEIGHTS).read_bytes()
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
        (folder / zoo.CONFIG).write_text("{not json")
        expect = "not valid JSON"
    with pytest.raises(zoo.CheckpointError, match=expect) as info:
        zoo.load(folder)
    assert "\n" not in str(info.value)


def test_unknown_name_lists_known_models():
    with pytest.raises(zoo.CheckpointError, match="known models"):
        zoo.load("no-such-model")


def test_user_model_dirs_from_env(tmp_path, monkeypatch):
    zoo.save(tiny(), tmp_path / "mine" / "my-model", {"task": "copy"})
    monkeypatch.setenv(zoo.ENV_DIRS, str(tmp_path / "mine"))
    assert "my-model" in [m["name"] for m in zoo.list_models()]
    assert zoo.load("my-model").card.task == "copy"


def test_unfinished_save_is_not_listed(tmp_path, monkeypatch):
    zoo.save(tiny(), tmp_path / "mine" / "done", {"task": "copy"})
    zoo.save(tiny(), tmp_path / "mine" / ".half.abc123", {"task": "copy"})  # what a killed save leaves
    monkeypatch.setenv(zoo.ENV_DIRS, str(tmp_path / "mine"))
    names = [m["name"] for m in zoo.list_models()]
    assert "done" in names and ".half.abc123" not in names
    assert oct((tmp_path / "mine" / "done").stat().st_mode & 0o777) == "0o755"


def test_safetensors_whose_header_length_starts_with_0x80_is_not_taken_for_a_pickle(tmp_path):
    """The header length's low byte is arbitrary; 128 (0x80) once made a saved run unloadable."""
    m = tiny()
    for pad in range(300):
        data = zoo.to_safetensors_bytes(m, {"task": "copy", "pad": "x" * pad})
        if data[0] == 0x80:
            break
    assert data[0] == 0x80
    back = zoo.load_bytes(data)
    assert back.card.task == "copy"
