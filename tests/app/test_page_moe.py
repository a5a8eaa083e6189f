"""The dashboard's model pages on a mixture-of-experts folder (a tiny Mixtral and a tiny gpt-oss made by transformers
here, listed through ATTN_LAB_MODELS): each renders without an exception or an error; the pages that
need a task say that an imported model has none."""

from pathlib import Path

import pytest
from dashboard_helpers import open_page

pytest.importorskip("transformers")

from tests.unit.test_hf_new_families import write_family  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["1_Heatmaps.py", "2_Spectrum.py", "7_Attention_explorer.py", "9_Circuits.py", "12_Edit_and_compare.py"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-models")
    write_family(root / "tiny-mixtral", "mixtral")
    write_family(root / "tiny-gpt-oss", "gpt_oss")  # learned sinks, biases, YaRN, experts with biases
    return root


@pytest.fixture
def env(models, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_MODELS", str(models))


@pytest.mark.parametrize("model", ["tiny-mixtral", "tiny-gpt-oss"])
@pytest.mark.parametrize("page", PAGES)
def test_each_model_page_renders_on_a_mixture_of_experts(env, page, model):
    at = open_page(str(ROOT / "app_pages" / page), model)
    assert at.query_params["model"] == model and not at.warning, [w.value for w in at.warning]  # that model, read


@pytest.mark.parametrize("page", ["3_Retrain.py", "5_Grow_d_k.py"])
def test_pages_that_need_a_task_say_so(env, page):
    at = open_page(str(ROOT / "app_pages" / page), "tiny-mixtral")
    assert any("has no known task" in w.value for w in at.warning)
