"""The dynamics cache (attn_core.dynamics.cache) as hostile input: every entry that is not exactly
what was written for its key (a FIFO, a folder, a link to a device, a huge or deeply nested file,
tampered or non-finite numbers, an entry copied under another key, a planted temporary name) is
refused without hanging and measured again to the same numbers; and its size bound."""

import json
import math
import os

import pytest

from attn_core import checkpoint
from attn_core import dynamics as D
from attn_core.dynamics.cache import MAX_ENTRY_BYTES, checksum
from attn_core.tasks import get_task
from attn_core.training import checkpoints as ckpt
from tests.conftest import make_tiny_model


@pytest.fixture
def series(tmp_path):
    """A tiny two-layer reverse model with three checkpoints (no training: the weights differ by seed)."""
    folder = checkpoint.save(make_tiny_model(n_layers=2, seed=2), tmp_path / "model", {"task": "reverse"})
    writer = ckpt.CheckpointWriter(ckpt.CheckpointPlan(every=1), 2)
    writer.start(folder / checkpoint.CHECKPOINTS, make_tiny_model(n_layers=2, seed=0))
    for step in (1, 2):
        writer.write(step, make_tiny_model(n_layers=2, seed=step))
    return D.series([str(folder)])


def measure(series, cache):
    return D.dynamics(series, D.task_inputs(get_task("reverse"), 8), detector_samples=4, cache=cache)


def entries(cache) -> list:
    return sorted(cache.folder.glob("*.json"))


@pytest.mark.timeout(120)
class TestHostileCache:
    @pytest.fixture
    def first(self, series, tmp_path):
        cache = D.MetricCache(tmp_path / "c")
        return measure(series, cache), cache

    def again(self, series, cache_folder, refused: int, hits: int):
        cache = D.MetricCache(cache_folder)
        dyn = measure(series, cache)
        assert (cache.refused, cache.hits) == (refused, hits), cache.reasons
        return dyn, cache

    @pytest.mark.parametrize("kind", ["fifo", "folder", "device link", "huge", "nested", "not json"])
    def test_an_entry_that_is_no_entry_is_refused_without_hanging(self, series, first, kind):
        dyn, cache = first
        path = entries(cache)[1]
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)  # opening it for reading would block for ever
        elif kind == "folder":
            path.mkdir()
        elif kind == "device link":
            path.symlink_to("/dev/zero")
        elif kind == "huge":
            with open(path, "wb") as f:  # sparse: costs nothing, must not be read
                f.truncate(MAX_ENTRY_BYTES + 1)
        elif kind == "nested":
            path.write_text("[" * 100_000 + "]" * 100_000)
        else:
            path.write_bytes(b"\xff\x00garbage")
        again, cache2 = self.again(series, cache.folder, refused=1, hits=2)
        assert again.metrics == dyn.metrics and again.k_composition == dyn.k_composition
        assert len(cache2.reasons) == 1 and "\n" not in cache2.reasons[0]
        if kind in ("fifo", "not json"):  # replaced by the measured entry: read on the next call
            self.again(series, cache.folder, refused=0, hits=3)

    def test_tampered_numbers_are_measured_again(self, series, first):
        dyn, cache = first
        path = entries(cache)[0]
        raw = json.loads(path.read_text())
        raw["values"]["loss"] = 0.001  # the checksum no longer matches
        path.write_text(json.dumps(raw))
        again, cache2 = self.again(series, cache.folder, refused=1, hits=2)
        assert again.metrics["loss"] == dyn.metrics["loss"] and 0.001 not in again.metrics["loss"]
        assert "checksum does not match" in cache2.reasons[0]

    @pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", True, 10**400])
    def test_a_number_that_is_not_finite_is_refused_never_printed_as_null(self, series, first, bad):
        dyn, cache = first
        path = entries(cache)[0]
        raw = json.loads(path.read_text())
        raw["values"] = {k: bad for k in raw["values"]}
        path.write_text(json.dumps(raw))  # json writes NaN and Infinity, as a tampered entry may
        again, _ = self.again(series, cache.folder, refused=1, hits=2)
        assert again.metrics == dyn.metrics
        assert all(v is not None for v in again.metrics["loss"] + again.metrics["icl_score"])

    def test_an_entry_under_another_key_or_of_another_shape_is_refused(self, series, first):
        dyn, cache = first
        a, b = entries(cache)[:2]
        b.write_bytes(a.read_bytes())  # a valid entry, copied under another key
        again, cache2 = self.again(series, cache.folder, refused=1, hits=2)
        assert again.metrics == dyn.metrics and "another key" in cache2.reasons[0]
        key = a.stem  # a consistent entry (its checksum recomputed) whose K-composition is 1 x 1
        forged = D.Measured(json.loads(a.read_text())["values"], [[0.5]])
        a.write_text(json.dumps({"format": 2, "key": key, "sha256": checksum(key, forged), "values": forged.values,
                                 "k_composition": forged.k_composition}))  # fmt: skip
        _, cache3 = self.again(series, cache.folder, refused=1, hits=2)
        assert "has 1 heads, the series 4" in cache3.reasons[0]

    def test_a_planted_temporary_name_does_not_block_a_write(self, tmp_path):
        cache = D.MetricCache(tmp_path / "c")
        cache.folder.mkdir()
        for pid in range(os.getpid() - 2, os.getpid() + 3):  # the names the old writer used
            os.mkfifo(cache.folder / f".k.tmp-{pid}.json")
        cache.put("k", D.Measured({"loss": 1.0}, [[None]]))
        assert cache.get("k", 1).values == {"loss": 1.0} and cache.write_errors == 0
        cache.put("n", D.Measured({"loss": math.nan}, [[None]]))  # never cached
        assert not (cache.folder / "n.json").exists()


def test_the_command_measures_again_past_a_fifo_entry(series, tmp_path, capsys):
    from attn_core.cli import main

    def run() -> tuple[dict, str]:
        with pytest.raises(SystemExit) as done:
            main(["dynamics", str(tmp_path / "model"), "--samples", "8", "--detector-samples", "4", "--json"])
        out = capsys.readouterr()
        assert done.value.code == 0, out.err
        return json.loads(out.out), out.err

    first, _ = run()
    victim = sorted(D.MetricCache().folder.glob("*.json"))[0]
    victim.unlink()
    os.mkfifo(victim)
    again, err = run()
    assert again == first and "cache: 2 of 3 checkpoints read" in err
    assert "1 entry refused and measured again" in err and "only regular files are read" in err


def test_the_cache_keeps_to_its_size_and_drops_the_least_recently_used(tmp_path):
    entry = D.Measured({f"m{i}": float(i) for i in range(40)}, [[0.5]])
    probe = D.MetricCache(tmp_path / "probe")
    probe.put("k0", entry)
    size = probe._path("k0").stat().st_size  # every key below has the same length
    cache = D.MetricCache(tmp_path / "c", max_bytes=10 * size)
    t = 1_000_000_000
    for i in range(10):  # full, not over
        cache.put(f"k{i}", entry)
        os.utime(cache._path(f"k{i}"), (t + i, t + i))  # written in this order, a second apart
    assert cache.evicted == 0 and len(list((tmp_path / "c").glob("*.json"))) == 10
    assert cache.get("k0") is not None  # used now: the newest
    cache.put("k10", entry)  # over: down to 3/4 (7 entries), oldest first, k0 and k10 kept
    left = sorted(p.stem for p in (tmp_path / "c").glob("*.json"))
    assert cache.evicted == 4 and left == ["k0", "k10", "k5", "k6", "k7", "k8", "k9"]
    assert sum(p.stat().st_size for p in (tmp_path / "c").glob("*.json")) <= 10 * size + size
    assert cache.get("k1") is None and cache.get("k9") is not None and cache.refused == 0
    with pytest.raises(ValueError, match="max_bytes must be a whole number of bytes >= 1"):
        D.MetricCache(tmp_path / "c", max_bytes=0)
