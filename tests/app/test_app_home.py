from pathlib import Path

from streamlit.testing.v1 import AppTest

from attn_core import zoo

APP = Path(__file__).resolve().parents[2] / "app.py"


def test_home_lists_the_zoo_with_measured_accuracies():
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    assert not at.exception
    table = at.dataframe[0].value
    models = zoo.list_models()
    assert sorted(table["name"]) == sorted(m["name"] for m in models)
    for m in models:
        assert table.set_index("name").loc[m["name"], "accuracy"] == m["accuracy"]
    assert at.sidebar.selectbox[0].options == [m["name"] for m in models]


def test_model_choice_and_bad_url_param():
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["model"] = "not-a-model"
    at.run()
    assert not at.exception
    assert any("unknown" in w.value for w in at.sidebar.warning)
    names = at.sidebar.selectbox[0].options
    at.sidebar.selectbox[0].select(names[-1]).run()
    assert at.session_state["model_choice"] == names[-1]
