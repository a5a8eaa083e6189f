"""attn-lab circuits / attribute, run as a user runs them (a subprocess): the JSON documents of
issue 14, the library's own numbers, terms that add up to the model's score, one-line errors."""

import json
import subprocess
import sys

import pytest
import torch

from attn_core import bilinear, checkpoint
from attn_core.circuits import attribute_report, circuits_report
from attn_core.hooks import act_name
from attn_core.sources import resolve
from tests.conftest import make_tiny_model


def run(*args, ok=True):
    proc = subprocess.run(
        [sys.executable, "-m", "attn_core", *map(str, args)], capture_output=True, text=True, timeout=300
    )
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def run_json(*args):
    return json.loads(run(*args, "--json").stdout)


@pytest.fixture(scope="module")
def biased(tmp_path_factory):
    """A two-layer induction-shaped model with query/key biases, so the bias term is not 0."""
    m = make_tiny_model("induction", std=0.4, n_layers=2, n_heads=2, d_model=16, d_head=4, attn_bias=True)
    return checkpoint.save(m, tmp_path_factory.mktemp("models") / "biased", card={"task": "induction"})


def test_circuits_json_is_the_library_report():
    doc = run_json("circuits", "induction-2l", "--samples", 8, "--seed", 1)
    assert set(doc) == {"heads", "order", "composition", "composition_baseline"}
    loaded = resolve("induction-2l")
    L, H = loaded.config.n_layers, loaded.config.n_heads
    assert doc["order"] == [f"L{l}H{h}" for l in range(L) for h in range(H)]
    assert [(h["layer"], h["head"]) for h in doc["heads"]] == [(l, h) for l in range(L) for h in range(H)]
    for h in doc["heads"]:
        assert set(h) == {"layer", "head", "copying_score", "qk_positivity", "ov_singular_values"}
    for part in ("composition", "composition_baseline"):
        assert set(doc[part]) == {"q", "k", "v"}
        for m in doc[part].values():
            assert len(m) == L * H and all(len(r) == L * H for r in m)
            assert m[0][0] is None and m[H][0] is None and m[0][H] is not None  # earlier layer -> later only
    expected = circuits_report(loaded.model, n_samples=8, seed=1)
    assert doc["order"] == expected["order"]
    for got, want in zip(doc["heads"], expected["heads"]):
        assert got["copying_score"] == pytest.approx(want["copying_score"], abs=1e-6)
        assert got["qk_positivity"] == pytest.approx(want["qk_positivity"], abs=1e-6)
        assert got["ov_singular_values"] == pytest.approx(want["ov_singular_values"], abs=1e-6)
    for part in ("composition", "composition_baseline"):
        for k in "qkv":
            flat = [v for r in doc[part][k] for v in r]
            want = [v for r in expected[part][k] for v in r]
            assert [v is None for v in flat] == [v is None for v in want]
            assert [v for v in flat if v is not None] == pytest.approx([v for v in want if v is not None], abs=1e-6)
    # the previous-token head's K-composition into the induction heads leads the human summary
    text = run("circuits", "induction-2l", "--samples", 8).stdout
    assert "copying_score" in text and "qk_positivity" in text and "baseline" in text
    first_edge = text.split("corrected")[1].splitlines()[1].split()
    assert first_edge[:2] == ["K", "L0H3"]


def test_attribute_terms_and_bias_add_up_to_the_models_own_score(biased):
    doc = run_json("attribute", biased, "--layer", 1, "--head", 1, "--query", 5, "--tokens", "a b c a b c d")
    assert set(doc) == {"query", "split", "keys"} and doc["query"] == 5 and doc["split"] == "rank-1 terms of B"
    assert sorted(k["key"] for k in doc["keys"]) == list(range(6))  # every key the query sees
    scores = [k["score"] for k in doc["keys"]]
    assert scores == sorted(scores, reverse=True)
    loaded = resolve(biased)
    ids = bilinear.input_ids(loaded, "a b c a b c d")
    with torch.no_grad():
        _, cache = loaded.model.run_with_cache(torch.tensor([ids]))
    S = cache[act_name("attn_scores", 1)][0, 1, 5]
    assert any(abs(k["bias"]) > 1e-3 for k in doc["keys"])  # the biases take part
    for k in doc["keys"]:
        assert set(k) == {"key", "token", "score", "terms", "bias"}
        assert all(set(t) == {"direction", "term", "sigma", "contribution"} for t in k["terms"])
        assert sum(t["contribution"] for t in k["terms"]) + k["bias"] == pytest.approx(k["score"], abs=1e-5)
        assert k["score"] == pytest.approx(float(S[k["key"]]), abs=1e-5)
        assert k["token"] == "abcabcd"[k["key"]]
    # the library's numbers, exactly as the library computes them
    assert doc == json.loads(json.dumps(attribute_report(loaded, 1, 1, 5, ids)))


def test_attribute_on_a_sample_with_top_and_the_human_table():
    doc = run_json("attribute", "induction-2l", "--layer", 1, "--head", 0, "--sample-seed", 2, "--top", 3)
    loaded = resolve("induction-2l")
    ids = bilinear.sample_tokens(loaded, 2)
    assert doc["query"] == len(ids) - 1 and len(doc["keys"]) == 3  # default query: the last token
    assert doc == json.loads(json.dumps(attribute_report(loaded, 1, 0, len(ids) - 1, ids, top=3)))
    text = run("attribute", "induction-2l", "--layer", 1, "--head", 0, "--random-seed", 4, "--top", 2).stdout
    assert "top_terms" in text and "beats key" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (("--head", 9), "head 9 is outside 0..3"),
        (("--layer", 2), "layer 2 is outside 0..1"),
        (("--query", 99), "query must be an integer in 0..23"),
        (("--tokens", "a zz"), "unknown tokens ['zz']"),
        (("--tokens", "a", "--sample-seed", 1), "at most one of"),
    ],
)
def test_attribute_errors_are_one_line_with_exit_code_2(args, message):
    proc = run("attribute", "induction-2l", *args, "--json", ok=False)
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"] in proc.stderr  # --json: the error as JSON too
    # the one-line message is the last line (a library warning may come before it), no traceback
    assert message in proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr


def test_circuits_errors_are_one_line_with_exit_code_2():
    proc = run("circuits", "induction-2l", "--samples", 0, "--json", ok=False)
    assert (
        proc.returncode == 2
        and "--samples must be an integer in 1.." in proc.stderr.strip().splitlines()[-1]
        and "Traceback" not in proc.stderr
    )
