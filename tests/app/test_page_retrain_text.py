"""AppTest of the Retrain page on an imported model: a tiny Llama-family folder (grouped-query
attention, rotary) with a word-level tokenizer.json retrains on a text uploaded in the page or
picked under $ATTN_LAB_DATA; the page tokenizes it with a progress bar, shows the held-out
perplexity with the live curves, and the run is stored with its text and family."""

import json
from pathlib import Path

import pytest
from dashboard_helpers import chart, open_page
from streamlit.testing.v1 import AppTest
from test_page_retrain import poll

from attn_core import runs
from tests.conftest import write_tiny_hf
from tests.text_corpus import make_text, write_word_tokenizer

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "app_pages" / "3_Retrain.py")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-models")
    write_tiny_hf(root / "tiny-llama", "llama", num_key_value_heads=2)
    write_word_tokenizer(root / "tiny-llama")
    write_tiny_hf(root / "no-tokenizer", "llama", num_key_value_heads=2)
    return root


@pytest.fixture
def data(models, tmp_path, monkeypatch):
    folder = tmp_path / "data"
    (folder / "books").mkdir(parents=True)
    (folder / "books" / "a.txt").write_text(make_text(0, 120))
    (folder / "lines.jsonl").write_text("".join(json.dumps({"body": make_text(s, 10)}) + "\n" for s in range(6)))
    monkeypatch.setenv("ATTN_LAB_MODELS", str(models))
    monkeypatch.setenv("ATTN_LAB_DATA", str(folder))
    return folder


def test_a_text_from_the_data_folder_retrains_the_model_with_perplexity(data):
    at = open_page(PAGE, "tiny-llama")
    assert at.button(key="retrain_start").proto.disabled is True  # no text yet
    assert at.radio(key="text_from").options == ["an upload", "the data folder"]
    at.radio(key="text_from").set_value("data").run()
    assert at.selectbox(key="text_data").options == ["books/", "books/a.txt", "lines.jsonl"]
    at.selectbox(key="text_data").set_value("books/a.txt")
    at.number_input(key="text_block").set_value(16)
    at.radio(key="text_train").set_value("qk")
    at.number_input(key="retrain_steps").set_value(6)
    at.radio(key="reg_scope").set_value("layer")
    at.run()
    assert not at.error and not at.exception
    assert any("tokens in 1 document(s)" in c.value and "held out for perplexity" in c.value for c in at.caption)
    assert at.button(key="retrain_start").proto.disabled is False
    at.button(key="retrain_start").click().run()
    assert not at.exception and not at.error
    poll(at, lambda a: a.session_state["retrain_job"].snapshot().done and a.success)
    at.run()
    snap = at.session_state["retrain_job"].snapshot()
    assert snap.status == "completed" and snap.step == 6
    assert any(m.label == "held-out perplexity" and m.value != "–" for m in at.metric)
    ppl = chart(at, "live_perplexity")
    assert {t["name"] for t in ppl["data"]} == {"training batch", "held-out"}
    stored = runs.RunStore().get(snap.run_id)
    assert stored["task"] == "text" and stored["config"]["text"] == str(data / "books" / "a.txt")
    assert stored["config"]["train"] == "qk" and stored["config"]["block"] == 16
    assert stored["card"]["hf"]["model_type"] == "llama" and stored["summary"]["after"]["perplexity"] > 1


def test_an_upload_and_a_jsonl_field(data):
    at = open_page(PAGE, "tiny-llama")
    at.get("file_uploader")[0].set_value(("notes.jsonl", (data / "lines.jsonl").read_bytes(), "application/json"))
    at.number_input(key="text_block").set_value(8)
    at.run()
    assert "no field 'text'" in at.error[0].value and at.button(key="retrain_start").proto.disabled is True
    at.text_input(key="text_field").set_value("body").run()
    assert not at.error and any("6 document(s)" in c.value for c in at.caption)
    kept = list((runs.default_root() / "text-uploads").glob("*/upload.jsonl"))
    assert len(kept) == 1 and kept[0].read_bytes() == (data / "lines.jsonl").read_bytes()
    at.get("file_uploader")[0].set_value(("bad.txt", b"w1 \xff\xfe w2", "text/plain")).run()
    assert not any(t.key == "text_field" for t in at.text_input)  # a .txt file: no field asked for
    assert "not UTF-8 text" in at.error[0].value and at.button(key="retrain_start").proto.disabled is True


def test_a_held_out_text_of_its_own(data):
    """Held out: another text (the CLI's --eval-text) picked in the data folder; perplexity is
    measured on it and the run records it; one too short for a block is refused before Start."""
    (data / "short.txt").write_text("w1 w2 w3")  # 3 words and the end of text: 4 tokens
    at = open_page(PAGE, "tiny-llama")
    at.radio(key="text_from").set_value("data").run()
    assert at.radio(key="text_held").options == ["the last 10% of the text", "an upload", "the data folder"]
    at.selectbox(key="text_data").set_value("books/a.txt")
    at.radio(key="text_held").set_value("data").run()
    at.selectbox(key="eval_data").set_value("short.txt")
    at.number_input(key="text_block").set_value(8).run()
    assert "the held-out text has 4 tokens, fewer than one block of 9 (8 tokens + 1)" in at.error[0].value
    assert at.button(key="retrain_start").proto.disabled is True
    assert not any(t.key == "text_field" for t in at.text_input)  # plain text has no fields to name
    at.selectbox(key="eval_data").set_value("lines.jsonl").run()
    assert "no field 'text'" in at.error[0].value
    at.text_input(key="text_field").set_value("body")
    at.number_input(key="retrain_steps").set_value(2)
    at.run()
    assert not at.error and not at.exception
    held = sum(len(make_text(s, 10).split()) + 1 for s in range(6))  # its words and an end of text per line
    assert any(f"{held:,} tokens held out for perplexity (another text)" in c.value for c in at.caption)
    at.button(key="retrain_start").click().run()
    assert not at.exception and not at.error
    poll(at, lambda a: a.session_state["retrain_job"].snapshot().done)
    stored = runs.RunStore().get(at.session_state["retrain_job"].snapshot().run_id)
    assert stored["config"]["eval_text"] == str(data / "lines.jsonl")
    assert stored["card"]["text"]["held_out"] == "eval-text" and stored["card"]["text"]["held_out_tokens"] == held


def test_an_imported_model_without_a_tokenizer_cannot_be_retrained(data):
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params["model"] = "no-tokenizer"
    at.run()
    assert not at.exception and "needs its tokenizer.json" in at.warning[0].value
