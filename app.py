"""attn-lab's dashboard: the router. Every page, with its sidebar title, URL and icon, is a row of
the page table in navigation.py; the home page is pages/0_Home.py. Run with `streamlit run app.py`."""

import streamlit as st

from navigation import ICON, PAGES

st.set_page_config(page_title="attn-lab", page_icon=str(ICON), layout="wide")  # a local icon: nothing fetched
st.navigation(
    [st.Page(p.file, title=p.title, icon=p.icon, url_path=p.url_path or None, default=p.default) for p in PAGES]
).run()
