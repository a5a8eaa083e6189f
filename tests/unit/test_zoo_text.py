"""The shipped text model (text-8k): a tokenizer.json and a context of 8192 tokens, so that the
long-input features run out of the box on the corpus that ships with it; the preset reproduces
its tokenizer byte for byte, and the model meets its card's held-out loss."""

from __future__ import annotations

import json
import math

from attn_core import zoo
from attn_core.hf.tokenizer import TOKENIZER
from attn_core.presets import get_preset
from attn_core.sources import resolve
from attn_core.text.bundled import CORPUS
from attn_core.training.trainer import evaluate
from tests.conftest import cli_run

NAME = "text-8k"


def test_it_ships_with_a_tokenizer_and_a_context_of_8192():
    loaded = resolve(NAME)
    assert loaded.config.n_ctx >= 8192 and loaded.config.positional == "rotary"
    assert (zoo.ZOO_DIR / NAME / TOKENIZER).is_file()
    assert loaded.card.command == f"attn-lab train --preset {NAME} --out assets/models/{NAME} --json"


def test_scores_of_8192_tokens_of_its_corpus_out_of_the_box():
    args = ("scores", NAME, "--layer", 1, "--head", 0, "--text", CORPUS, "--length", 8192, "--topk", 8, "--json")
    result = cli_run(*args)
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)
    assert r["n_tokens"] == 8192 and len(r["queries"]) == 8192
    assert all(math.isfinite(q["entropy"]) and len(q["top"]) == min(8, q["query"] + 1) for q in r["queries"])


def test_the_preset_reproduces_its_tokenizer_and_the_model_meets_its_card():
    preset = get_preset(NAME)
    task, tokenizer = preset.make_task()
    assert tokenizer == (zoo.ZOO_DIR / NAME / TOKENIZER).read_bytes()
    loaded = resolve(NAME)
    card = loaded.card.metrics
    res = evaluate(loaded.model, task, samples=card["eval_samples"], seed=424242)
    assert res["loss"] <= card["loss"] + 0.1 and card["perplexity"] == math.exp(card["loss"])
    assert card["loss"] < math.log(preset.vocab) - 1  # it learned something of the text
