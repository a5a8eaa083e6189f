"""AppTest of the Spectrum page's two ranks: the chart shows the library's ranks of B and of the
centred scores on the model's task samples; an imported model is probed with an uploaded text."""

from pathlib import Path

import pytest
from dashboard_helpers import chart, open_page, values

from attn_core.sources import resolve
from attn_core.text.probes import measure_ranks

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "2_Spectrum.py")


def test_the_two_ranks_on_task_samples():
    page = open_page(PAGE, "sort-2l-mlp")
    bars = {(t["name"], t.get("yaxis", "y")): values(t["y"]).tolist() for t in chart(page, "two_ranks")["data"]}
    ref = measure_ranks(resolve("sort-2l-mlp"))
    assert bars[("B", "y")] == ref.weight_rank.flatten().tolist()
    assert bars[("scores S_c", "y")] == pytest.approx(ref.data_rank.flatten().tolist(), rel=1e-5)
    assert bars[("scores S_c", "y2")] == pytest.approx(ref.data_stable_rank.flatten().tolist(), rel=1e-5)
    gap = next(m for m in page.metric if m.label == "mean gap (B / S_c)")
    assert gap.value == f"{float(ref.weight_rank.double().mean() / ref.data_rank.mean()):.2f}×"
    curves = {t["name"] for t in chart(page, "rank_variance")["data"]}
    assert curves == {"B", "scores S_c"}

    page.slider(key="rank_variance").set_value(0.6).run()
    assert not page.exception
    lower = {t["name"]: values(t["y"]).tolist() for t in chart(page, "two_ranks")["data"] if t.get("yaxis", "y") == "y"}
    assert lower["B"] == measure_ranks(resolve("sort-2l-mlp"), frac=0.6).weight_rank.flatten().tolist()


def test_an_imported_model_needs_a_text(tiny_gpt2):
    from tests.text_corpus import write_word_tokenizer

    page = open_page(PAGE, "gpt2-tiny")  # a GPT-2 folder without tokenizer.json: nothing to probe
    assert any("no task and no tokenizer.json" in i.value for i in page.info)
    write_word_tokenizer(tiny_gpt2)
    page = open_page(PAGE, "gpt2-tiny")
    assert page.radio(key="spectrum_probes").options == ["a text"]
    assert any("Upload a text" in i.value for i in page.info)
