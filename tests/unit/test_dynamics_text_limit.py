"""One limit for a text, everywhere (issue 37, item 5): a text of more than 200,000 characters,
which retrain, spectrum and sinks take, is measured by dynamics too (through the same corpus
path and token cache), and every command's --text help states the same limit."""

import json
import re

import pytest

from attn_core import checkpoint
from attn_core.text.corpus import TEXT_LIMIT
from tests.conftest import make_tiny_model
from tests.text_corpus import make_text, write_word_tokenizer

pytest.importorskip("tokenizers")


def cli(capsys, *args) -> tuple[int, str, str]:
    from attn_core.cli import main

    with pytest.raises(SystemExit) as done:
        main(list(args))
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def test_dynamics_takes_a_text_longer_than_the_typed_text_limit(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    folders = []
    for step in (0, 1):
        folder = checkpoint.save(make_tiny_model(d_vocab=100, n_ctx=16, seed=step), tmp_path / f"step{step}", {})
        write_word_tokenizer(folder, 100)
        folders.append(str(folder))
    text = tmp_path / "corpus.txt"
    text.write_text(make_text(lines=8000))
    assert len(text.read_text()) > 207_000
    code, out, err = cli(capsys, "dynamics", *folders, "--text", str(text), "--length", "8", "--samples", "4",
                         "--detector-samples", "4", "--json")  # fmt: skip
    assert code == 0, err
    res = json.loads(out)
    assert res["steps"] == [0, 1] and all(v is not None for v in res["metrics"]["loss"])


@pytest.mark.parametrize("command", ["dynamics", "sinks", "spectrum", "retrain"])
def test_every_text_option_states_the_same_limit(capsys, command):
    code, out, _ = cli(capsys, command, "--help")
    assert code == 0
    assert TEXT_LIMIT in re.sub(r"[\s│]+", " ", out)
