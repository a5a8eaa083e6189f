"""Hostile input to the library (issue 12): files a card names outside its folder, FIFOs and
devices where files should be, JSON nested 100,000 deep, cards of the wrong types, broken model
folders in ATTN_LAB_MODELS, sizes and seeds beyond the limits, weights that overflow. Every
fixture is built here; every refusal is one sentence that says what is wrong (and the limit)."""

import json
import os
import re
import warnings
from pathlib import Path

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_core import bilinear, checkpoint, limits, zoo
from attn_core.card import Card
from attn_core.checkpoint import CheckpointError
from attn_core.sources import resolve
from attn_core.training.config import JobConfig, TrainConfig
from attn_core.validate import MAX_SEED, check_seed, short_list

FIFO_TIMEOUT = 60  # seconds; opening a FIFO for reading would block for ever


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and 0 < len(text) < 600, text
    return text


@pytest.fixture
def folder(tmp_path) -> Path:
    """A model folder with a file inside it, and a secret file beside the folder."""
    f = tmp_path / "models" / "m"
    f.mkdir(parents=True)
    (f / "vocab.json").write_text(json.dumps({"a": 0, "b": 1}))
    (tmp_path / "secret.json").write_text(json.dumps({"SECRET": 0}))
    return f


# --- class 1 and 9: files a user names -----------------------------------------------------------


def test_a_file_inside_the_model_folder_is_read(folder):
    assert json.loads(checkpoint.read_model_file(folder, "vocab.json", 1000)) == {"a": 0, "b": 1}
    (folder / "sub").mkdir()
    (folder / "sub" / "v.json").write_text("[]")
    assert checkpoint.read_model_file(folder, "sub/v.json", 10) == b"[]"
    os.symlink(folder / "vocab.json", folder / "link.json")  # a link that stays inside is fine
    assert checkpoint.read_model_file(folder, "link.json", 1000) == (folder / "vocab.json").read_bytes()


@pytest.mark.parametrize(
    "name",
    ["../../secret.json", "{secret}", "sub/../../../secret.json", "/etc/passwd", "/dev/zero", "..", ".", ""],
)
def test_nothing_outside_the_model_folder_is_read(folder, name):
    name = name.format(secret=folder.parents[1] / "secret.json")
    with pytest.raises(CheckpointError) as e:
        checkpoint.read_model_file(folder, name, 10**6)
    assert "SECRET" not in one_line(e)


def test_a_link_leading_out_of_the_folder_is_refused(folder):
    os.symlink(folder.parents[1] / "secret.json", folder / "out.json")
    with pytest.raises(CheckpointError, match="leads outside the model folder"):
        checkpoint.read_model_file(folder, "out.json", 10**6)


@pytest.mark.timeout(FIFO_TIMEOUT)
def test_a_fifo_a_device_or_a_folder_is_never_read(folder):
    os.mkfifo(folder / "fifo.json")
    (folder / "dir.json").mkdir()
    for name in ("fifo.json", "dir.json"):
        with pytest.raises(CheckpointError, match="regular file|a folder") as e:
            checkpoint.read_model_file(folder, name, 10**6)
        one_line(e)
    for path in (folder / "fifo.json", Path("/dev/zero"), Path("/dev/null")):
        with pytest.raises(CheckpointError, match="not a regular file"):
            checkpoint.read_bytes(path, 10**6)
        with pytest.raises(CheckpointError, match="not a regular file"):
            checkpoint.load_path(path)  # a FIFO or /dev/zero given as the weights


def test_a_file_over_its_limit_is_refused_before_it_is_read(folder):
    (folder / "big.json").write_bytes(b" " * 5000)
    with pytest.raises(limits.LimitError, match="the limit is 4.88 KiB"):
        limits.read_file(folder / "big.json", 5000 - 1)
    assert limits.read_file(folder / "big.json", 5000) == b" " * 5000


# --- class 1: the card's vocab_file ----------------------------------------------------------------


def _vocab_model(save_model, vocab_file, content=None, name="v"):
    folder = save_model(name, card={})
    if content is not None:
        (folder / "vocab.json").write_text(content if isinstance(content, str) else json.dumps(content))
    card = json.loads((folder / "card.json").read_text())
    (folder / "card.json").write_text(json.dumps({**card, "vocab_file": vocab_file}))
    return folder


def test_a_vocabulary_inside_the_folder_names_the_tokens(save_model):
    folder = _vocab_model(save_model, "vocab.json", {"zero": 0, "two": 2, "far": 10**6})
    names = bilinear.token_names(resolve(folder))
    assert names[:3] == ["zero", "1", "two"] and len(names) == resolve(folder).config.d_vocab
    folder = _vocab_model(save_model, "vocab.json", ["x", "y"], name="w")  # a list of tokens works too
    assert bilinear.token_names(resolve(folder))[:3] == ["x", "y", "2"]


@pytest.mark.parametrize(
    "vocab_file, content, message",
    [
        ("{tmp}/secret.json", None, "leads outside the model folder"),
        ("../../secret.json", None, "leads outside the model folder"),
        ("vocab.json", '{"a": "zero"}', "not a token string with an integer id"),
        ("vocab.json", '"a string"', "JSON object of token -> id or a list"),
        ("vocab.json", "[" * 100_000 + "]" * 100_000, "nested more than"),
        ("vocab.json", "{not json", "not valid JSON"),
        ("missing.json", None, "does not exist"),
    ],
)
def test_a_bad_vocab_file_refuses_the_model_and_reads_nothing_outside(
    save_model, tmp_path, vocab_file, content, message
):
    (tmp_path / "secret.json").write_text(json.dumps({"SECRET": 0}))
    folder = _vocab_model(save_model, vocab_file.format(tmp=tmp_path), content)
    with pytest.raises(CheckpointError, match=message) as e:
        resolve(folder)
    assert "SECRET" not in one_line(e)


def test_the_vocabulary_count_is_bounded(save_model, monkeypatch):
    folder = _vocab_model(save_model, "vocab.json", [f"t{i}" for i in range(50)])
    monkeypatch.setattr(limits, "MAX_TOKENS_FILE", 49)
    with pytest.raises(CheckpointError, match="at most 49"):
        resolve(folder)


# --- class 6: JSON size and depth, the card schema -------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ("[" * 100_000 + "]" * 100_000, "nested more than 64 levels"),
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested more than 64 levels"),
        ("[" * 65 + "]" * 65, "nested more than 64 levels"),
        (" " * (checkpoint.MAX_JSON_BYTES + 1), "the limit is"),
        ('{"n": 1' + "0" * 5000 + "}", "not valid JSON"),  # an integer of 5,000 digits
        (b"\xff\xfe{", "not valid JSON"),
    ],
)
def test_json_is_bounded_in_size_and_depth(tmp_path, text, message):
    with pytest.raises(CheckpointError, match=message) as e:
        checkpoint.parse_json(text, "card.json")
    one_line(e)
    path = tmp_path / "card.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(CheckpointError, match=message):
        checkpoint.read_json(path)
    assert checkpoint.parse_json("[" * 64 + "]" * 64, "x") is not None  # 64 levels are fine


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"task": ["reverse"]}, "'task' must be a task name"),
        ({"metrics": 3}, "'metrics' must be an object of measurements"),
        ({"metrics": {"accuracy": "high"}}, "'metrics.accuracy' must be a number, not a string"),
        ({"steps": True}, "'steps' must be an integer, not a boolean"),
        ({"seed": 1.5}, "'seed' must be an integer"),
        ({"parent": {"x": 1}}, "'parent' must be a model name"),
        ({"vocab_file": 7}, "'vocab_file' must be a file name"),
        ({"before": [1, 2]}, "'before' must be an object of measurements"),
        ({"after": {"loss": [1]}}, "'after.loss' must be a number"),
        ({"per_head": "x"}, "'per_head' must be an object"),
        ({"regularizers": 5}, "'regularizers' must be a list"),
        ([1, 2], "must be a JSON object, not list"),
        ("card", "must be a JSON object, not str"),
    ],
)
def test_a_card_of_the_wrong_types_is_one_sentence(raw, message):
    with pytest.raises(ValueError, match=message) as e:
        Card.from_dict(raw)
    one_line(e)


def test_a_card_keeps_nan_measurements_and_unknown_sections():
    card = Card.from_dict({"metrics": {"loss": float("nan"), "accuracy": None}, "custom": [1]})
    assert card.accuracy is None and card.details == {"custom": [1]}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
CARD_KEYS = st.sampled_from(["task", "metrics", "seed", "parent", "before", "after", "train", "name", "x"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(CARD_KEYS, JSON, max_size=6) | JSON)
def test_any_json_is_a_card_or_one_clear_sentence(raw):
    try:
        card = Card.from_dict(raw)
    except ValueError as e:
        assert "\n" not in str(e) and str(e)
        return
    # what pages and commands do with a card works on every card that was accepted
    assert card.accuracy is None or isinstance(card.accuracy, float)
    assert isinstance(card.task, (str, type(None))) and isinstance(card.parent, (str, type(None)))
    json.dumps(card.to_dict(), default=str)
    assert Card.from_dict(card.to_dict()).to_dict() == card.to_dict()  # what is written reads back


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(alphabet='[]{}",:0a1 ', max_size=400))
def test_any_text_is_json_or_one_clear_sentence(text):
    try:
        checkpoint.parse_json(text, "x.json")
    except CheckpointError as e:
        assert "\n" not in str(e)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["n_layers", "d_model", "d_vocab", "qk", "d_qk", "zz"]), JSON, max_size=4))
def test_any_config_json_is_a_config_or_one_clear_sentence(raw):
    try:
        checkpoint.read_config_bytes(json.dumps(raw).encode())
    except CheckpointError as e:
        assert "\n" not in str(e)


# --- class 5: bad folders in ATTN_LAB_MODELS -------------------------------------------------------


def test_bad_model_folders_are_skipped_with_a_warning_that_names_them(save_model, tmp_path, monkeypatch):
    good = save_model("good")
    root = good.parent
    broken = {
        "bad-json": ("config.json", "{bad"),
        "deep-config": ("config.json", '{"a":' * 100_000 + "1" + "}" * 100_000),
        "task-list": ("card.json", json.dumps({"task": ["reverse"]})),
        "metrics-number": ("card.json", json.dumps({"task": "reverse", "metrics": 3})),
        "wrong-type": ("config.json", json.dumps({"n_layers": "two"})),
        "card-array": ("card.json", "[]"),
    }
    for name, (file, text) in broken.items():
        folder = save_model(name)
        (folder / file).write_text(text)
    (save_model("dir-card") / "card.json").unlink()
    (root / "dir-card" / "card.json").mkdir()  # a folder where a file is expected: an empty card
    (root / "not-a-model.txt").write_text("hello")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")  # a file where a folder of models is expected
    monkeypatch.setenv("ATTN_LAB_MODELS", os.pathsep.join([str(root), str(a_file), str(tmp_path / "missing")]))

    with pytest.warns(zoo.ModelFolderWarning) as caught:
        names = {m["name"] for m in zoo.list_models()}
    assert {"good", "dir-card"} <= names and not names & set(broken)
    said = [str(w.message) for w in caught]
    for name in (*broken, "a-file"):
        assert sum(name in text for text in said) == 1, (name, said)
    assert all("\n" not in text for text in said)

    problems: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with a list, nothing is warned: the caller shows them
        assert {m["name"] for m in zoo.list_models(problems)} == names
    assert len(problems) == len(broken) + 1
    with pytest.raises(CheckpointError, match="no model named 'nope'; known models: .*good"):
        resolve("nope")  # the list of known models survives the broken folders too


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: no permission error to provoke")
def test_an_unreadable_model_folder_is_skipped(save_model):
    folder = save_model("locked")
    (folder / "config.json").chmod(0)
    try:
        with pytest.warns(zoo.ModelFolderWarning, match="locked"):
            assert "locked" not in {m["name"] for m in zoo.list_models()}
    finally:
        (folder / "config.json").chmod(0o644)


# --- class 8, 9, 11: settings, sizes and seeds ----------------------------------------------------------


@pytest.mark.parametrize(
    "config, settings_, message",
    [
        (JobConfig, dict(batch_size=0), "batch_size must be 1..65536"),
        (JobConfig, dict(batch_size=True), "batch_size must be 1..65536"),
        (JobConfig, dict(batch_size=10**6), "batch_size must be 1..65536"),
        (JobConfig, dict(steps=10**12), "steps must be at most 10,000,000"),
        (JobConfig, dict(seed=2**70), "seed must be an integer in 0..2^63-1"),
        (JobConfig, dict(seed=-1), "seed must be an integer in 0..2^63-1"),
        (JobConfig, dict(warmup_steps=-1), "warmup_steps must be 0.."),
        (JobConfig, dict(eval_samples=10**9), "eval_samples must be an integer in 1..1,000,000"),
        (JobConfig, dict(measure_samples=10**9), "measure_samples must be an integer in 1..1,000,000"),
        (TrainConfig, dict(steps=10**12), "steps must be at most 10,000,000"),
        (TrainConfig, dict(batch_size=0), "batch_size must be 1..65536"),
        (TrainConfig, dict(seed=2**64), "seed must be an integer in 0..2^63-1"),
        (TrainConfig, dict(eval_samples=10**9), "eval_samples must be 1..1,000,000"),
    ],
)
def test_every_config_field_is_bounded(config, settings_, message):
    kwargs = dict(source="reverse-1l") if config is JobConfig else {}
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        config(**kwargs, **settings_)
    one_line(e)


def test_a_given_batch_size_is_the_one_used():
    assert JobConfig(source="x", batch_size=5).train_config({"batch_size": 64}).batch_size == 5
    assert JobConfig(source="x").train_config({"batch_size": 32}).batch_size == 32
    assert "--batch-size 5" in JobConfig(source="x", batch_size=5).command()


def test_seeds_and_counts_state_their_limits():
    assert check_seed("--seed", MAX_SEED) == MAX_SEED
    for bad in (2**70, -1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="must be an integer in 0..9223372036854775807"):
            check_seed("--seed", bad)
    with pytest.raises(limits.LimitError, match="--features must be at most 65,536"):
        limits.check_count("--features", 10**7, hi=limits.MAX_FEATURES)
    with pytest.raises(limits.LimitError, match=r"--threads must be at most \d+ \(the CPUs"):
        limits.check_cpu_threads("--threads", 10**6)
    with pytest.raises(limits.LimitError, match="needs about .* the limit is"):
        limits.check_memory("a view of 262144 x 262144 scores", 262_144**2 * 4)
    assert 0 < limits.memory_limit() <= limits.available_memory()


def test_a_forward_pass_beyond_the_memory_limit_is_refused():
    cfg = resolve("reverse-1l").config
    assert limits.check_forward("--samples", 512, cfg) == 512
    with pytest.raises(limits.LimitError, match="--samples 900000 .* needs about .*GiB"):
        limits.check_forward("--samples", 900_000, cfg.__class__(**{**cfg.to_dict(), "d_vocab": 50_000}))


def test_a_vocabulary_view_larger_than_memory_is_refused(monkeypatch):
    loaded = resolve("reverse-1l")
    assert bilinear.vocabulary_view(loaded, 0, [0], tokens=[1, 2, 3]).scores.shape[-1] == 3
    monkeypatch.setattr(limits, "available_memory", lambda: 2 * 2 * 3 * 3 * 4 * 2 - 2)  # just under 3 x 3
    with pytest.raises(limits.LimitError, match="a view of 3 x 3 scores for 2 heads needs about"):
        bilinear.vocabulary_view(loaded, 0, [0], tokens=[1, 2, 3])


def test_a_long_list_is_summarised():
    assert short_list(["a", "b"]) == "'a', 'b'"
    assert short_list([f"w{i}" for i in range(43_000)]) == "'w0', 'w1', 'w2', 'w3', 'w4' and 42995 more"


def test_43000_unknown_tokens_give_a_short_message(save_model):
    words = " ".join(f"w{i}" for i in range(43_000))
    for loaded in (resolve("reverse-1l"), resolve(save_model("no-task", card={}))):
        with pytest.raises(ValueError, match="43000 tokens exceed the model context") as e:
            bilinear.input_ids(loaded, words)
        assert len(one_line(e)) < 200
    with pytest.raises(ValueError, match=r"3 unknown tokens \('zz', 'yy', 'xx'\)"):
        bilinear.input_ids(resolve(save_model("no-task-2", card={})), "zz 1 yy xx")


def test_an_empty_source_is_an_error_not_the_current_folder():
    for source in ("", "   ", "\x00"):
        with pytest.raises(CheckpointError, match="no model given"):
            resolve(source)


@pytest.mark.parametrize("value", [1e30, -1e7, float("nan"), float("inf")])
def test_weights_that_overflow_are_refused_at_load(save_model, value):
    folder = save_model("big")
    tensors = safetensors.torch.load((folder / "model.safetensors").read_bytes())
    tensors["embed.W_E"][0, 0] = value
    (folder / "model.safetensors").write_bytes(safetensors.torch.save(tensors))
    with pytest.raises(CheckpointError, match=r"embed.W_E (holds values up to|contains NaN or Inf)") as e:
        resolve(folder)
    one_line(e)


def test_large_but_allowed_weights_still_load(save_model):
    folder = save_model("ok")
    tensors = safetensors.torch.load((folder / "model.safetensors").read_bytes())
    tensors["embed.W_E"][0, 0] = checkpoint.MAX_ABS_WEIGHT
    (folder / "model.safetensors").write_bytes(safetensors.torch.save(tensors))
    assert resolve(folder).model.embed.W_E[0, 0] == torch.tensor(checkpoint.MAX_ABS_WEIGHT)
