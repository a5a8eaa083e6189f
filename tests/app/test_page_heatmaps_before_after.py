"""AppTest of the Heatmaps page's before/after view: a run retrained on text from a tiny imported
Llama-family folder shows the same head of its parent and of itself on one typed sentence, side
by side; each heatmap is that model's own attention on those tokens."""

from pathlib import Path

import pytest
import torch
from dashboard_helpers import chart, open_page, z_matrix

from attn_core.hooks import act_name
from attn_core.retraining.job import TrainingJob
from attn_core.sources import resolve
from attn_core.training.config import JobConfig
from tests.conftest import write_tiny_hf
from tests.text_corpus import make_text, write_word_tokenizer

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "app_pages" / "1_Heatmaps.py")
SENTENCE = "w5 w6 w7 w8 w5 w6 w7"


@pytest.fixture
def run_id(tmp_path, monkeypatch):
    folder = tmp_path / "models" / "tiny-llama"
    write_tiny_hf(folder, "llama", num_key_value_heads=2)
    write_word_tokenizer(folder)
    (tmp_path / "t.txt").write_text(make_text(0, 100))
    monkeypatch.setenv("ATTN_LAB_MODELS", str(tmp_path / "models"))
    cfg = JobConfig(source=str(folder), text=str(tmp_path / "t.txt"), block=12, steps=5, lr=0.05, batch_size=8)
    res = TrainingJob.open(cfg).run()
    assert res["status"] == "completed"
    return res["run_id"]


def test_the_same_head_before_and_after_on_a_typed_sentence(run_id):
    at = open_page(PAGE, f"run:{run_id}")
    at.radio(key="input").set_value("typed").run()
    at.text_area(key="typed_text").input(SENTENCE).run()
    at.selectbox(key="layer").set_value(1).run()
    at.toggle(key="before_after").set_value(True).run()
    assert not at.exception and not at.error
    before, after = chart(at, "before"), chart(at, "after")
    assert before["layout"]["title"]["text"].startswith("before (tiny-llama): pattern A, layer 1 head")
    assert after["layout"]["title"]["text"].startswith(f"after (run:{run_id})")
    tokens = torch.tensor([[5, 6, 7, 8, 5, 6, 7]])
    head = at.selectbox(key="head").value
    for fig, source in ((before, resolve(f"run:{run_id}").card.parent), (after, f"run:{run_id}")):
        with torch.no_grad():
            _, cache = resolve(source).model.run_with_cache(tokens)
        want = cache[act_name("pattern", 1)][0, head]
        got = z_matrix(fig)
        assert torch.allclose(torch.nan_to_num(got), want, atol=1e-5)
    assert not torch.allclose(torch.nan_to_num(z_matrix(before)), torch.nan_to_num(z_matrix(after)), atol=1e-4)
    assert sum("normalized entropy" in c.value for c in at.caption) == 2
    at.radio(key="before_after_value").set_value("scores").run()
    zb, za = chart(at, "before")["data"][0], chart(at, "after")["data"][0]
    assert zb["zmin"] == za["zmin"] == -zb["zmax"] and za["zmax"] == zb["zmax"]  # one colour scale


def test_a_zoo_model_has_no_before_and_after(tmp_path):
    at = open_page(PAGE, "induction-2l")
    assert not any(t.key == "before_after" for t in at.toggle)
