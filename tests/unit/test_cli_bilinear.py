"""attn-lab spectrum / scores / heads / export: one JSON document each, clear errors."""

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from attn_core import checkpoint
from attn_core.cli import app
from attn_core.hooks import act_name
from attn_core.sources import resolve
from attn_core.zoo import ZOO_DIR
from tests.conftest import SPECTRUM_KEYS, make_tiny_model

runner = CliRunner()
ZOO = ZOO_DIR  # assets/models


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    m = make_tiny_model("induction", std=0.4, n_layers=2, n_heads=2, d_model=16, d_head=4)
    return checkpoint.save(m, tmp_path_factory.mktemp("models") / "tiny", card={"task": "induction"})


def run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result


def run_json(*args):
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_spectrum(folder):
    rows = run_json("spectrum", folder)
    assert len(rows) == 4
    assert SPECTRUM_KEYS <= set(rows[0]) and len(rows[0]["singular_values"]) == 4
    assert "stable_rank" in run("spectrum", folder).stdout  # the human table


def test_scores_on_typed_tokens_and_samples(folder):
    doc = run_json("scores", folder, "--layer", 1, "--head", 1, "--tokens", "a b c a b")
    assert doc["tokens"] == ["a", "b", "c", "a", "b"] and doc["token_ids"] == [0, 1, 2, 0, 1]
    assert len(doc["scores"]) == 5 and doc["scores"][0][1] is None  # hidden (future) keys are null
    assert all(abs(sum(r) - 1) < 1e-5 for r in doc["pattern"])
    conc = doc["concentration"]
    assert set(conc["summary"]) == {
        "entropy",
        "normalized_entropy",
        "hoyer",
        "topk_mass",
        "participation_ratio",
        "gini",
    }
    assert len(conc["per_query"]["entropy"]) == 5
    # the scores are the model's own
    loaded = resolve(folder)
    _, cache = loaded.model.run_with_cache(torch.tensor([doc["token_ids"]]))
    S = cache[act_name("attn_scores", 1)][0, 1]
    assert abs(doc["scores"][4][2] - S[4, 2].item()) < 1e-5
    sample = run_json("scores", folder, "--sample-seed", 3)
    assert len(sample["token_ids"]) == 24
    assert run_json("scores", folder, "--random-seed", 1)["token_ids"] != sample["token_ids"]


@pytest.mark.parametrize(
    "args, message",
    [
        (("--layer", 2), "layer 2 is outside 0..1"),
        (("--head", 5), "head 5 is outside 0..1"),
        (("--tokens", "a zz"), "unknown tokens ['zz']"),
        (("--tokens", "a", "--sample-seed", 1), "at most one of"),
    ],
)
def test_scores_errors_name_the_valid_range(folder, args, message):
    result = run("scores", folder, *args)
    assert result.exit_code == 2 and message in result.output


def test_unknown_model():
    result = run("spectrum", "no-such-model")
    assert result.exit_code == 2 and "no model named" in result.output


def test_heads(folder):
    doc = run_json("heads", folder, "--samples", 4)
    assert len(doc["heads"]) == 4
    assert set(doc["heads"][0]) == {"layer", "head", "previous_token", "induction", "duplicate_token", "self"}
    assert set(doc["best"]) == {"previous_token", "induction", "duplicate_token", "self"}
    assert run("heads", folder, "--rows", "bad").exit_code == 2


@pytest.mark.skipif(
    not (ZOO / "induction-2l" / "config.json").is_file(), reason="zoo model induction-2l not shipped yet"
)
def test_heads_on_the_zoo_induction_model():
    best = run_json("heads", "induction-2l")["best"]
    assert best["induction"]["layer"] == 1 and best["previous_token"]["layer"] == 0


@pytest.mark.parametrize(
    "figure, fmt",
    [
        ("scores", "csv"),
        ("spectrum", "html"),
        ("heads", "csv"),
        ("query", "csv"),
        ("vocab", "html"),
        ("positional", "csv"),
        ("eigenvalues", "csv"),
        ("concentration", "csv"),
        ("pattern", "csv"),
        ("vocab-pattern", "csv"),
    ],
)
def test_export_writes_and_refuses_to_overwrite(folder, tmp_path, figure, fmt):
    out = tmp_path / f"fig.{fmt}"
    doc = run_json("export", folder, "--figure", figure, "--out", out, "--layer", 1, "--head", 1)
    assert out.is_file() and doc["bytes"] == out.stat().st_size and doc["format"] == fmt
    again = run("export", folder, "--figure", figure, "--out", out)
    assert again.exit_code == 2 and "already exists" in again.output


@pytest.mark.skipif(shutil.which("chromium") is None, reason="PNG export needs Debian's chromium")
def test_export_png(folder, tmp_path):
    out = tmp_path / "scores.img"
    run_json("export", folder, "--figure", "scores", "--format", "png", "--out", out, "--query", 3)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_export_errors(folder, tmp_path):
    assert "unknown figure" in run("export", folder, "--figure", "nope", "--out", tmp_path / "a.csv").output
    assert "unknown format" in run("export", folder, "--figure", "heads", "--out", tmp_path / "a.txt").output
    assert (
        "head 9 is outside"
        in run("export", folder, "--figure", "scores", "--head", 9, "--out", tmp_path / "b.csv").output
    )
