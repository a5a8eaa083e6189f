"""Numbers in names, manifests and options of a checkpoint series (issue 37, item 19): a digit
that is not an ASCII digit ("²", which ``str.isdigit`` accepts and ``int()`` refuses) skips that
entry or is one clear line; a JSON ``true`` is no number of tokens; a model named twice is one
step, not two."""

import json

import pytest

from attn_core import checkpoint
from attn_core import dynamics as D
from attn_core.dynamics import folders
from attn_core.validate import whole_number
from tests.conftest import cli_main, make_tiny_model

cli = cli_main


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return checkpoint.save(make_tiny_model(), tmp_path_factory.mktemp("names") / "step10", {"task": "reverse"})


@pytest.mark.parametrize("text", ["²", "1²", "٣", "", " 1", "+1", "-1", "1" * 20, "1e3"])
def test_only_ascii_digits_are_a_whole_number(text):
    assert whole_number(text) is None


def test_whole_numbers():
    assert [whole_number(t) for t in ("0", "007", "1" * 19)] == [0, 7, int("1" * 19)]


def test_a_subfolder_named_with_a_superscript_is_skipped_not_fatal(model, tmp_path):
    for name in ("step10", "²", "step²"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text((model / "config.json").read_text())
    assert folders.step_and_tokens("²") == (None, None)
    found, problems = folders.entries(tmp_path, 100)
    assert [e.step for e in found] == [10]
    assert sorted(p[1] for p in problems) == sorted(["²", "step²"])
    assert all("carries no step" in p[2] for p in problems)


def test_a_csv_cell_with_a_superscript_skips_its_row(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "series.csv").write_text("step,tokens,folder\n5,50,a\n²,7,b\n6,²,b\n")
    found, problems = folders.entries(tmp_path, 100)
    assert [(e.step, e.tokens, e.folder.name) for e in found] == [(5, 50, "a")]
    assert [p[2] for p in problems] == [
        "its step '²' is not a whole number >= 0",
        "its tokens '²' are not a whole number >= 0",
    ]


def test_tokens_true_in_a_json_manifest_is_no_number(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "series.json").write_text(json.dumps([{"step": 5, "tokens": True, "folder": "a"}]))
    found, problems = folders.entries(tmp_path, 100)
    assert found == [] and problems == [(5, "a", "its tokens 'True' are not a whole number >= 0")]


@pytest.mark.parametrize("option", [("--steps", "1,²"), ("--early", "1:²"), ("--late", "²:3")])
def test_a_superscript_in_an_option_is_one_clear_line(model, capsys, option):
    extra = ("--steps", "1,2") if option[0] != "--steps" else ()
    code, out, err = cli(capsys, "dynamics", str(model), str(model), *option, *extra)
    assert code == 2 and out == ""
    assert "invalid literal" not in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"error: {option[0]} takes")


def test_the_same_model_named_twice_is_one_step(model):
    series = D.series([str(model), str(model)], steps=[1, 2])
    assert series.steps == [1]
    assert [(s.step, s.reason.split(" (")[0]) for s in series.skipped] == [(2, "is named twice")]
    series = D.series([str(model), str(model / ".." / model.name)])  # the same folder by another path
    assert series.steps == [10] and len(series.skipped) == 1
