"""`attn-lab kernels` and `attn-lab kernels-bench` through a real subprocess: one JSON document,
numbers that match the library, and one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from attn_core import kernels
from attn_core.sources import resolve
from benchmarks import kernel_methods as bench


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attn_core", *args], capture_output=True, text=True, timeout=120)


def test_kernels_json_matches_the_library():
    r = cli(
        "kernels",
        "induction-2l",
        "--layer",
        "1",
        "--head",
        "0",
        "--method",
        "favor",
        "--features",
        "16",
        "--seeds",
        "2",
        "--samples",
        "4",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {
        "method",
        "features",
        "seeds",
        "rel_error_mean",
        "rel_error_std",
        "tv_mean",
        "tv_std",
        "stable_rank",
        "spectral_norm",
    } <= set(doc)
    assert (doc["method"], doc["features"], doc["seeds"], doc["causal"]) == ("favor", 16, 2, True)
    loaded = resolve("induction-2l")
    direct = kernels.head_error(loaded.model, loaded.task.sample(4, 0, "test").tokens, 1, 0, "favor", 16, 2)
    assert doc["rel_error_mean"] == pytest.approx(direct["rel_error_mean"], rel=1e-9)
    assert doc["tv_mean"] == pytest.approx(direct["tv_mean"], rel=1e-9)


def test_no_causal_changes_the_result():
    args = ("kernels", "induction-2l", "--method", "nystromformer", "--features", "8", "--seeds", "1", "--samples", "2")
    causal, full = (json.loads(cli(*args, *extra, "--json").stdout) for extra in ((), ("--no-causal",)))
    assert causal["causal"] is True and full["causal"] is False
    assert causal["tv_mean"] != full["tv_mean"]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--head", "9"), "0..3"),
        (("--layer", "5"), "layer"),
        (("--method", "performer"), "favor, maclaurin, schoenbat, nystrom, nystromformer"),
        (("--features", "0"), "--features must be an integer in 1..65536"),
        (("--seeds", "0"), "--seeds must be an integer in 1..1000"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, message):
    r = cli("kernels", "induction-2l", *args, "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["error"] in r.stderr  # --json: the error as JSON too
    # the one-line message is the last line (a library warning may come before it), no traceback
    assert message in r.stderr.strip().splitlines()[-1] and "Traceback" not in r.stderr, r.stderr


def test_bench_json_has_rows_and_crossover():
    r = cli("kernels-bench", "--max-n", "512", "--repeats", "1", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {(row["n"], row["method"]) for row in doc["rows"]} == {
        (n, m) for n in (256, 512) for m in ("sdpa", *bench.BENCH_METHODS)
    }
    assert all(row["ms"] > 0 for row in doc["rows"]) and set(doc["crossover"]) == set(bench.BENCH_METHODS)
    assert doc["config"]["torch_threads"] == 1 and doc["config"]["max_n"] == 512


def test_bench_refuses_short_lengths():
    r = cli("kernels-bench", "--max-n", "100")
    assert r.returncode == 2 and "--max-n must be an integer in 256.." in r.stderr
