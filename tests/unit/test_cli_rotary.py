"""attn-lab offsets / pair on an imported rotary model, run as a user runs them (a subprocess),
and the model's tokenizer.json behind --tokens."""

import json
import subprocess
import sys

import pytest
import torch

from attn_core import bilinear as bl
from attn_core.sources import resolve
from tests.conftest import write_tiny_hf


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("rotary")
    write_tiny_hf(root, "gpt_neox", rotary_pct=0.5)
    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "cat", "sat"])}
    vocab.update({f"w{i}": i for i in range(4, 100)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    return root


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attn_core", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_offsets_json_matches_the_library(folder):
    proc = cli("offsets", folder, "--layer", 1, "--head", 2, "--span", 5, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [r["delta"] for r in doc["by_offset"]] == [0, -1, -2, -3, -4]
    assert doc["rotary_dims"] == 4 and doc["d_head"] == 8 and doc["kv_head"] == 2
    model = resolve(folder).model
    for r in doc["by_offset"]:
        want = bl.layer_form(model, 1, offset=r["delta"])[2].singular_values[:8]
        assert r["singular_values"] == pytest.approx(want.tolist(), rel=1e-4)
    assert list(doc["reference"]) == ["un-rotated W_Q W_K^T", "offset-free (dims 4..7)"]


def test_pair_takes_tokens_as_text(folder):
    proc = cli("pair", folder, "--query", "cat", "--key", "sat", "--span", 3, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["query"], doc["key"]) == ("cat", "sat") and [r["delta"] for r in doc["scores"]] == [0, -1, -2]
    bad = cli("pair", folder, "--query", "the cat", "--key", "sat")
    assert bad.returncode == 2 and "is 2 tokens; give exactly one" in bad.stderr and "Traceback" not in bad.stderr


def test_scores_tokenizes_typed_text(folder):
    proc = cli("scores", folder, "--layer", 0, "--head", 1, "--tokens", "the cat sat the cat", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["token_ids"] == [1, 2, 3, 1, 2] and doc["tokens"][:3] == ["the", "cat", "sat"]
    with torch.no_grad():
        _, cache = resolve(folder).model.run_with_cache(torch.tensor([[1, 2, 3, 1, 2]]))
    got = torch.tensor([[float("nan") if v is None else v for v in row] for row in doc["scores"]])
    want = cache["blocks.0.attn.hook_attn_scores"][0, 1]
    keep = torch.ones(5, 5).tril().bool()
    assert torch.allclose(got[keep], want[keep], atol=1e-4)


def test_offsets_refuses_a_model_without_rotary():
    proc = cli("offsets", "induction-2l")
    assert proc.returncode == 2 and "needs a model with rotary positions" in proc.stderr
