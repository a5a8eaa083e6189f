"""AppTest of app_pages/12_Edit_and_compare.py: a rank slider move shows the library's loss and the
edited head's attention beside the original; ablation is a button; the edit saves as a run that
opens with the edited weights; the compare tab draws the library's distance matrix with the
matching and links a matched pair to Heatmaps and Spectrum; every figure goes into the zip."""

from pathlib import Path

import torch
from dashboard_helpers import chart, open_page, z_matrix

import ui
from attn_core import surgery
from attn_core.sources import resolve

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "12_Edit_and_compare.py")


def test_a_rank_slider_move_shows_the_librarys_loss_and_pattern():
    at = open_page(PAGE, "induction-2l")
    at.selectbox(key="layer").select(1)
    at.run()
    at.slider(key="edit_rank_1_0").set_value(1)
    at.run()
    assert not at.exception and not at.error
    loaded = resolve("induction-2l")
    inputs = surgery.edit_inputs(loaded, samples=16)
    ref = surgery.edit_preview(loaded, [surgery.HeadEdit(1, 0, rank=1)], inputs, 1, 0)
    loss = [m for m in at.metric if m.label == "Loss (nats)"][0]
    assert loss.value == f"{ref.loss:.4g}"
    fig = chart(at, "edit_pattern")
    torch.testing.assert_close(z_matrix(fig, trace=1), ref.pattern, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        z_matrix(fig, trace=0), surgery.head_pattern(loaded.model, inputs.tokens[0], 1, 0), atol=1e-5, rtol=0
    )
    modes = z = chart(at, "edit_modes")["data"][1]["y"]
    assert modes is z and len(chart(at, "edit_modes")["data"][0]["x"]) == 16


def test_ablate_then_save_as_a_run():
    at = open_page(PAGE, "induction-2l")
    [b for b in at.button if b.label == "Ablate (zero)"][0].click()
    at.run()
    assert not at.exception and not at.error
    assert any("zero" in c.value for c in at.caption)
    [b for b in at.button if b.label == "Save the edited model as a run"][0].click()
    at.run()
    assert not at.exception and not at.error
    saved = [s.value for s in at.success][0]
    run = saved.split("run:")[1].split(" ")[0]
    back = resolve(f"run:{run}")
    assert float(back.model.blocks[0].attn.W_O[0].detach().abs().max()) == 0.0
    assert back.card.parent == "induction-2l" and back.card.details["job"]["kind"] == "edit"


def test_compare_tab_draws_the_librarys_matrix_and_links_the_pair(monkeypatch):
    calls = []
    monkeypatch.setattr(ui, "export_all", lambda plots, manifest, key: calls.append(([p.name for p in plots], key)))
    at = open_page(PAGE, "induction-2l")
    at.selectbox(key="compare_with").select("induction-2l")  # the model against itself: distance 0 on the pairs
    at.run()
    fig = chart(at, "diff_0")
    loaded = resolve("induction-2l")
    ref = surgery.diff(loaded, loaded).layers[0].distance
    torch.testing.assert_close(z_matrix(fig), torch.tensor(ref).float(), atol=1e-6, rtol=0)
    assert fig["data"][1]["name"] == "matched"
    links = [m.value for m in at.markdown if "/Heatmaps?" in m.value]
    assert len(links) == 1 and "(/Heatmaps?model=induction-2l&layer=0&head=0)" in links[0]
    assert links[0].count("/Spectrum?model=induction-2l&layer=0&head=") == 2
    assert calls and calls[-1] == (["edit_pattern_L0H0", "edit_modes_L0H0", "diff_L0"], "edit")


def test_a_bad_transplant_is_one_error_and_the_compare_tab_still_draws():
    at = open_page(PAGE, "induction-2l")
    [t for t in at.text_input if t.label == "its head"][0].set_value("L7H0")
    [b for b in at.button if b.label == "Transplant"][0].click()
    at.run()
    assert not at.exception
    assert len(at.error) == 1 and "L7" in at.error[0].value and "out of range" in at.error[0].value
    assert chart(at, "diff_0")["data"][0]["type"] == "heatmap"  # the page went on past the error
    [b for b in at.button if b.label == "Reset ablation / transplant"][0].click()
    at.run()
    assert not at.exception and not at.error


def test_no_edit_shows_no_change_and_the_compare_tab_opens_on_another_model():
    """Without an edit the metrics carry no delta (a red "+0" badge would read as a change); an
    edit that changes the loss shows its change; model B starts as another model of the same
    d_model, not as the model itself."""
    at = open_page(PAGE, "induction-2l")
    assert not at.exception and not at.error
    metrics = {m.label: m for m in at.metric}
    assert not metrics["Loss (nats)"].delta and not metrics["Perplexity (every position)"].delta
    compare = at.selectbox(key="compare_with")
    assert compare.value != "induction-2l" and resolve(compare.value).config.d_model == 64
    assert chart(at, "diff_0")["data"][0]["type"] == "heatmap"
    at.slider(key="edit_rank_0_0").set_value(1)
    at.run()
    assert {m.label: m for m in at.metric}["Loss (nats)"].delta.startswith("+")


def test_ablate_mean_says_why_it_is_off():
    """A model without the attention output bias greys out Ablate (mean) and says why."""
    at = open_page(PAGE, "induction-2l")
    assert not resolve("induction-2l").config.attn_bias
    button = [b for b in at.button if b.label == "Ablate (mean)"][0]
    assert button.disabled and "no attention output bias" in button.help
    assert any("Ablate (mean) is off" in c.value and "output bias" in c.value for c in at.caption)
