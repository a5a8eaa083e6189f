"""The Heatmaps page's first heatmaps before the rest of it: on a session's first visit in a
browser, the page sends its first heatmaps alone and the rest (the query's row, concentration,
vocabulary and positional views, export) once the browser has drawn them, so that plotly.js on a
busy machine draws the first heatmap without the page's later figures ahead of it. Any later run
of the page draws everything at once."""

from __future__ import annotations

import streamlit as st

SHOWN = "_heatmaps_rest_shown"  # session state: the session has been sent the whole page once
PENDING = "page_rest_pending"  # the container of the line and the signal (class st-key-page_rest_pending)
WAIT_MS = 15_000  # the rest follows after this long even if no heatmap shows up

# Tells the server once a heatmap is drawn on the page (or after WAIT_MS), one frame after it is painted.
_JS = f"""
export default function ({{ setTriggerValue }}) {{
    const start = performance.now();
    let done = false;
    const send = () => {{
        if (done) return;
        done = true;
        requestAnimationFrame(() => setTimeout(() => setTriggerValue("drawn", true), 0));
    }};
    const timer = setInterval(() => {{
        if (document.querySelector(".js-plotly-plot .heatmaplayer") || performance.now() - start > {WAIT_MS}) {{
            clearInterval(timer);
            send();
        }}
    }}, 50);
    return () => clearInterval(timer);
}}
"""
_signal = st.components.v2.component("attn_lab.heatmaps_drawn", js=_JS)


def in_browser() -> bool:
    """Whether a browser is on the other end (a script run without one, e.g. a test, has no URL)."""
    return st.context.url is not None


def waiting() -> bool:
    """True when the rest of the page waits for the browser to draw the heatmaps above: the
    session's first run of the page in a browser. It then draws a line saying what follows and
    the signal that reruns the page's head views once the heatmaps are drawn; the next run of any
    kind draws everything."""
    if st.session_state.get(SHOWN) or not in_browser():
        st.session_state[SHOWN] = True
        return False
    st.session_state[SHOWN] = True
    with st.container(key=PENDING):
        st.caption("The query's row, the concentration table and the vocabulary and positional views follow…")
        _signal(key="heatmaps_drawn", on_drawn_change=lambda: None)
    return True
