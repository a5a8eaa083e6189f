"""What sinks, spectrum and scores say to a user of an imported folder (issue 37, item 20, the
parts without Ray): probes of a short text speak of probes and --length (nothing is trained:
no block, no held-out part); ``scores --tokens "1 2 3"`` on a folder whose tokenizer.json does not
know those pieces is refused in one line instead of running on its unknown token."""

import json

import pytest
from typer.testing import CliRunner

from attn_core.cli import app
from tests.conftest import write_tiny_gpt2
from tests.text_corpus import write_word_tokenizer

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("imported") / "gpt2"
    folder.mkdir()
    write_tiny_gpt2(folder)
    write_word_tokenizer(folder)
    return folder


def run(args: list, code: int):
    res = CliRunner().invoke(app, [str(a) for a in args] + ["--json"])
    assert res.exit_code == code, res.output
    return res


@pytest.mark.parametrize("command", ["sinks", "spectrum"])
def test_a_short_text_for_probes_speaks_of_probes_not_training(imported, tmp_path, monkeypatch, command):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    text = tmp_path / "short.txt"
    text.write_text("w1 w2 w3\n")  # 3 tokens: probes of 2, never a training block and a held-out one
    res = run([command, imported, "--text", text, "--length", "2", "--samples", "4"], 0)
    assert "windows of 2 tokens" in res.stdout
    res = run([command, imported, "--text", text, "--length", "8"], 2)
    line = res.stderr.strip().splitlines()[-1]
    assert "--block" not in line and "train" not in line and "held" not in line, line
    assert "fewer than one probe of 8 (--length 8)" in line


def test_ids_typed_for_a_folder_with_a_tokenizer_are_refused_clearly(imported):
    res = run(["scores", imported, "--tokens", "1 2 3"], 2)
    line = res.stderr.strip().splitlines()[-1]
    assert "unknown token" in line and "not token ids" in line and "\n" not in line
    ok = run(["scores", imported, "--tokens", "w1 w2 w3"], 0)
    assert json.loads(ok.stdout)["tokens"][:3] == ["w1", "w2", "w3"]
