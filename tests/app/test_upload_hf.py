"""The sidebar's "Upload a model" takes what transformers' save_pretrained writes (config.json
with ``architectures`` and the rest, generation_config.json, model.safetensors or its shards,
tokenizer.json, tokenizer_config.json, special_tokens_map.json): the folder is kept as it is and
read by the one Hugging Face folder reader (``sources.resolve``) with its checks, the same
model as the folder on disk; what a folder holds besides (a README, a pickled
training_args.bin, a subfolder's files) is left out and named; a bad one is refused in one line
and leaves nothing behind. Folders written by transformers at random init."""

import json
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

import ui
from attn_core import bilinear, checkpoint, sources
from attn_core.sources import resolve
from tests.conftest import write_tiny_gpt2, write_tiny_hf

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
transformers = pytest.importorskip("transformers")


def save_tokenizer(folder: Path) -> None:
    """A word-level tokenizer saved by transformers (tokenizer.json, tokenizer_config.json), with
    the special_tokens_map.json older transformers releases write too."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(99)} | {"[UNK]": 99}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    (folder / "special_tokens_map.json").write_text(json.dumps({"unk_token": "[UNK]"}))


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "tiny-llama"
    write_tiny_hf(folder, "llama", num_key_value_heads=2)
    save_tokenizer(folder)
    return folder


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def same_model(a, b) -> bool:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return a.config == b.config and sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_llama_folder_as_save_pretrained_wrote_it(llama, tmp_path):
    files = folder_bytes(llama)
    assert {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= set(
        files
    )
    assert "architectures" in json.loads(files["config.json"])  # what our own config reader refused
    files |= {"README.md": b"# tiny", "training_args.bin": b"\x80\x04\x95 pickled"}
    label = ui.save_upload(files)
    assert label.startswith(sources.UPLOAD_PREFIX + "llama-")
    kept = sources.upload_dir() / label.removeprefix(sources.UPLOAD_PREFIX)
    assert sorted(p.name for p in kept.iterdir()) == sorted(set(files) - {"README.md", "training_args.bin"})
    loaded = resolve(label)
    assert same_model(loaded, resolve(str(llama)))  # the same reader: the same model as the folder on disk
    assert bilinear.tokenizer(loaded) is not None and bilinear.input_ids(loaded, "w3 w5") == [3, 5]
    assert ui.save_upload(files) == label  # the same files twice: one folder
    other = dict(files, **{"generation_config.json": b'{"max_length": 7}'})
    assert ui.save_upload(other) != label  # other bytes: another folder, nothing overwritten
    assert not [p for p in sources.upload_dir().iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_a_gpt2_folder_and_a_sharded_one(tmp_path):
    write_tiny_gpt2(tmp_path / "gpt2")
    label = ui.save_upload(folder_bytes(tmp_path / "gpt2"))
    assert label.startswith(sources.UPLOAD_PREFIX + "gpt2-")
    assert same_model(resolve(label), resolve(str(tmp_path / "gpt2")))
    assert bilinear.token_names(resolve(label))[:2] == ["tok0", "tok1"]  # its vocab.json came along

    write_tiny_hf(tmp_path / "sharded", "qwen2", max_shard_size="20KB", num_key_value_heads=2)
    files = folder_bytes(tmp_path / "sharded")
    assert "model.safetensors.index.json" in files and "model.safetensors" not in files
    label = ui.save_upload(files)
    assert sources.weights_path(label).name == "model.safetensors.index.json"
    assert same_model(resolve(label), resolve(str(tmp_path / "sharded")))


def test_bad_hugging_face_uploads_are_refused_in_one_line_and_leave_nothing(llama, tmp_path):
    files = folder_bytes(llama)
    no_weights = {k: v for k, v in files.items() if k != "model.safetensors"} | {"pytorch_model.bin": b"\x80\x04"}
    with pytest.raises(checkpoint.CheckpointError, match="no model.safetensors.*pytorch_model.bin is a pickle"):
        ui.save_upload(no_weights)
    config = json.loads(files["config.json"])
    wrong = dict(files, **{"config.json": json.dumps({**config, "hidden_size": 64}).encode()})
    with pytest.raises(checkpoint.CheckpointError, match="shape"):
        ui.save_upload(wrong)
    rope = dict(files, **{"config.json": json.dumps({**config, "rope_theta": -1.0, "rope_parameters": None}).encode()})
    with pytest.raises((checkpoint.CheckpointError, ValueError)):
        ui.save_upload(rope)
    uploads = sources.upload_dir()
    assert not uploads.exists() or not list(uploads.iterdir())  # nothing kept, no temporary folder


def test_the_sidebar_takes_a_whole_hugging_face_folder(llama):
    at = AppTest.from_file(APP, default_timeout=90).run()
    files = [(f"tiny-llama/{n}", b, "application/octet-stream") for n, b in folder_bytes(llama).items()]
    files += [("tiny-llama/README.md", b"# tiny", "text/markdown")]
    files += [("tiny-llama/checkpoint-5/config.json", b"{}", "application/json")]  # a Trainer's subfolder
    at.sidebar.get("file_uploader")[0].set_value(files).run()
    assert not at.exception and not at.sidebar.error, [e.value for e in at.sidebar.error]
    choice = at.sidebar.selectbox(key=ui.MODEL_KEY)
    assert choice.value.startswith(sources.UPLOAD_PREFIX + "llama-") and choice.value in choice.options
    message = at.sidebar.success[0].value
    assert "Loaded and selected" in message and "README.md" in message and "checkpoint-5/config.json" in message
    assert "llama (imported, no task)" in at.sidebar.caption[0].value
