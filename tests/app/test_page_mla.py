"""The dashboard on a DeepSeek-V3 folder (multi-head latent attention, a tiny model made by
transformers here): each model page renders without an exception or an error; the Heatmaps page
shows an MLA head's scores as its two terms, which add up to the model's own scores, beside its
latent gains; the Spectrum page shows the absorbed B on the latents, equal to the library's."""

from pathlib import Path

import pytest
import torch
from dashboard_helpers import chart, open_page, values, z_matrix

pytest.importorskip("transformers")

from attn_core import bilinear  # noqa: E402
from attn_core.sources import resolve  # noqa: E402
from tests.unit.test_mla import write_deepseek  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["1_Heatmaps.py", "2_Spectrum.py", "9_Circuits.py", "12_Edit_and_compare.py"]
NAME = "tiny-deepseek"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("mla-models")
    write_deepseek(root / NAME)
    return root


@pytest.fixture
def env(models, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_MODELS", str(models))


@pytest.mark.parametrize("page", PAGES)
def test_each_model_page_renders_on_mla(env, page):
    at = open_page(str(ROOT / "app_pages" / page), NAME)
    assert at.query_params["model"] == NAME  # the MLA model itself, not another one the page fell back to


def test_the_heatmaps_page_shows_the_two_terms_of_an_mla_head(env):
    at = open_page(str(ROOT / "app_pages" / "1_Heatmaps.py"), NAME)
    at.selectbox(key="head").select(2).run()
    assert not at.exception and not at.error
    loaded = resolve(NAME)
    p = at.query_params
    tokens = bilinear.random_tokens(loaded, int(p["seed"]), int(p["length"]))
    layer, head = int(p["layer"]), int(p["head"])
    assert head == 2
    parts = bilinear.score_parts(loaded, tokens, layer, head)
    fig = chart(at, "score_mla_terms")
    absorbed, rotary = z_matrix(fig, 0), z_matrix(fig, 1)
    seen = ~torch.isnan(absorbed)
    own = bilinear.sequence_view(loaded, tokens, layer).scores[head]
    assert torch.allclose((absorbed + rotary)[seen], own[seen], atol=1e-4)
    assert float(rotary[seen].abs().max()) > 0 and float(absorbed[seen].abs().max()) > 0
    gains = chart(at, "score_gains")
    assert torch.allclose(values(gains["data"][0]["y"]), parts.g_q, rtol=1e-5)


def test_the_spectrum_page_shows_the_absorbed_B_on_the_latents(env):
    at = open_page(str(ROOT / "app_pages" / "2_Spectrum.py"), NAME)
    assert any("latent attention" in h.value for h in at.header)
    fig = chart(at, "latent_spectrum")
    want = bilinear.latent_spectrum_frame(resolve(NAME).model)
    got = sorted(float(v) for trace in fig["data"] for v in values(trace["y"]))
    assert got == pytest.approx(sorted(want["singular_value"].tolist()), rel=1e-5)
