"""attn-lab sinks, the two ranks in spectrum --json, concentration without sinks in scores, and the
sink and rank figures of export: one JSON document each, the library's numbers, one-line errors."""

from __future__ import annotations

import pytest
import torch

from attn_core.bilinear import ranks, sinks
from attn_core.sources import resolve
from attn_core.text.probes import probes
from tests.conftest import cli_json, cli_run
from tests.conftest import one_line_error as shared_one_line_error

run, run_json = cli_run, cli_json


def one_line_error(result, *words):
    return shared_one_line_error(result, *words, after_progress=True)  # a progress line (tokenizing) may come first


@pytest.fixture(scope="module")
def gpt2(gpt2_with_text):
    return gpt2_with_text


def test_sinks_on_a_zoo_model_are_the_librarys():
    r = run_json("sinks", "sort-2l-mlp", "--samples", 8, "--eps", 0.25)
    loaded = resolve("sort-2l-mlp")
    ref = sinks(loaded.model, probes(loaded, n=8).tokens, 0.25)
    assert r["rate"] == pytest.approx(ref.rate) and r["rate_first"] == pytest.approx(ref.rate_first)
    assert r["eps"] == 0.25 and r["probes"] == 8 and r["length"] == 12 and "sort" in r["inputs"]
    assert [h["sink"] for h in r["heads"]] == ref.is_sink.flatten().tolist()
    assert torch.allclose(
        torch.tensor([h["importance"] for h in r["heads"]], dtype=torch.float64), ref.importance.flatten(0, 1)
    )
    human = run("sinks", "sort-2l-mlp", "--samples", 8)
    assert human.exit_code == 0 and "sink rate" in human.stdout and "first token alone" in human.stdout


def test_sinks_on_a_text_and_the_figure(gpt2, tmp_path):
    folder, text = gpt2
    out = tmp_path / "sinks.csv"
    r = run_json("sinks", folder, "--text", text, "--samples", 4, "--out", out)
    assert r["probes"] == 4 and r["length"] == 16 and "windows of 16 tokens" in r["inputs"]
    assert r["out"] == str(out) and out.read_text().startswith("layer,head,key,importance")
    assert len(r["heads"]) == 8
    again = run("sinks", folder, "--text", text, "--out", out)
    one_line_error(again, "already exists")


@pytest.mark.parametrize(
    "args, words",
    [
        (("sinks", "sort-2l-mlp", "--eps", 0), ["--eps"]),
        (("sinks", "sort-2l-mlp", "--samples", 0), ["--samples"]),
        (("sinks", "sort-2l-mlp", "--length", 99), ["--length", "2..12"]),
        (("sinks", "sort-2l-mlp", "--seed", -1), ["--seed"]),
        (("sinks", "sort-2l-mlp", "--text", "/nonexistent.txt"), ["tokenizer.json"]),
        (("sinks", "sort-2l-mlp", "--out", "x.pdf"), ["--out"]),
        (("sinks", "no-such-model"), ["no-such-model"]),
        (("spectrum", "sort-2l-mlp", "--variance", 1.5), ["--variance"]),
        (("scores", "sort-2l-mlp", "--eps", 1), ["--eps"]),
    ],
)
def test_bad_input_is_one_line(args, words):
    one_line_error(run(*args), *words)


def test_a_model_without_a_task_needs_a_text(gpt2, tmp_path):
    folder, _ = gpt2
    one_line_error(run("sinks", folder), "--text")
    missing = run("sinks", folder, "--text", tmp_path / "missing.txt")
    one_line_error(missing, "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("w1 w2\n")
    assert run("sinks", folder, "--text", empty).exit_code == 2


def test_spectrum_reports_both_ranks(gpt2):
    folder, text = gpt2
    rows = run_json("spectrum", "sort-2l-mlp", "--samples", 8)
    loaded = resolve("sort-2l-mlp")
    ref = ranks(loaded.model, probes(loaded, n=8).tokens)
    for row, want in zip(rows, ref.heads()):
        assert row["weight_rank"] == want["weight_rank"] and row["variance"] == 0.9
        assert row["data_rank"] == pytest.approx(want["data_rank"])
        assert row["data_stable_rank"] == pytest.approx(want["data_stable_rank"])
        assert "sort samples" in row["data_inputs"]
    weights_only = run_json("spectrum", folder)
    assert all(r["data_rank"] is None and r["weight_rank"] >= 1 for r in weights_only)
    human = run("spectrum", folder)
    assert human.exit_code == 0 and "not measured: give --text FILE" in human.stdout
    on_text = run_json("spectrum", folder, "--text", text, "--samples", 3, "--variance", 0.8)
    assert all(r["data_rank"] is not None and r["variance"] == 0.8 for r in on_text)


def test_scores_with_and_without_sinks():
    r = run_json("scores", "sort-2l-mlp", "--head", 1)
    assert r["sink_keys"] == [0, 5] and r["eps"] == 0.3  # this head's sinks on sample 0 (measured)
    with_sinks = r["concentration"]["summary"]["normalized_entropy"]["mean"]
    without = r["concentration_without_sinks"]["summary"]["normalized_entropy"]["mean"]
    assert without > with_sinks  # the sinks made the head look concentrated
    assert set(r["concentration_without_sinks"]["per_query"]) == set(r["concentration"]["per_query"])


@pytest.mark.parametrize("figure", ["pattern-sinks-apart", "pattern-no-sinks", "sinks", "ranks"])
def test_export_the_sink_and_rank_figures(figure, tmp_path):
    out = tmp_path / f"{figure}.html"
    r = run_json("export", "sort-2l-mlp", "--figure", figure, "--head", 1, "--out", out)
    assert r["format"] == "html" and out.stat().st_size > 1000


def test_export_concentration_without_sinks(tmp_path):
    out = tmp_path / "c.csv"
    run_json("export", "sort-2l-mlp", "--figure", "concentration", "--without-sinks", "--out", out)
    head = out.read_text().splitlines()[0]
    assert head.endswith("sink_keys")


def test_a_text_that_is_not_text_is_one_line(gpt2, tmp_path):
    folder, _ = gpt2
    binary = tmp_path / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 64)
    one_line_error(run("sinks", folder, "--text", binary))
    one_line_error(run("spectrum", folder, "--text", binary))
