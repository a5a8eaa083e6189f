"""Text on the Heatmaps page of a model with a tokenizer (the shipped text-8k): a multi-line box
keeps the line breaks (the tokens are the tokenizer's of the whole text), an uploaded file gives
its first tokens, cut to what an input may have, and past LONG_INPUT tokens the long view
shows; a file that is not text is one line."""

from __future__ import annotations

from dashboard_helpers import open_page

from attn_core import bilinear
from attn_core.bilinear import blocked
from attn_core.sources import resolve
from attn_core.text.bundled import CORPUS
from tests.app.test_page_heatmaps import PAGE

MODEL = "text-8k"
LINES = "def f(x):\n    return x\n\n\nclass A:\n    pass\n"


def typed(at):
    at.radio(key="input").set_value("typed").run()
    assert not at.exception and not at.error
    return at


def test_a_multi_line_text_keeps_its_line_breaks():
    at = typed(open_page(PAGE, MODEL))
    at.text_area(key="typed_text").set_value(LINES).run()
    assert not at.exception and not at.error
    want = bilinear.encode(resolve(MODEL), LINES)
    flat = bilinear.encode(resolve(MODEL), " ".join(LINES.split()))
    assert len(want) != len(flat)  # the line breaks are tokens of their own
    query = at.select_slider(key="query")
    assert len(query.options) == len(want) and query.value == len(want) - 1


def test_an_uploaded_file_gives_its_first_tokens_in_the_long_view():
    at = typed(open_page(PAGE, MODEL, timeout=300))
    at.radio(key="heatmap_text_from").set_value("file").run()
    assert not at.exception and not at.error and at.info  # asks for a file
    at.get("file_uploader")[0].set_value(("manual.txt", CORPUS.read_bytes(), "text/plain")).run()
    assert not at.exception and not at.error
    loaded = resolve(MODEL)
    n = min(blocked.longest_input(loaded.model), loaded.config.n_ctx)
    assert n == 8192
    assert any("its first 8,192 are the input" in c.value for c in at.caption)
    assert any(f"{n} tokens (more than {blocked.LONG_INPUT})" in i.value for i in at.info)
    assert len(at.select_slider(key="query").options) == n


def test_a_file_that_is_not_text_is_one_line():
    at = typed(open_page(PAGE, MODEL))
    at.radio(key="heatmap_text_from").set_value("file").run()
    at.get("file_uploader")[0].set_value(("notes.txt", b"w1 \xff\xfe w2", "text/plain")).run()
    assert not at.exception
    assert len(at.error) == 1 and "This input does not work" in at.error[0].value
