"""``attn-lab dynamics`` over a checkpoint series of a newer family: three Qwen3 folders (per-head
QK-norm, grouped-query heads, a sliding window) saved by transformers as step0/, step10/, step20/.
Every checkpoint is measured (none skipped), and each head's sigma_1 is that of its core B~ (the
QK-norm weights folded in), read from the layer's form."""

import json

import pytest
import torch

pytest.importorskip("transformers")

import attn_core as al  # noqa: E402
from attn_core.bilinear import layer_form  # noqa: E402
from attn_core.cli import main  # noqa: E402
from tests.unit.test_hf_new_families import write_family  # noqa: E402

WORDS = ["[UNK]"] + [f"w{i}" for i in range(1, 100)]
STEPS = (0, 10, 20)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("qwen3-series")
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = write_family(root / "qwen3-like" / "step0", "qwen3")
    for step in STEPS:
        if step:  # a "training step": every weight moved
            with torch.no_grad():
                for p in hf.parameters():
                    p.mul_(0.9).add_(0.05 * torch.randn_like(p))
            hf.save_pretrained(root / "qwen3-like" / f"step{step}", safe_serialization=True)
        tok.save(str(root / "qwen3-like" / f"step{step}" / "tokenizer.json"))
    text = root / "text.txt"
    text.write_text(" ".join(WORDS[1 + (i * 7) % 99] for i in range(600)))
    return root / "qwen3-like", text


def test_dynamics_measures_every_checkpoint_of_a_qwen3_series(series, capsys, monkeypatch, tmp_path):
    folder, text = series
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    args = ["dynamics", str(folder), "--text", str(text), "--length", "16", "--samples", "4"]
    with pytest.raises(SystemExit) as done:
        main(args + ["--detector-samples", "4", "--no-cache", "--json"])
    out, err = capsys.readouterr()
    assert done.value.code == 0, err
    result = json.loads(out)
    assert result["steps"] == list(STEPS) and result["skipped"] == []
    metrics = result["metrics"]
    assert all(v == v for v in metrics["loss"])  # finite, not NaN
    for i, step in enumerate(STEPS):
        model = al.load(str(folder / f"step{step}")).model
        for layer in range(model.cfg.n_layers):
            sigma = layer_form(model, layer).singular_values[:, 0]
            for head in range(model.cfg.n_heads):
                assert metrics[f"sigma_max:L{layer}H{head}"][i] == pytest.approx(float(sigma[head]), rel=1e-4)
