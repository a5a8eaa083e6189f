"""Store paths in the page's words (issue 37, item 9): a model retrained from an uploaded model
says "Retrained from upload: <name>" in the sidebar (the path in its tooltip), a live chart's
title and a shown command name the upload, not ``/tmp/.../runs/uploads/...``; an uploaded text
is named as it was uploaded, its kept path in the tooltip."""

from pathlib import Path

import pytest
from dashboard_helpers import open_page

from attn_core import checkpoint, sources
from attn_core.training.config import JobConfig
from tests.conftest import make_tiny_model

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "2_Spectrum.py")


def test_an_upload_folder_is_named_as_the_picker_names_it():
    folder = sources.upload_dir() / "llama-3f2a"
    assert sources.shown_name(str(folder)) == "upload: llama-3f2a"
    assert sources.shown_name("induction-2l") == "induction-2l" and sources.shown_name(None) is None
    assert sources.shown_name("/elsewhere/uploads/x") == "/elsewhere/uploads/x"  # not the store's uploads


def test_a_shown_command_names_the_uploads():
    model = str(sources.upload_dir() / "llama-3f2a")
    text = "/data/runs/text-uploads/0123abcd/upload.txt"
    cfg = JobConfig(model, steps=5, text=text)
    shown = cfg.command({model: "upload: llama-3f2a", text: "corpus.txt"})
    assert "attn-lab retrain 'upload: llama-3f2a'" in shown and "--text corpus.txt" in shown
    assert "text-uploads" not in shown and "/" not in shown.split("--text")[1].split()[0]
    assert text in cfg.command()  # the tooltip's command keeps the paths


@pytest.fixture
def retrained_from_an_upload(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_MODELS", str(tmp_path / "models"))
    parent = str(sources.upload_dir() / "llama-3f2a")
    checkpoint.save(make_tiny_model(), tmp_path / "models" / "child", {"task": "reverse", "parent": parent})
    return parent


def test_the_sidebar_names_the_upload_a_model_was_retrained_from(retrained_from_an_upload):
    at = open_page(PAGE, "child")
    said = [c for c in at.sidebar.caption if "Retrained from" in c.value]
    assert said and "Retrained from upload: llama-3f2a." in said[0].value, [c.value for c in at.sidebar.caption]
    assert str(sources.upload_dir()) not in said[0].value
    assert retrained_from_an_upload in said[0].proto.help  # the path, in the tooltip
