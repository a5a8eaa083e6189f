"""A page's start: its config, its remembered widget state, its title and, when it needs one,
the shared model picker."""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

from attn_core.sources import LoadedModel
from navigation import ICON, PAGES, ROOT, PageEntry
from ui.models import model_picker
from ui.state import keep_widget_state


def setup(title: str, needs_model: bool = True) -> LoadedModel | None:
    """Page config, remembered widget state, title, the page's one-line introduction with a link
    to its section of the manual (``intro`` and ``manual`` of its row in navigation.PAGES) and,
    when the page needs one, the shared model picker."""
    st.set_page_config(page_title=f"{title} · attn-lab", page_icon=str(ICON), layout="wide")
    keep_widget_state(title)
    st.title(title)
    if (entry := _entry_of(sys._getframe(1).f_code.co_filename)) is not None and entry.intro:
        st.markdown(f"{entry.intro} [More in the manual]({entry.manual})")
    return model_picker() if needs_model else None


def _entry_of(filename: str) -> PageEntry | None:
    """The page table's row of the page file ``filename`` (None for a script that is not a page)."""
    path = Path(filename).resolve()
    return next((p for p in PAGES if (ROOT / p.file).resolve() == path), None)
