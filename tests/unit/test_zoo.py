"""The zoo: the shipped models meet their cards, unknown names list the known ones, user folders
from ATTN_LAB_MODELS, unfinished saves stay hidden. (The checkpoint format: test_checkpoint.py.)"""

import pytest

from attn_core import checkpoint, zoo
from attn_core.checkpoint import CheckpointError
from attn_core.sources import resolve
from attn_core.training.trainer import evaluate
from tests.conftest import make_tiny_model

SHIPPED = [m["name"] for m in zoo.list_models()]
TEXT = ["text-8k"]  # trained on text, without a task of the registry: tests/unit/test_zoo_text.py


def tiny():
    return make_tiny_model(seed=3, d_mlp=8, n_ctx=8, d_vocab=11, attn_bias=True)


def test_zoo_has_the_promised_models():
    assert len(SHIPPED) >= 6
    infos = zoo.list_models()
    assert {m["n_layers"] for m in infos} >= {1, 2}
    assert {m["qk"] for m in infos} == {"factored", "merged"}
    assert any(m["d_mlp"] == 0 for m in infos) and any(m["d_mlp"] > 0 for m in infos)
    total = sum(f.stat().st_size for f in zoo.ZOO_DIR.rglob("*") if f.is_file())
    assert total <= 15 * 2**20
    for m in infos:
        assert (zoo.ZOO_DIR / m["name"] / checkpoint.WEIGHTS).stat().st_size <= 2 * 2**20


@pytest.mark.parametrize("name", [n for n in SHIPPED if n not in TEXT])
def test_shipped_model_meets_its_card_on_fresh_samples(name):
    loaded = resolve(name)
    card = loaded.card.to_dict()
    for key in ("task", "metrics", "seed", "steps", "wall_time_s", "command"):
        assert key in card, key
    assert card["wall_time_s"] <= 180
    res = evaluate(loaded.model, loaded.task, samples=512, seed=424242)
    assert res["accuracy"] >= loaded.task.accuracy_bar
    assert res["accuracy"] >= card["metrics"]["accuracy"] - 0.03


def test_unknown_name_lists_known_models():
    with pytest.raises(CheckpointError, match="known models"):
        resolve("no-such-model")


def test_user_model_dirs_from_env(tmp_path, monkeypatch):
    checkpoint.save(tiny(), tmp_path / "mine" / "my-model", {"task": "copy"})
    monkeypatch.setenv(zoo.ENV_DIRS, str(tmp_path / "mine"))
    assert "my-model" in [m["name"] for m in zoo.list_models()]
    assert resolve("my-model").card.task == "copy"


def test_a_model_folder_listed_itself_in_the_env_is_that_model(tmp_path, monkeypatch):
    """ATTN_LAB_MODELS naming a model folder (not the folder that holds it) lists and resolves
    that model by its name, never ignoring it in silence."""
    checkpoint.save(tiny(), tmp_path / "mine" / "my-model", {"task": "copy"})
    monkeypatch.setenv(zoo.ENV_DIRS, str(tmp_path / "mine" / "my-model"))
    problems: list[str] = []
    listed = [m for m in zoo.list_models(problems) if m["name"] == "my-model"]
    assert len(listed) == 1 and listed[0]["path"] == str(tmp_path / "mine" / "my-model") and problems == []
    assert resolve("my-model").card.task == "copy"


def test_unfinished_save_is_not_listed(tmp_path, monkeypatch):
    checkpoint.save(tiny(), tmp_path / "mine" / "done", {"task": "copy"})
    checkpoint.save(tiny(), tmp_path / "mine" / ".half.abc123", {"task": "copy"})  # what a killed save leaves
    monkeypatch.setenv(zoo.ENV_DIRS, str(tmp_path / "mine"))
    names = [m["name"] for m in zoo.list_models()]
    assert "done" in names and ".half.abc123" not in names
    assert oct((tmp_path / "mine" / "done").stat().st_mode & 0o777) == "0o755"
