"""A page's URL opened first on a freshly started server gets the router's sidebar (issue 37,
item 4). Streamlit treats a folder named ``pages/`` beside the entry script as a legacy
multipage app until the router (app.py's ``st.navigation``) has run once: a deep link opened
before anyone opened the root URL ran the page file directly, with a sidebar of its own (an
extra "app" entry, no icons, "Grow d k"). The page files live in ``app_pages/``, so the router is
the only one from the first request on."""

import os
from pathlib import Path

import pytest

from benchmarks.dashboard import CHROMIUM, VIEWPORT, launch, new_page, serve
from navigation import PAGES

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
]
ROOT = Path(os.environ.get("ATTN_LAB_CHECKOUT", Path(__file__).resolve().parents[2]))  # another checkout: compare


@pytest.fixture
def fresh_server(tmp_path):
    with serve(tmp_path / "data", root=ROOT) as url:
        yield url


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        context = browser.new_context(viewport=VIEWPORT)
        context.set_default_timeout(120_000)
        yield new_page(context)
        browser.close()


def test_a_deep_link_first_on_a_fresh_server_gets_the_routers_sidebar(page, fresh_server):
    page.goto(f"{fresh_server}/Heatmaps?model=induction-2l")
    nav = page.locator("[data-testid='stSidebarNav']")
    nav.wait_for()
    more = nav.locator("[data-testid='stSidebarNavViewButton']")
    if more.count() and "more" in more.inner_text().lower():
        more.click()  # the router's sidebar may fold a long list too: unfold it to read every entry
    page.wait_for_function(
        "n => document.querySelectorAll('[data-testid=\"stSidebarNavLink\"]').length >= n", arg=len(PAGES)
    )
    links = nav.locator("[data-testid='stSidebarNavLink']")
    labels = [t.strip() for t in links.all_inner_texts()]
    labels = [label.split("\n")[-1].strip() for label in labels]  # an icon's ligature name comes first
    assert labels == [p.title for p in PAGES], labels  # no "app" entry, "Grow d_k" with its underscore
    icons = links.locator("[data-testid='stIconMaterial']")
    assert icons.count() == len(PAGES)  # every entry with its icon
    assert page.url.split("?")[0].endswith("/Heatmaps")
