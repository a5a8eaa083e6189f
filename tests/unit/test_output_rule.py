"""One output rule for every command that writes (issue 37, items 14 and 18): ``sinks --out``,
``export --out`` and ``dynamics --animate`` go through ``destinations.check_destination`` before
any work and before anything is written: never inside a model folder or the shipped zoo, never a
link (a dangling one included), never inside what the command reads (the --text folder, the
folders measured), also where a parent folder's link leads; a refused --animate leaves no
temporary folder in the measured folder."""

import tempfile
from pathlib import Path

import pytest

from attn_core import checkpoint, destinations
from tests.conftest import make_tiny_model, refused


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """A folder of model folders (step0/, step1/): what dynamics measures."""
    root = tmp_path_factory.mktemp("measured") / "series"
    for step in (0, 1):
        checkpoint.save(make_tiny_model(seed=step), root / f"step{step}", {"task": "reverse"})
    return root


@pytest.fixture
def made(monkeypatch):
    """Every folder ``tempfile.mkdtemp`` made in destinations (the writability probe)."""
    seen: list[Path] = []
    real = tempfile.mkdtemp

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(Path(out))
        return out

    monkeypatch.setattr(destinations.tempfile, "mkdtemp", spy)
    return seen


def sinks(out) -> list:
    return ["sinks", "reverse-1l", "--samples", "2", "--out", out]


def test_sinks_out_inside_a_model_folder_is_refused(series):
    refused(sinks(series / "step0" / "fig.csv"), "is inside the model folder")
    assert not (series / "step0" / "fig.csv").exists()


def test_sinks_out_through_a_parent_link_into_a_model_folder_is_refused(series, tmp_path):
    (tmp_path / "link").symlink_to(series / "step1")
    refused(sinks(tmp_path / "link" / "fig.csv"), "is inside the model folder")
    assert not (series / "step1" / "fig.csv").exists()


def test_sinks_out_never_replaces_a_dangling_link(tmp_path):
    (tmp_path / "fig.csv").symlink_to(tmp_path / "nowhere.csv")
    refused(sinks(tmp_path / "fig.csv"), "a dangling link")
    assert (tmp_path / "fig.csv").is_symlink() and not (tmp_path / "nowhere.csv").exists()


def test_a_parent_that_is_a_dangling_link_is_refused(tmp_path, made):
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    refused(sinks(tmp_path / "gone" / "sub" / "fig.csv"), "which leads nowhere")
    assert made == [] and not (tmp_path / "nowhere").exists()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    refused(sinks(tmp_path / "loop" / "fig.csv"), "which leads nowhere")


def test_sinks_out_inside_the_text_folder_is_refused(tmp_path, made):
    text = tmp_path / "corpus"
    text.mkdir()
    (text / "a.txt").write_text("w1 w2 w3\n")
    refused([*sinks(text / "fig.csv"), "--text", text], "which is being read")
    assert sorted(p.name for p in text.iterdir()) == ["a.txt"] and made == []


def test_export_out_follows_the_rule_too(series):
    refused(["export", "reverse-1l", "--figure", "spectrum", "--out", series / "step0" / "s.csv"], "model folder")


@pytest.mark.parametrize("through_a_link", [False, True], ids=["direct", "parent-link"])
def test_animate_into_the_measured_folder_is_refused_before_any_write(series, tmp_path, made, through_a_link):
    where = series
    if through_a_link:
        (tmp_path / "link").symlink_to(series)
        where = tmp_path / "link"
    before = sorted(p.name for p in series.iterdir())
    refused(["dynamics", series, "--samples", "2", "--animate", where / "anim.html"], "which is being measured")
    assert sorted(p.name for p in series.iterdir()) == before
    assert not any(p.resolve().is_relative_to(series.resolve()) for p in made), made
