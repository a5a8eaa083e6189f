"""The dashboard introduces itself: every page of the page table has a one-line intro, shown under
its title with a link to its section of the manual, and the home page shows each other page with
its intro and a small picture of it (docs/images, made by scripts/screenshots.py)."""

from pathlib import Path

from streamlit.testing.v1 import AppTest

import navigation

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")


def test_every_page_has_an_intro_and_a_section_of_the_manual():
    for entry in navigation.PAGES:
        assert entry.intro and "\n" not in entry.intro, entry.title
        assert entry.manual.endswith(f"/dashboard.html#{entry.anchor}")
    assert len({p.anchor for p in navigation.PAGES}) == len(navigation.PAGES)


def test_a_page_shows_its_intro_and_links_to_the_manual():
    at = AppTest.from_file(APP, default_timeout=90).run()
    at.switch_page("app_pages/7_Attention_explorer.py").run()
    entry = navigation.page("Attention explorer")
    assert not at.exception
    assert at.markdown[0].value == f"{entry.intro} [More in the manual]({entry.manual})"


def test_the_home_page_shows_every_page_with_its_intro_and_picture():
    at = AppTest.from_file(APP, default_timeout=90).run()
    assert not at.exception
    captions = [c.value for c in at.main.caption]
    for entry in navigation.PAGES[1:]:
        assert entry.intro in captions, entry.title
    assert len(at.get("image")) == len(navigation.PAGES) - 1
