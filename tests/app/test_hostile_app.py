"""Hostile input to the dashboard (issue 12): two browser sessions uploading the same weights with
different cards, broken model folders in ATTN_LAB_MODELS, and card text that would be markdown
(a remote image). Each session sees its own card, nothing is overwritten, the pages never fail,
and card text is shown as plain text."""

import json
import re
from pathlib import Path

from streamlit.testing.v1 import AppTest

import ui
from attn_core import checkpoint, sources
from attn_core.sources import resolve

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
IMAGE = "![tracker](https://example.com/pixel.png)"


def model_files(card: dict) -> dict[str, bytes]:
    folder = ROOT / "assets" / "models" / "reverse-1l"
    files = {f: (folder / f).read_bytes() for f in (checkpoint.WEIGHTS, checkpoint.CONFIG)}
    return {**files, checkpoint.CARD: json.dumps(card).encode()}


def upload(at: AppTest, files: dict[str, bytes]) -> str:
    at.sidebar.get("file_uploader")[0].set_value([(n, b, "application/octet-stream") for n, b in files.items()])
    at.run()
    assert not at.exception
    return at.sidebar.selectbox(key=ui.MODEL_KEY).value


def texts(at: AppTest) -> list[str]:
    """Every markdown-rendered text of the page, its sidebar included."""
    kinds = ("markdown", "caption", "warning", "error", "info", "success")
    return [e.value for kind in kinds for e in at.get(kind)]


def test_two_sessions_upload_the_same_weights_with_their_own_cards():
    a = AppTest.from_file(APP, default_timeout=90).run()
    b = AppTest.from_file(APP, default_timeout=90).run()
    card_a = {"task": "reverse", "parent": "parent-of-A", "description": "card A"}
    card_b = {"task": "reverse", "parent": "parent-of-B", "description": "card B"}
    choice_a = upload(a, model_files(card_a))
    choice_b = upload(b, model_files(card_b))
    assert choice_a != choice_b and {choice_a, choice_b} <= set(b.sidebar.selectbox(key=ui.MODEL_KEY).options)
    assert resolve(choice_a).card.parent == "parent-of-A" and resolve(choice_b).card.parent == "parent-of-B"
    a.run()  # session A, after B's upload, still shows its own card
    assert any("parent-of-A" in c.value for c in a.sidebar.caption)
    assert any("parent-of-B" in c.value for c in b.sidebar.caption)
    assert upload(a, model_files(card_a)) == choice_a  # the same upload again: the same folder
    assert len(list(sources.upload_dir().iterdir())) == 2


def test_an_existing_upload_folder_is_never_overwritten():
    label = ui.save_upload(model_files({"task": "reverse", "description": "first"}))
    folder = sources.upload_dir() / label.removeprefix(sources.UPLOAD_PREFIX)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    # another model that lands on the same name (as a hash collision would): a new folder
    card = json.loads((folder / checkpoint.CARD).read_text())
    (folder / checkpoint.CARD).write_text(json.dumps({**card, "description": "tampered"}))
    before[checkpoint.CARD] = (folder / checkpoint.CARD).read_bytes()
    again = ui.save_upload(model_files({"task": "reverse", "description": "first"}))
    assert again != label and resolve(again).card.description == "first"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_an_uploaded_card_cannot_name_a_vocabulary_file(tmp_path):
    card = {"vocab_file": str(tmp_path / "secret.json")}
    at = AppTest.from_file(APP, default_timeout=90).run()
    upload(at, model_files(card))
    assert "names a vocabulary file" in at.sidebar.error[0].value
    assert not sources.upload_dir().exists() or not any(sources.upload_dir().iterdir())


def test_broken_model_folders_never_take_the_dashboard_down(save_model, tmp_path):
    save_model("fine")
    (save_model("deep") / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    (save_model("task-list") / "card.json").write_text(json.dumps({"task": ["reverse"]}))
    bad_weights = save_model("bad-weights")  # its config and card are fine: the zoo lists it
    (bad_weights / "model.safetensors").write_bytes(b"\x80\x04 not weights")
    at = AppTest.from_file(APP, default_timeout=90).run()
    assert not at.exception
    warned = [w.value for w in at.sidebar.warning]
    assert sum("deep" in w for w in warned) == 1 and sum("task-list" in w for w in warned) == 1
    assert "fine" in at.sidebar.selectbox(key=ui.MODEL_KEY).options
    assert any("bad-weights" in m.value for m in at.markdown)  # Home lists it from its card, loads nothing
    assert not at.error
    at.run()  # the warnings are shown once per session
    assert not at.exception and not any("deep" in w.value for w in at.sidebar.warning)
    at.sidebar.selectbox(key=ui.MODEL_KEY).set_value("bad-weights").run()  # picked: loaded, and it says why
    assert not at.exception and any("pickle" in e.value for e in at.error)


def test_card_text_is_plain_text_never_markdown(save_model):
    save_model("with-image", card={"task": "reverse", "parent": IMAGE, "description": f"see {IMAGE} and **bold** $x$"})
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["model"] = "with-image"
    at.run()
    assert not at.exception
    shown = [t for t in texts(at) if "tracker" in t]
    assert len(shown) >= 2, texts(at)  # Home's description and the sidebar's parent are shown ...
    for t in shown:  # ... every bracket and LaTeX mark escaped: no image, no link, no formula
        assert not re.search(r"(?<!\\)[\[\]$]", t), t
    assert any("\\*\\*bold\\*\\*" in t for t in shown)  # and no emphasis
