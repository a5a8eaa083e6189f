"""AppTest of app_pages/2_Spectrum.py: singular values, eigenvalues, norms and ranks of B checked
against a dense SVD / eigendecomposition of W_Q W_K^T / sqrt(d_head) in the test; one head or
all; head detectors; the zip manifest."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from dashboard_helpers import chart, open_page, values
from streamlit.testing.v1 import AppTest

import ui
from attn_core.sources import resolve

PAGE = str(Path(__file__).resolve().parents[2] / "app_pages" / "2_Spectrum.py")
MODEL = "induction-2l"


def dense_B(layer: int, head: int) -> torch.Tensor:
    attn = resolve(MODEL).model.blocks[layer].attn
    d_head = attn.W_Q.shape[-1]
    return (attn.W_Q[head] @ attn.W_K[head].T).detach().double() / d_head**0.5


@pytest.fixture
def page() -> AppTest:
    return open_page(PAGE, MODEL)


def test_all_heads_match_a_dense_decomposition(page):
    cfg = resolve(MODEL).config
    traces = {t["name"]: t for t in chart(page, "spectrum")["data"]}
    assert sorted(traces) == sorted(f"L{l}H{h}" for l in range(cfg.n_layers) for h in range(cfg.n_heads))
    for l in range(cfg.n_layers):
        for h in range(cfg.n_heads):
            sigma = torch.linalg.svdvals(dense_B(l, h))[: cfg.d_head].numpy()
            np.testing.assert_allclose(values(traces[f"L{l}H{h}"]["y"]).numpy(), sigma, rtol=1e-4, atol=1e-7)
    assert chart(page, "spectrum")["layout"]["yaxis"]["type"] == "log"

    table = page.dataframe[0].value.set_index(["layer", "head"])
    B = dense_B(1, 2)
    sigma = torch.linalg.svdvals(B)
    assert table.loc[(1, 2), "spectral_norm"] == pytest.approx(float(sigma[0]), rel=1e-4)
    assert table.loc[(1, 2), "nuclear_norm"] == pytest.approx(float(sigma.sum()), rel=1e-4)
    assert table.loc[(1, 2), "stable_rank"] == pytest.approx(float((sigma**2).sum() / sigma[0] ** 2), rel=1e-4)
    sym = torch.linalg.eigvalsh((B + B.T) / 2)
    assert table.loc[(1, 2), "lambda_max"] == pytest.approx(float(sym[-1]), rel=1e-4)
    assert table.loc[(1, 2), "lambda_min"] == pytest.approx(float(sym[0]), rel=1e-4)
    assert table.loc[(1, 2), "rank_cap"] == cfg.d_head


def test_one_head_and_its_eigenvalues(page):
    page.radio(key="spectrum_heads").set_value("one").run()
    page.selectbox(key="layer").select(1)
    page.selectbox(key="head").select(2)
    page.run()
    assert not page.exception
    assert [t["name"] for t in chart(page, "spectrum")["data"]] == ["L1H2"]
    eig = chart(page, "eigenvalues")["data"]
    assert [t["name"] for t in eig] == ["L1H2"]
    shown = np.sort_complex(values(eig[0]["x"]).numpy() + 1j * values(eig[0]["y"]).numpy())
    dense = torch.linalg.eigvals(dense_B(1, 2)).numpy()
    nonzero = np.sort_complex(dense[np.argsort(-np.abs(dense))][: len(shown)])
    np.testing.assert_allclose(shown, nonzero, atol=1e-5)
    assert len(page.dataframe[0].value) == 1

    page.toggle(key="spectrum_normalized").set_value(True).run()
    y = values(chart(page, "spectrum")["data"][0]["y"]).numpy()
    assert y[0] == pytest.approx(1.0) and (np.diff(y) <= 1e-9).all()


def test_head_detectors_find_the_induction_head(page):
    best = {m.label: m.value for m in page.metric}
    assert best["best induction head"].startswith("L1")  # induction needs a previous-token head below it
    grid = chart(page, "heads")
    induction = next(t for t in grid["data"] if t.get("xaxis") == "x2")
    z = np.array(induction["z"], dtype=float)
    assert z.max() > 0.5 and f"L1H{int(z[1].argmax())}" == best["best induction head"]
    page.number_input(key="detector_samples").set_value(8).run()
    assert not page.exception and len([m for m in page.metric if m.label.startswith("best ")]) == 4


def test_biases_toggle_is_off_for_a_model_without_them(page):
    assert page.toggle(key="spectrum_augmented").proto.disabled


def test_export_manifest(monkeypatch):
    calls = []
    monkeypatch.setattr(ui, "export_all", lambda plots, manifest, key: calls.append((plots, manifest, key)))
    at = AppTest.from_file(PAGE, default_timeout=90)
    at.query_params["model"] = MODEL
    at.run()
    ((plots, manifest, key),) = calls
    names = ["spectrum", "eigenvalues", "eigenvalues_sym", "two_ranks", "variance_L0H0", "heads"]
    assert [p.name for p in plots] == names and key == "spectrum"
    assert manifest["two_ranks"] == {"probes": "task", "variance": 0.9}
    assert manifest["model"] == MODEL and manifest["heads"] == "all"
    assert len(manifest["norms_and_ranks"]) == 8
    json.dumps(manifest, default=str)
