"""Hostile input to the dashboard (issues 24 and 25): the Home page lists a folder of broken models
from their configs and cards without loading any; an uploaded card.json of the wrong types is one
message; the Runs page with no run that has weights and no parent; a model whose context is far
beyond the memory limit on the Heatmaps page. No page ever shows a traceback."""

import json
import resource
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import ui
from attn_core import checkpoint, runs, zoo
from tests.conftest import make_tiny_model, write_tiny_hf

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
RUNS_PAGE = str(ROOT / "app_pages" / "4_Runs.py")
HEATMAPS = str(ROOT / "app_pages" / "1_Heatmaps.py")


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> Path:
    """A folder of models that cannot be loaded, each for another reason: weights whose header
    declares 3.2 GB (sparse files), a pickle as weights, a config of the wrong types, a rope
    factor of 1e-300, a tensor of the wrong shape; and one good model."""
    from tests.unit.test_hostile_models import _lying_header

    root = tmp_path_factory.mktemp("broken")
    template = root / ".template"
    write_tiny_hf(template, "mistral", num_key_value_heads=1, sliding_window=5)
    for i in range(4):
        shutil.copytree(template, root / f"lying-{i}")
        _lying_header(root / f"lying-{i}", "lm_head.weight", [50_000_000, 32])
    checkpoint.save(make_tiny_model(), root / "pickled", card={"task": "reverse", "description": "a pickle"})
    (root / "pickled" / "model.safetensors").write_bytes(b"\x80\x04\x95" + b"\x00" * 64)
    shutil.copytree(template, root / "bad-types")
    raw = json.loads((root / "bad-types" / "config.json").read_text())
    (root / "bad-types" / "config.json").write_text(json.dumps({**raw, "hidden_size": 32.7}))
    shutil.copytree(template, root / "tiny-rope")
    (root / "tiny-rope" / "config.json").write_text(
        json.dumps({**raw, "rope_parameters": {"rope_type": "linear", "factor": 1e-300, "rope_theta": 1e4}})
    )
    checkpoint.save(make_tiny_model(), root / "good", card={"task": "reverse", "description": "a good one"})
    return root


def test_home_lists_a_folder_of_broken_models_without_loading_them(broken, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_MODELS", str(broken))
    before = peak_rss()
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception and not at.error
    listed = at.dataframe[0].value["name"].tolist()
    assert {"lying-0", "lying-3", "pickled", "good"} <= set(listed)  # from their configs and cards
    assert not {"bad-types", "tiny-rope"} & set(listed)
    warned = " ".join(w.value for w in at.sidebar.warning)
    assert "bad-types" in warned and "size must be an integer, got 32.7" in warned and "tiny-rope" in warned
    assert any("a pickle" in c.value for c in at.caption)  # a card shown without its weights
    at.run()  # a second visit reads nothing again and stays quiet
    assert not at.exception and not at.error and not at.sidebar.warning
    assert peak_rss() - before < 2**30  # no 3.2 GB header was ever believed
    at.sidebar.selectbox(key=ui.MODEL_KEY).set_value("lying-2").run()  # picked: loaded, refused in one line
    assert not at.exception
    assert any("has shape \\[50000000, 32\\]; config.json needs \\[100, 32\\]" in e.value for e in at.error)


def test_a_broken_folder_is_read_again_only_when_its_files_change(broken, tmp_path, monkeypatch):
    folder = tmp_path / "m" / "flaky"
    shutil.copytree(broken / "bad-types", folder)
    monkeypatch.setenv("ATTN_LAB_MODELS", str(folder.parent))
    problems: list[str] = []
    zoo.list_models(problems)
    assert any("flaky" in p for p in problems)
    config = folder / "config.json"
    stat = config.stat()
    fixed = json.loads(config.read_text()) | {"hidden_size": 32}
    config.write_text(json.dumps(fixed).ljust(stat.st_size))  # same size and, below, the same mtime
    import os

    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    problems = []
    zoo.list_models(problems)
    assert any("flaky" in p for p in problems)  # remembered: the folder was not read again
    os.utime(config, None)  # a new mtime: read again, and now it lists
    problems = []
    assert "flaky" in [m["name"] for m in zoo.list_models(problems)] and not problems


def test_a_model_that_failed_to_load_is_refused_again_without_being_read(broken, tmp_path):
    """ui.load_model remembers a failure by the weights' mtime: the same file is refused again
    from memory (here its bytes were mended behind an unchanged mtime, and it still is), and a file
    written again (a new mtime) is read again."""
    import os

    folder = tmp_path / "pickled"
    shutil.copytree(broken / "pickled", folder)
    weights = folder / "model.safetensors"
    with pytest.raises(checkpoint.CheckpointError, match="pickle") as first:
        ui.load_model(str(folder))
    stat = weights.stat()
    weights.write_bytes((broken / "good" / "model.safetensors").read_bytes())  # mended, same mtime below
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(checkpoint.CheckpointError) as again:
        ui.load_model(str(folder))
    assert str(again.value) == str(first.value)  # remembered, not read
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # written again: read again
    assert ui.load_model(str(folder)).config.n_heads == make_tiny_model().cfg.n_heads


@pytest.mark.parametrize(
    "card, message",
    [
        ({"task": ["reverse"]}, "'task' must be a task name (a string), not a list"),
        ({"task": "reverse", "metrics": 5}, "'metrics' must be"),
    ],
)
def test_an_uploaded_card_of_the_wrong_types_is_one_message(card, message):
    folder = ROOT / "assets" / "models" / "reverse-1l"
    files = {f: (folder / f).read_bytes() for f in (checkpoint.WEIGHTS, checkpoint.CONFIG)}
    files[checkpoint.CARD] = json.dumps(card).encode()
    at = AppTest.from_file(APP, default_timeout=90).run()
    at.sidebar.get("file_uploader")[0].set_value([(n, b, "application/octet-stream") for n, b in files.items()])
    at.run()
    assert not at.exception
    errors = [e.value for e in at.sidebar.error]
    assert len(errors) == 1 and errors[0].startswith("Not loaded: card.json") and message in errors[0]


@pytest.mark.parametrize("url", [{}, {"model": "run:{id}", "layer": "0", "head": "1"}, {"model": "gone", "layer": "7"}])
def test_runs_page_without_weights_or_a_parent_says_so(tmp_path, monkeypatch, url):
    """Only failed runs (no weights) of a model folder that is gone, opened plainly or from a link
    naming one of them (or the gone folder) and a layer/head: no IndexError, one message."""
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    store = runs.RunStore()
    ids = [
        store.add_run(str(tmp_path / "gone"), "reverse", {"steps": 3, "regularizers": []}, "failed", f"broke {i}")
        for i in range(2)
    ]
    at = AppTest.from_file(RUNS_PAGE, default_timeout=90)
    for k, v in url.items():
        at.query_params[k] = v.format(id=ids[0])
    at.run()
    assert not at.exception and not at.error
    assert any("no heatmap to draw" in i.value for i in at.info)


def test_heatmaps_default_length_fits_the_limits_for_a_huge_context(save_model, monkeypatch):
    """A rotary model whose context is 2^20 tokens, on a machine whose memory limit is 256 MiB:
    the default input fits the memory limit (no "29.1 TiB" LimitError), the length's bound says
    the limit, and a URL's length=2^20 is one line."""
    from attn_core import limits

    monkeypatch.setattr(limits, "memory_limit", lambda: 256 * 2**20)  # the forward's memory grows linearly in T
    save_model("long", card={}, positional="rotary", n_ctx=2**20)
    at = AppTest.from_file(HEATMAPS, default_timeout=90)
    at.query_params["model"] = "long"
    at.run()
    assert not at.exception and not at.error
    length = at.number_input(key="random_length")
    assert 2 <= length.value <= 1024 and length.max < 2**20
    assert f"the memory limit allows {int(length.max)}" in length.help
    at = AppTest.from_file(HEATMAPS, default_timeout=90)
    at.query_params["model"] = "long"
    at.query_params["length"] = str(2**20)
    at.run()
    assert not at.exception and not at.error  # the URL's length is out of range: the default is used


@pytest.mark.parametrize("which", ["panics", "backtracks"])
def test_heatmaps_typed_text_through_a_hostile_tokenizer_is_one_message(tmp_path, monkeypatch, which):
    from tests.unit.test_hostile_models import PANIC_PATTERN, PANIC_TEXT, SLOW_PATTERN, SLOW_TEXT, _with_tokenizer

    pattern, text, message = {
        "panics": (PANIC_PATTERN, PANIC_TEXT, "tokenizing the text failed"),
        "backtracks": (SLOW_PATTERN, SLOW_TEXT, "took longer than 5 s, the limit"),
    }[which]
    src = tmp_path / "src"
    write_tiny_hf(src, "llama", num_key_value_heads=2)
    _with_tokenizer(src, tmp_path / "models" / "evil", pattern)
    monkeypatch.setenv("ATTN_LAB_MODELS", str(tmp_path / "models"))
    at = AppTest.from_file(HEATMAPS, default_timeout=90)
    at.query_params["model"] = "evil"
    at.query_params["input"] = "typed"
    at.run()
    assert not at.exception
    at.text_area(key="typed_text").set_value(text).run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and message in errors[0], errors
