"""Untrusted text made safe for Streamlit markdown: ``plain`` (markup escaped, one line, bounded),
``unlinked`` (the same, and never a link) and ``code`` (a path or name as inline code)."""

from __future__ import annotations

import re

# what makes markdown out of text: emphasis, code, links and images ([...]), HTML, headings, LaTeX
_MARKDOWN = re.compile(r"([\\`*_\[\]<>#$~])")
_LINKED = re.compile(r"(@|:|\bwww(?=\\?\.))", re.IGNORECASE)  # what starts an address markdown links
WORD_JOINER = "\u2060"


def plain(text: object, limit: int = 500) -> str:
    """Card text (names, descriptions, a parent) made inert for Streamlit markdown: the markup
    characters escaped, one line, at most ``limit`` characters. A card is untrusted:
    shown as markdown, ``![x](http://...)`` would load a remote image in the viewer's browser."""
    line = " ".join(str(text).split())
    if len(line) > limit:
        line = line[:limit] + "…"
    return _MARKDOWN.sub(r"\\\1", line)


def unlinked(text: object, limit: int = 500) -> str:
    """:func:`plain` text that Streamlit's markdown never makes a link (GitHub-flavoured markdown
    links an e-mail address, ``www.`` and ``http://`` by themselves; an escape does not stop it):
    an invisible word joiner after each ``@``, ``www`` and ``:`` keeps them text."""
    return _LINKED.sub("\\1" + WORD_JOINER, plain(text, limit))


def code(text: object) -> str:
    """A path or name as inline code (shown literally; a backtick in it cannot end the span)."""
    return "`" + " ".join(str(text).split()).replace("`", "'") + "`"
