"""The Heatmaps page's state follows its input: new typed tokens, another length or another
model move the query to the last token (another seed of the same length keeps it), the URL describes the input shown
(no stale `length` of a random input once tokens are typed), and a page switch keeps a query
the user chose."""

from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "app_pages" / "1_Heatmaps.py")
MODEL = "induction-2l"


def open_page(**params) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params.update({"model": MODEL, **params})
    at.run()
    assert not at.exception and not at.error
    return at


def test_typed_tokens_move_the_query_to_the_last_token_and_the_url_follows():
    at = open_page(input="random", length="24", query="7")
    assert at.select_slider(key="query").value == 7  # the link's query, on the first run
    at.radio(key="input").set_value("typed").run()
    at.text_input(key="typed").input("a b c d e f g h i").run()  # 9 tokens
    assert not at.exception and not at.error
    assert at.select_slider(key="query").value == 8
    assert at.query_params["query"] == "8" and at.query_params["input"] == "typed"
    assert "length" not in at.query_params and "seed" not in at.query_params
    at.text_input(key="typed").input("a b c").run()
    assert at.select_slider(key="query").value == 2


def test_a_new_length_moves_the_query_a_head_or_seed_change_does_not():
    at = open_page(input="random", length="20")
    at.select_slider(key="query").set_value(5).run()
    at.selectbox(key="head").set_value(2).run()
    assert at.select_slider(key="query").value == 5  # same input: the user's query stays
    at.number_input(key="random_length").set_value(12).run()
    assert at.select_slider(key="query").value == 11
    assert at.query_params["length"] == "12" and at.query_params["query"] == "11"
    at.select_slider(key="query").set_value(3).run()
    at.number_input(key="input_seed").set_value(4).run()  # another sample of the same length: the same position
    assert at.select_slider(key="query").value == 3 and at.query_params["seed"] == "4"


def test_a_query_survives_a_page_switch():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=90)
    at.query_params["model"] = MODEL
    at.switch_page("app_pages/1_Heatmaps.py").run()
    at.select_slider(key="query").set_value(4).run()
    at.switch_page("app_pages/2_Spectrum.py").run()
    at.switch_page("app_pages/1_Heatmaps.py").run()
    assert not at.exception
    assert at.select_slider(key="query").value == 4
