"""A page's start: its config, its remembered widget state, its title and, when it needs one,
the shared model picker."""

from __future__ import annotations

import streamlit as st

from attn_core.sources import LoadedModel
from navigation import ICON
from ui.models import model_picker
from ui.state import keep_widget_state


def setup(title: str, needs_model: bool = True) -> LoadedModel | None:
    """Page config, remembered widget state, title and, when the page needs one, the shared
    model picker."""
    st.set_page_config(page_title=f"{title} · attn-lab", page_icon=str(ICON), layout="wide")
    keep_widget_state(title)
    st.title(title)
    return model_picker() if needs_model else None
