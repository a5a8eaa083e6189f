"""Where output goes (issue 25, "Files"): never into the shipped ``assets/`` (nor inside a model
folder), the destination itself never a link, its parents' links followed and checked where they
lead; a link to an empty folder, a dangling link and an empty mount point each get their true
reason, before any work. Commands run in-process through the real CLI."""

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attn_core import checkpoint, destinations
from attn_core.cli import app
from attn_core.zoo import ZOO_DIR, list_models
from tests.conftest import make_tiny_model, refused


@pytest.fixture
def shipped_untouched():
    """The shipped zoo before and after: a refused command leaves it as it was."""
    before = sorted(p.name for p in ZOO_DIR.iterdir())
    yield
    for name in ("zz", "zz-export"):
        shutil.rmtree(ZOO_DIR / name, ignore_errors=True)  # only if a refusal failed: keep the repo clean
    shutil.rmtree(ZOO_DIR / "induction-2l" / "sub", ignore_errors=True)
    assert sorted(p.name for p in ZOO_DIR.iterdir()) == before


@pytest.mark.parametrize(
    "args",
    [
        ["export-hf", "reverse-1l", "--out", "{zoo}/zz-export"],
        ["train", "--preset", "reverse-1l", "--steps", "1", "--out", "{zoo}/zz"],
        ["export-hf", "reverse-1l", "--out", "{zoo}/induction-2l/sub"],
        ["train", "--preset", "reverse-1l", "--steps", "1", "--out", "{zoo}/../zz"],
    ],
    ids=["export-hf", "train", "inside-a-shipped-model", "assets-itself"],
)
def test_output_never_goes_into_the_shipped_assets(shipped_untouched, args, monkeypatch):
    monkeypatch.delenv(destinations.WRITE_ZOO, raising=False)
    refused([a.format(zoo=ZOO_DIR) for a in args], "is inside the shipped assets/ folder")
    assert {m["name"] for m in list_models(problems=[])}.isdisjoint({"zz", "zz-export"})


def test_a_library_save_into_the_zoo_is_refused_too(shipped_untouched, monkeypatch):
    monkeypatch.delenv(destinations.WRITE_ZOO, raising=False)
    with pytest.raises(checkpoint.CheckpointError, match="inside the shipped assets/ folder"):
        checkpoint.save(make_tiny_model(), ZOO_DIR / "zz")


def test_a_destination_inside_a_model_folder_is_refused(tmp_path):
    model = checkpoint.save(make_tiny_model(), tmp_path / "m")
    refused(["export-hf", "reverse-1l", "--out", model / "hf"], f"is inside the model folder {model}")
    refused(["train", "--preset", "reverse-1l", "--out", model / "sub" / "x"], "is inside the model folder")


def test_links_among_the_parents_are_followed_and_checked_where_they_lead(tmp_path):
    """What the README says of output and links: a parent link into a folder of one's own is
    written through; one into a model folder is refused as that folder; the destination itself
    a link, refused."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (tmp_path / "to-mine").symlink_to(mine)
    assert destinations.check_destination(tmp_path / "to-mine" / "new") == tmp_path / "to-mine" / "new"
    model = checkpoint.save(make_tiny_model(), tmp_path / "m")
    (tmp_path / "to-model").symlink_to(model)
    with pytest.raises(ValueError, match=f"inside the model folder {model}"):
        destinations.check_destination(tmp_path / "to-model" / "new")
    with pytest.raises(ValueError, match="is a link to"):
        destinations.check_destination(tmp_path / "to-mine")


def test_a_link_to_an_empty_folder_and_a_dangling_link_say_so(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "to-empty").symlink_to(empty)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for cmd in (["export-hf", "reverse-1l", "--out"], ["train", "--preset", "reverse-1l", "--out"]):
        line = refused([*cmd, tmp_path / "to-empty"], f"is a link to {empty}, a link is never written through")
        assert "created or filled while exporting" not in line
        refused([*cmd, tmp_path / "dangling"], "which does not exist (a dangling link)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "empty", "to-empty"] and not any(empty.iterdir())


def _empty_mount_point() -> Path | None:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        mp = Path(line.split()[1].replace("\\040", " "))
        try:
            if mp.is_dir() and os.path.ismount(mp) and not mp.is_symlink() and not any(mp.iterdir()):
                return mp
        except OSError:
            continue
    return None


def test_an_empty_mount_point_says_so():
    mp = _empty_mount_point()
    if mp is None:
        pytest.skip("no empty mount point on this machine")
    line = refused(["export-hf", "reverse-1l", "--out", mp], "is a mount point, which a save cannot replace")
    assert "created or filled" not in line


def test_an_empty_folder_is_still_an_export_destination(tmp_path):
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(app, ["export-hf", "reverse-1l", "--out", str(tmp_path / "empty"), "--json"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "empty" / "model.safetensors").is_file()
