"""Links out of the run store (issue 37, items 15 and 16): ``dynamics run:<id>`` refuses a run
folder or a checkpoints/ folder that is a link leading out of the store (or of its folder) and
reads nothing behind it; a dynamics-cache entry that is a link is refused unread, and the file
it leads to keeps its modification time."""

import os

import pytest

from attn_core import checkpoint
from attn_core import dynamics as D
from attn_core.runs import RunStore
from attn_core.training import checkpoints as ckpt
from tests.conftest import make_tiny_model


def with_checkpoints(folder):
    folder = checkpoint.save(make_tiny_model(seed=2), folder, {"task": "reverse"})
    writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=1), 2)
    writer.start(folder / checkpoint.CHECKPOINTS, make_tiny_model(seed=0))
    for step in (1, 2):
        writer.write(step, make_tiny_model(seed=step))
    return folder


@pytest.fixture
def outside(tmp_path):
    return with_checkpoints(tmp_path / "outside")


@pytest.fixture
def store(tmp_path):
    s = RunStore(tmp_path / "runs")
    run_id = s.create("reverse-1l", "reverse", {})
    return s, run_id


def test_a_run_folder_linked_out_of_the_store_is_refused(store, outside):
    s, run_id = store
    s.path(run_id).symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match="outside the run store; it is never followed"):
        D.series([f"run:{run_id}"], store=s)


def test_a_runs_checkpoints_folder_linked_out_is_refused(store, outside):
    s, run_id = store
    s.path(run_id).mkdir(parents=True)
    (s.path(run_id) / checkpoint.CHECKPOINTS).symlink_to(outside / checkpoint.CHECKPOINTS)
    with pytest.raises(ValueError, match="checkpoints/ folder of .* outside its folder; it is never followed"):
        D.series([f"run:{run_id}"], store=s)


def test_a_model_folders_own_checkpoints_are_still_read(outside):
    assert D.series([str(outside)]).steps == [0, 1, 2]


def test_a_cache_entry_that_is_a_link_is_refused_and_its_target_untouched(tmp_path):
    cache = D.MetricCache(tmp_path / "c")
    cache.put("k", D.Measured({"loss": 1.0}, [[None]]))
    target = tmp_path / "elsewhere.json"
    os.replace(cache.folder / "k.json", target)  # a valid entry, kept outside the cache
    os.utime(target, (1_000_000, 1_000_000))
    (cache.folder / "k.json").symlink_to(target)
    assert cache.get("k", 1) is None
    assert cache.refused == 1 and "is a link" in cache.reasons[0]
    assert target.stat().st_mtime == 1_000_000
    cache.put("k", D.Measured({"loss": 2.0}, [[None]]))  # the new entry replaces the link, not its target
    assert not (cache.folder / "k.json").is_symlink() and '"loss": 1.0' in target.read_text()
