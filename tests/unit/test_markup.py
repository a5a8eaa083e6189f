"""Untrusted text in Streamlit markdown (ui/markup.py): ``unlinked`` keeps e-mail addresses and web
addresses text (GitHub-flavoured markdown would link them by themselves; an escape does not stop
it, a word joiner does: checked in Chromium by tests/e2e/test_shared_login_browser.py)."""

import pytest

from ui.markup import WORD_JOINER, plain, unlinked


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("alice@lab.example", "alice@\u2060lab.example"),
        ("see https://x.org", "see https:\u2060//x.org"),
        ("www.lab.example", "www\u2060.lab.example"),
        ("Alice *Smith*", "Alice \\*Smith\\*"),
    ],
)
def test_unlinked_text_reads_the_same_and_is_never_a_link(text, shown):
    assert unlinked(text) == shown
    assert unlinked(text).replace(WORD_JOINER, "") == plain(text)  # what a person reads is unchanged
