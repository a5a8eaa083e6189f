"""Without a data folder ($ATTN_LAB_DATA unset) the Retrain page asks for an upload only: it said
"or pick one in the data folder" of a folder nobody set (issue 37, item 10)."""

from pathlib import Path

import pytest
from dashboard_helpers import open_page

from tests.conftest import write_tiny_hf
from tests.text_corpus import write_word_tokenizer

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "3_Retrain.py")


@pytest.fixture
def models(tmp_path, monkeypatch):
    write_tiny_hf(tmp_path / "tiny-llama", "llama", num_key_value_heads=2)
    write_word_tokenizer(tmp_path / "tiny-llama")
    monkeypatch.setenv("ATTN_LAB_MODELS", str(tmp_path))
    monkeypatch.delenv("ATTN_LAB_DATA", raising=False)
    return tmp_path


def test_no_data_folder_is_offered_when_none_is_set(models):
    at = open_page(PAGE, "tiny-llama")
    assert not at.exception
    said = [i.value for i in at.info]
    assert "Upload a text to retrain on." in said, said
    assert not any("data folder" in s for s in said), said
