"""The dashboard on a DeepSeek-V3 folder (multi-head latent attention, a tiny model made by
transformers here): each model page renders without an exception or an error; the Heatmaps page
shows an MLA head's scores as its two terms, which add up to the model's own scores, beside its
latent gains; the Spectrum page shows the absorbed B on the latents, equal to the library's; an
edit made on the Edit page (probes cut from a text) is al.edit's: the same loss, pattern and
edited weights."""

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
WITH_TOKENIZER = "tiny-deepseek-words"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.unit.test_cli_new_families import WORDS

    root = tmp_path_factory.mktemp("mla-models")
    write_deepseek(root / NAME)
    write_deepseek(root / WITH_TOKENIZER, max_position_embeddings=128)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / WITH_TOKENIZER / "tokenizer.json"))
    data = root / "data"
    data.mkdir()
    (data / "words.txt").write_text(" ".join(WORDS[1 + (i * 7) % 99] for i in range(3000)))
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


def test_an_edit_on_the_edit_page_is_al_edits(env, models, monkeypatch):
    import attn_core as al
    from attn_core import surgery

    monkeypatch.setenv("ATTN_LAB_DATA", str(models / "data"))
    at = open_page(str(ROOT / "app_pages" / "12_Edit_and_compare.py"), WITH_TOKENIZER)
    at.radio(key="edit_text_from").set_value("data").run()
    assert not at.exception and not at.error
    at.selectbox(key="layer").select(1).run()
    at.selectbox(key="head").select(2).run()
    at.slider(key="edit_rank_1_2").set_value(3).run()
    assert not at.exception and not at.error
    text = models / "data" / "words.txt"
    want = al.edit(WITH_TOKENIZER, "L1H2", rank=3, text=text, samples=16)
    loss = [m for m in at.metric if m.label == "Loss (nats)"][0]
    assert loss.value == f"{want.after['loss']:.4g}" and want.after["loss"] != want.before["loss"]
    inputs = surgery.edit_inputs(resolve(WITH_TOKENIZER), text, samples=16)
    pattern = surgery.head_pattern(want.model.model, inputs.tokens[0], 1, 2)
    torch.testing.assert_close(z_matrix(chart(at, "edit_pattern"), trace=1), pattern, atol=1e-5, rtol=0)
    [b for b in at.button if b.label == "Save the edited model as a run"][0].click()
    at.run()
    assert not at.exception and not at.error
    run = [s.value for s in at.success][0].split("run:")[1].split(" ")[0]
    saved, edited = resolve(f"run:{run}").model.state_dict(), want.model.model.state_dict()
    assert saved.keys() == edited.keys()
    assert all(torch.equal(saved[k], edited[k]) for k in saved)
    changed = [k for k in saved if not torch.equal(saved[k], resolve(WITH_TOKENIZER).model.state_dict()[k])]
    assert changed == ["blocks.1.attn.W_UQ"]
