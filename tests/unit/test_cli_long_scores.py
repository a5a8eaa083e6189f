"""attn-lab scores --text FILE --length N --topk K: the blocked per-query top keys of a Llama
folder built by transformers with a context of 8192 (the library's numbers, on the CPU), the
dense output kept for short inputs, and every bad option one line with exit 2 before any work."""

from __future__ import annotations

import json

import pytest
import torch

from attn_core.bilinear import blocked
from attn_core.bilinear.blocked import layer_qk, row_stats
from attn_core.sources import resolve
from tests.conftest import cli_run, one_line_error, write_tiny_hf
from tests.text_corpus import make_text, write_word_tokenizer

pytest.importorskip("transformers")
run = cli_run


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A Llama folder (context 8192, grouped heads) with a word-level tokenizer.json, and a text
    of about 10k of its tokens."""
    root = tmp_path_factory.mktemp("llama")
    folder = root / "llama-8k"
    folder.mkdir()
    write_tiny_hf(folder, "llama", num_key_value_heads=2, max_position_embeddings=8192)
    write_word_tokenizer(folder)
    text = root / "text.txt"
    text.write_text(make_text(2, lines=1000))
    return folder, text


def test_8192_tokens_of_a_text_are_the_librarys(llama):
    folder, text = llama
    result = run("scores", folder, "--layer", 1, "--head", 3, "--text", text, "--length", 8192, "--topk", 4, "--json")
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)
    assert r["n_tokens"] == 8192 and len(r["queries"]) == 8192 and r["topk"] == 4
    words = text.read_text().split()
    assert r["tokens"][:5] == words[:5] and r["tokens"][-1] == words[8191]  # the first 8192 tokens of the text
    loaded = resolve(folder)
    stats = row_stats(layer_qk(loaded.model, r["token_ids"], 1), 3, k=4)
    for i in (0, 1, 100, 8191):
        q = r["queries"][i]
        assert set(q) == {"query", "top", "entropy", "sink"}
        assert [t["key"] for t in q["top"]] == [k for k in stats.top_keys[i].tolist() if k >= 0]
        assert q["entropy"] == pytest.approx(float(stats.entropy[i]), abs=1e-6)
        assert q["sink"] == pytest.approx(float(stats.sink[i]), abs=1e-7)
        assert all(set(t) == {"key", "score", "weight"} for t in q["top"])
    assert len(r["queries"][0]["top"]) == 1 and r["queries"][0]["sink"] == pytest.approx(1.0)
    human = run("scores", folder, "--text", text, "--length", 1500, "--topk", 2)
    # without --json: the first and last 20 queries and the means over all, not 1,500 rows
    lines = human.stdout.splitlines()
    assert human.exit_code == 0 and "entropy" in human.stdout and len(lines) == 1 + 20 + 1 + 20 + 2, lines
    assert lines[21] == "... 1460 queries left out ..." and lines[-1].startswith("mean over all 1500 queries")
    assert lines[1].split()[0] == "0" and lines[-3].split()[0] == "1499"


def test_short_inputs_keep_the_dense_output(llama):
    folder, text = llama
    dense = json.loads(run("scores", folder, "--text", text, "--length", 20, "--json").stdout)
    assert len(dense["scores"]) == 20 and "queries" not in dense
    top = json.loads(run("scores", folder, "--text", text, "--length", 20, "--topk", 3, "--json").stdout)
    A = torch.tensor(dense["pattern"])
    for q in top["queries"]:
        assert [t["weight"] for t in q["top"]] == pytest.approx(
            A[q["query"]].topk(min(3, q["query"] + 1)).values.tolist(), abs=1e-6
        )


@pytest.mark.parametrize(
    "args, words",
    [
        (("--text", "TEXT", "--length", 9000, "--topk", 4), ["--length 9000", "context of 8192"]),
        (("--text", "TEXT", "--length", 2000), ["--topk", "long input"]),
        (("--text", "TEXT", "--length", 10, "--topk", 0), ["--topk", ">= 1"]),
        (("--text", "TEXT", "--length", 10, "--topk", 11), ["--topk 11", "past", "10 tokens"]),
        (("--text", "TEXT", "--length", 10, "--topk", 2, "--head", 4), ["head 4", "0..3"]),
        (("--text", "TEXT", "--length", 10, "--topk", 2, "--layer", 2), ["layer 2", "0..1"]),
        (("--text", "TEXT", "--random-seed", 1), ["--text", "not both"]),
        (("--length", 10, "--topk", 2), ["--length needs --text"]),
        (("--text", "SHORT", "--length", 100, "--topk", 2), ["--length 100", "beyond the text", "6 tokens"]),
        (("--text", "MISSING", "--topk", 2), ["does not exist"]),
    ],
)
def test_bad_input_is_one_line_before_any_work(llama, tmp_path, monkeypatch, args, words):
    folder, text = llama
    short = tmp_path / "short.txt"
    short.write_text("w1 w2 w3\nw4 w5 w6\n")
    paths = {"TEXT": text, "SHORT": short, "MISSING": tmp_path / "missing.txt"}

    def no_work(*a, **k):
        raise AssertionError("the forward ran")

    monkeypatch.setattr(blocked, "layer_qk", no_work)
    one_line_error(run("scores", folder, *[paths.get(a, a) for a in args]), *words)


def test_random_tokens_of_any_length_without_a_tokenizer(tmp_path):
    write_tiny_hf(tmp_path, "llama", max_position_embeddings=1200)
    r = json.loads(run("scores", tmp_path, "--random-seed", 0, "--length", 1100, "--topk", 2, "--json").stdout)
    assert r["n_tokens"] == 1100 and len(r["queries"][-1]["top"]) == 2
    one_line_error(run("scores", tmp_path, "--text", tmp_path / "config.json", "--topk", 2), "tokenizer.json")


def test_export_the_long_map_and_every_querys_top_keys(llama, tmp_path):
    folder, text = llama
    base = ("export", folder, "--layer", 1, "--head", 2, "--text", text, "--length", 1500)
    out = run(*base, "--figure", "long-map", "--out", tmp_path / "map.html", "--json")
    assert out.exit_code == 0, out.output
    html = (tmp_path / "map.html").read_text()
    assert "Plotly" in html and "1500 tokens" in html and "sink (key 0) apart" in html
    csv = run(*base, "--figure", "long-rows", "--out", tmp_path / "rows.csv")
    assert csv.exit_code == 0, csv.output
    lines = (tmp_path / "rows.csv").read_text().splitlines()
    assert lines[0].startswith("head,query,query_label,rank,key,key_label,offset,score,weight,entropy,sink")
    assert len(lines) == 1 + sum(min(8, q + 1) for q in range(1500))  # top 8 keys of every query
    again = run(*base, "--figure", "long-rows", "--out", tmp_path / "rows.csv")
    one_line_error(again, "rows.csv")  # never overwritten
    one_line_error(run("export", folder, "--figure", "scores", "--text", text, "--out", tmp_path / "x.csv"), "--text")
