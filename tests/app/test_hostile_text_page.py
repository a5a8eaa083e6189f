"""The Retrain page's Text section as a hostile user meets it (issue 31): bad uploads (a lone
surrogate in JSONL, Parquet with duplicate columns, a .csv, a file without a usable name) and a
tokenizer that panics are one line in the page's words (no command-line option, no store path),
never a traceback; an upload replaced by another of the same size is the one tokenized; the batch
size is offered and the estimated duration said before Start."""

import json
import re
from pathlib import Path

import pytest
from dashboard_helpers import open_page

from attn_core.text import files
from tests.conftest import write_tiny_hf
from tests.text_corpus import make_text, write_word_tokenizer

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "app_pages" / "3_Retrain.py")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-models")
    write_tiny_hf(root / "tiny-llama", "llama", num_key_value_heads=2)
    write_word_tokenizer(root / "tiny-llama")
    panics = root / "panics"
    write_tiny_hf(panics, "llama", num_key_value_heads=2)
    write_word_tokenizer(panics)
    tok = json.loads((panics / "tokenizer.json").read_text())
    tok["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a+)+b"}, "behavior": "Isolated", "invert": False}
    (panics / "tokenizer.json").write_text(json.dumps(tok))
    return root


@pytest.fixture
def page(models, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_MODELS", str(models))
    monkeypatch.delenv("ATTN_LAB_DATA", raising=False)

    def open_(model: str = "tiny-llama"):
        return open_page(PAGE, model)

    return open_


def upload(at, name: str, data: bytes):
    at.get("file_uploader")[0].set_value((name, data, "application/octet-stream"))
    at.number_input(key="text_block").set_value(8)
    return at.run()


def parquet_with_two_text_columns() -> bytes:
    import io

    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_arrays([pa.array(["w1"]), pa.array(["w2"])], names=["text", "text"]), buf)
    return buf.getvalue()


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("s.jsonl", b'{"text": "w1 \\ud800 w2"}\n', "s.jsonl line 1: field 'text' holds a lone surrogate"),
        ("d.parquet", None, "d.parquet has 2 columns named 'text'"),
        ("evil.csv", b"w1,w2\n", "upload a .txt, .jsonl or .parquet file, not 'evil.csv'"),
        ("\x00.txt", b"w1 w2", "the uploaded file has no usable name"),
        (
            "f.jsonl",
            b'{"body": "w1"}\n',
            "f.jsonl line 1 has no field 'text' (its fields: 'body'); name it in the Text field box",
        ),
    ],
    ids=["jsonl-lone-surrogate", "parquet-duplicate-columns", "csv", "nul-name", "missing-field"],
)
def test_a_bad_upload_is_one_line_in_the_pages_words(page, name, data, message):
    at = upload(page(), name, parquet_with_two_text_columns() if data is None else data)
    assert not at.exception
    [error] = at.error
    assert error.value.startswith("This text cannot be used: ") and message in error.value, error.value
    assert "--" not in error.value and str(files.UPLOADS) not in error.value and "\n" not in error.value
    assert at.button(key="retrain_start").proto.disabled is True


def test_a_tokenizer_that_panics_is_one_line_and_the_page_goes_on(page):
    at = upload(page("panics"), "a.txt", ("w1 " + "a" * 40 + "c w2\n").encode())
    assert not at.exception
    [error] = at.error
    assert (
        "tokenizer.json: tokenizing a.txt failed (Onig: Regex search error: retry-limit-in-match over)" in error.value
    )
    assert at.button(key="retrain_start").proto.disabled is True


def test_a_replaced_upload_of_the_same_size_is_the_one_tokenized(page):
    at = upload(page(), "t.txt", make_text(0, lines=60).encode())
    other = make_text(0, lines=60).replace("w1 ", "w2 ").encode()  # the same size, other bytes
    at = upload(at, "t.txt", other)
    second = [c.value for c in at.caption if "tokens in" in c.value]
    assert not at.error and "tokenized in" in second[0]  # a new entry: tokenized, not found in the cache
    kept = sorted(p.read_bytes() for p in (files.default_root() / files.UPLOADS).glob("*/upload.txt"))
    assert other in kept and len(kept) == 2


# a duration and a range as attn_core.training.estimate.range_text says them: "about 20 s",
# "20–45 s", "2–7 min", "1 s – 2 min" (the high end grows with the machine's load), "about 1.5 h"
DURATION = r"\d+(?:\.\d)? (?:s|min|h)"
RANGE = rf"(?:about {DURATION}|\d+(?:\.\d)?–{DURATION}|{DURATION} – {DURATION})"


@pytest.mark.parametrize("load", [0.0, 40.0])  # an idle machine, and one loaded 40 times over
def test_the_batch_is_offered_and_the_duration_estimated_before_start(page, load, monkeypatch):
    from attn_core.training import estimate as E

    monkeypatch.setattr(E, "load_per_core", lambda: load)
    at = upload(page(), "t.txt", make_text(1, lines=120).encode())
    assert at.number_input(key="text_batch").value == 0  # auto
    [estimate] = [c.value for c in at.caption if c.value.startswith("Estimated duration: ")]
    assert re.match(rf"Estimated duration: {RANGE} on cpu \(", estimate), estimate  # a range
    assert "steps of 64 × 8 tokens" in estimate  # the tiny model's auto batch on the CPU
    at.number_input(key="text_batch").set_value(4).run()
    [estimate] = [c.value for c in at.caption if c.value.startswith("Estimated duration: ")]
    assert "steps of 4 × 8 tokens" in estimate and not at.error
