"""sources.resolve: every kind of source (zoo name, folder, lone .safetensors file, Hugging Face
GPT-2 folder, run:<id>, upload: <name>) becomes a LoadedModel; a source that names nothing is one
sentence; weights_path is the file whose modification time keys the dashboard's cache."""

import json
import time

import pytest
import torch

from attn_core import checkpoint, sources, zoo
from attn_core.checkpoint import CheckpointError, LoadedModel
from attn_core.runs import RunStore
from attn_core.tasks import get_task
from tests.conftest import make_tiny_model

TASK = get_task("reverse")


def same_weights(a, b) -> bool:
    return all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_zoo_name():
    name = zoo.list_models()[0]["name"]
    loaded = sources.resolve(name)
    assert isinstance(loaded, LoadedModel) and loaded.name == name and loaded.task is not None
    assert loaded.path == zoo.ZOO_DIR / name
    assert sources.weights_path(name) == zoo.ZOO_DIR / name / checkpoint.WEIGHTS


def test_folder_and_lone_safetensors_file(tmp_path):
    model = make_tiny_model()
    folder = checkpoint.save(model, tmp_path / "mine", {"task": "reverse"})
    for source in (folder, str(folder), folder / checkpoint.WEIGHTS):
        loaded = sources.resolve(source)
        assert loaded.config == model.cfg and loaded.task is TASK and same_weights(model, loaded.model)
    assert sources.resolve(folder).name == "mine"
    assert sources.weights_path(folder) == folder / checkpoint.WEIGHTS
    assert sources.weights_path(folder / checkpoint.WEIGHTS) == folder / checkpoint.WEIGHTS


def test_gpt2_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    # not conftest's write_tiny_gpt2: a smaller GPT-2 (asserted below) with transformers' own init
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=20, n_positions=8, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2", safe_serialization=True)
    loaded = sources.resolve(tmp_path / "gpt2")
    assert loaded.name == "gpt2" and loaded.task is None and loaded.card.details["architecture"] == "gpt2"
    assert (loaded.config.n_layers, loaded.config.n_heads, loaded.config.d_model) == (1, 2, 16)
    assert sources.weights_path(tmp_path / "gpt2") == tmp_path / "gpt2" / checkpoint.WEIGHTS


def test_run(tmp_path):
    store = RunStore(tmp_path / "store")
    run_id = store.create("reverse-1l", "reverse", {})
    model = make_tiny_model(seed=1)
    store.finish(run_id, "completed", model, {"task": "reverse", "parent": "reverse-1l"})
    loaded = sources.resolve(f"run:{run_id}", store=store)
    assert loaded.name == f"run:{run_id}" and loaded.card.status == "completed" and same_weights(model, loaded.model)
    assert sources.weights_path(f"run:{run_id}", store=store) == store.path(run_id) / checkpoint.WEIGHTS
    # without a store: the one in ATTN_LAB_RUNS (tests point it at their tmp_path)
    default = RunStore()
    other = default.create("reverse-1l", "reverse", {})
    default.finish(other, "stopped", model, {"task": "reverse"})
    assert sources.resolve(sources.RUN_PREFIX + other).card.status == "stopped"


def test_upload(tmp_path):
    store = RunStore(tmp_path / "store")
    model = make_tiny_model(seed=2)
    checkpoint.save(model, sources.upload_dir(store.root) / "my-model-ab12", {"task": "reverse"})
    source = sources.UPLOAD_PREFIX + "my-model-ab12"
    loaded = sources.resolve(source, store=store)
    assert loaded.name == source and loaded.task is TASK and same_weights(model, loaded.model)
    assert sources.weights_path(source, store=store) == store.root / "uploads" / "my-model-ab12" / checkpoint.WEIGHTS
    checkpoint.save(model, sources.upload_dir() / "elsewhere", {})  # the default data directory
    assert sources.resolve(sources.UPLOAD_PREFIX + "elsewhere").name == "upload: elsewhere"


@pytest.mark.parametrize(
    "source, message",
    [
        ("no-such-model", "no model named 'no-such-model'; known models: "),
        ("run:nope", "no run 'nope'"),
        ("run:../etc", "is not a run id"),
        ("upload: nope", "no upload named 'nope'; known uploads: none"),
        ("upload: ../../etc", "is not an upload name"),
    ],
)
def test_unknown_sources_are_one_sentence(source, message):
    with pytest.raises(CheckpointError) as info:
        sources.resolve(source)
    assert message in str(info.value) and "\n" not in str(info.value)
    if source == "no-such-model":
        assert all(m["name"] in str(info.value) for m in zoo.list_models())


def test_run_without_weights_says_why(tmp_path):
    store = RunStore(tmp_path)
    run_id = store.create("p", "reverse", {})
    store.finish(run_id, "failed", None, {}, message="failed at step 1: boom")
    with pytest.raises(CheckpointError, match="has no saved weights: failed at step 1: boom"):
        sources.resolve(f"run:{run_id}", store=store)


def test_weights_path_mtime_changes_when_the_model_is_saved_again(tmp_path):
    folder = checkpoint.save(make_tiny_model(seed=0), tmp_path / "m", {"task": "reverse"})
    path = sources.weights_path(folder)
    before, key = path.stat().st_mtime_ns, sources.resolve(folder).key
    time.sleep(0.05)  # past the file system's timestamp granularity
    checkpoint.save(make_tiny_model(seed=5), folder, {"task": "reverse"}, overwrite=True)
    assert sources.weights_path(folder) == path and path.stat().st_mtime_ns != before
    assert sources.resolve(folder).key != key  # the key names these exact weights
    assert json.loads((folder / checkpoint.CARD).read_text())["task"] == "reverse"
