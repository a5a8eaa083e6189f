"""attn-lab's dashboard: the router. Every page, with its sidebar title, URL and icon, is a row of
the page table in navigation.py; the home page is app_pages/0_Home.py. Run with `streamlit run app.py`.

The page files are in app_pages/, never pages/: Streamlit takes a pages/ folder beside this file
for a legacy multipage app until st.navigation has run once in the server, so a page's URL opened
first on a fresh server ran that file alone, with another sidebar (tests/e2e/test_deep_link_browser.py)."""

import streamlit as st

from navigation import ICON, PAGES
from ui.access import gate

st.set_page_config(page_title="attn-lab", page_icon=str(ICON), layout="wide")  # a local icon: nothing fetched
gate()  # shared mode (ATTN_LAB_SHARED=1): nothing below until the person is logged in; ui/access.py
st.navigation(
    [st.Page(p.file, title=p.title, icon=p.icon, url_path=p.url_path or None, default=p.default) for p in PAGES],
    expanded=True,  # every page listed: past twelve pages Streamlit would fold them into "View X more"
).run()
