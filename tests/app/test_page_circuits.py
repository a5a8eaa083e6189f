"""AppTest of app_pages/9_Circuits.py: it renders on a factored and a merged model; the copying
scores it shows are the library's; the layer/head picker moves the full OV circuit; a big
vocabulary is capped with a note; every figure can be exported."""

import io
import json
import zipfile
from pathlib import Path

import pytest
import torch
from dashboard_helpers import chart, open_page, values, z_matrix

import ui
from attn_core import circuits
from attn_core.figures import bundle_zip
from attn_core.sources import resolve

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "9_Circuits.py")
CHARTS = ["ov_spectrum", "composition", "composition_corrected", "head_graph", "positivity", "ov_circuit"]


@pytest.mark.parametrize("model", ["induction-2l", "recall-2l-merged"])
def test_renders_and_shows_the_librarys_copying_scores(model):
    at = open_page(PAGE, model)
    assert not at.warning
    for key in CHARTS:
        chart(at, key)
    assert len(at.download_button) == 4 * len(CHARTS) + 2  # PNG/SVG/HTML/CSV each, the table's CSV, the zip
    loaded = resolve(model)
    table = at.dataframe[0].value
    expected = circuits.copying_scores(loaded.model)  # [L, H]
    shown = torch.tensor(
        [
            [
                float(table[(table["label"] == f"L{l}H{h}")]["copying_score"].iloc[0])
                for h in range(loaded.config.n_heads)
            ]
            for l in range(loaded.config.n_layers)
        ]
    )
    torch.testing.assert_close(shown, expected.float(), atol=1e-6, rtol=0)
    qk = circuits.qk_positivities(loaded.model)
    torch.testing.assert_close(
        torch.tensor(table["qk_positivity"].to_numpy()).float(), qk.flatten().float(), atol=1e-6, rtol=0
    )
    # the scatter puts each head at (QK positivity, copying score)
    points = {t["name"]: t for t in chart(at, "positivity")["data"] if t["name"].startswith("layer")}
    torch.testing.assert_close(values(points["layer 1"]["x"]), qk[1].float(), atol=1e-6, rtol=0)
    torch.testing.assert_close(values(points["layer 1"]["y"]), expected[1].float(), atol=1e-6, rtol=0)
    # composition heatmaps: raw in [0, 1], corrected = raw - baseline (the writer L0H? -> reader L1H? block)
    comp = circuits.composition(loaded.model)
    H = loaded.config.n_heads
    raw = z_matrix(chart(at, "composition"), trace=1)  # K-composition, writers x readers
    torch.testing.assert_close(raw, comp.scores["k"][:H, H:].float(), atol=1e-5, rtol=0)
    corrected = z_matrix(chart(at, "composition_corrected"), trace=1)
    torch.testing.assert_close(corrected, comp.corrected("k")[:H, H:].float(), atol=1e-5, rtol=0)


def test_the_head_picker_moves_the_full_ov_circuit():
    at = open_page(PAGE, "induction-2l")
    assert "layer 0 head 0" in chart(at, "ov_circuit")["layout"]["title"]["text"]
    at.selectbox(key="layer").select(1)
    at.selectbox(key="head").select(2)
    at.run()
    assert not at.exception and not at.error
    fig = chart(at, "ov_circuit")
    assert "layer 1 head 2" in fig["layout"]["title"]["text"]
    model = resolve("induction-2l").model
    torch.testing.assert_close(z_matrix(fig), circuits.full_ov_circuit(model, 1, 2), atol=1e-5, rtol=1e-5)
    score = float(circuits.copying_scores(model)[1, 2])
    assert f"copying score {score:.3f}" in fig["layout"]["title"]["text"]
    assert at.query_params["layer"] == "1" and at.query_params["head"] == "2"


def test_a_big_vocabulary_is_capped_with_a_note_and_one_layer_has_no_composition(save_model):
    save_model("wide-vocab", card={}, d_vocab=300, n_ctx=8)
    at = open_page(PAGE, "wide-vocab")
    z = z_matrix(chart(at, "ov_circuit"))
    assert z.shape == (64, 64)
    assert any("300 tokens" in c.value and "first 64" in c.value for c in at.caption)
    assert any("no composition" in i.value for i in at.info)
    torch.testing.assert_close(
        z, circuits.full_ov_circuit(resolve("wide-vocab").model, 0, 0, list(range(64))), atol=1e-5, rtol=1e-5
    )


def test_export_all_gets_every_figure(monkeypatch):
    calls = []
    monkeypatch.setattr(ui, "export_all", lambda plots, manifest, key: calls.append((plots, manifest, key)))
    open_page(PAGE, "induction-2l")
    ((plots, manifest, key),) = calls
    assert key == "circuits"
    assert [p.name for p in plots] == [
        "ov_spectrum",
        "composition",
        "composition_corrected",
        "head_graph",
        "positivity",
        "ov_circuit_L0H0",
    ]
    blob = bundle_zip(plots, manifest, formats=("csv",))
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        saved = json.loads(zf.read("manifest.json"))
        names = set(zf.namelist())
    assert {f"{p.name}.csv" for p in plots} <= names
    assert saved["model"] == "induction-2l" and saved["layer"] == 0 and saved["head"] == 0
    assert len(saved["heads"]) == 8 and saved["heads"][0]["writer"] is None
