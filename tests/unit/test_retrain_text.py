"""Retraining imported models on text, end to end, for every family the views accept: a tiny
model built by transformers (learned or rotary positions, GQA, biases, RMSNorm, parallel blocks,
a sliding window) with a word-level tokenizer.json and generated text; retrain with a
regularizer and the KL term, measure before and after, export the run back as its own family,
and load it in transformers, whose fp32 logits equal attn-lab's to 1e-4."""

import json

import pytest
import torch
from typer.testing import CliRunner

transformers = pytest.importorskip("transformers")

from attn_core.cli import app  # noqa: E402
from attn_core.hf import load_hf  # noqa: E402
from attn_core.hf.family_export import export_family, hf_origin  # noqa: E402
from attn_core.retraining.job import TrainingJob  # noqa: E402
from attn_core.runs import RunStore  # noqa: E402
from attn_core.sources import resolve  # noqa: E402
from attn_core.training.config import JobConfig  # noqa: E402
from tests.conftest import write_tiny_gpt2, write_tiny_hf  # noqa: E402
from tests.text_corpus import make_text, write_word_tokenizer  # noqa: E402

FAMILIES = {
    "gpt2": ("gpt2", {}),
    "neox-partial-parallel": ("gpt_neox", {"rotary_pct": 0.5}),
    "llama-gqa-biases": ("llama", {"num_key_value_heads": 2, "attention_bias": True, "mlp_bias": True}),
    "mistral-window-mqa": ("mistral", {"num_key_value_heads": 1, "sliding_window": 5}),
    "qwen2-gqa": ("qwen2", {"num_key_value_heads": 2}),
}
TOL = 1e-4


class Result:
    """A command's exit status and output, as a subprocess would give them."""

    def __init__(self, res):
        self.returncode, self.stdout, self.stderr = res.exit_code, res.stdout, res.stderr


def cli(*args) -> Result:
    """``attn-lab ARGS`` in this process (the command's own parsing, run and error path)."""
    return Result(CliRunner().invoke(app, list(args)))


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(case, folder, text file): a tiny folder of the family with a tokenizer, and text in its words."""
    kind, overrides = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    folder = root / "model"
    folder.mkdir()
    if kind == "gpt2":
        write_tiny_gpt2(folder)
    else:
        write_tiny_hf(folder, kind, **overrides)
    write_word_tokenizer(folder)
    text = root / "text.txt"
    text.write_text(make_text(0, lines=150))
    return request.param, folder, text


def logits_equal(ours, folder, tokens) -> float:
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return float((ours(tokens) - hf(tokens).logits).abs().max())


def test_retrain_on_text_then_export_to_its_own_family(family, tmp_path):
    name, folder, text = family
    kind = FAMILIES[name][0]
    cfg = JobConfig(
        source=str(folder),
        text=str(text),
        block=12,
        regularizers=["entropy@L1=0.05"],
        kl=0.1,
        steps=6,
        lr=1e-2,
        eval_every=3,
        telemetry_every=3,
        spectrum_every=3,
        batch_size=8,
    )
    job = TrainingJob.open(cfg)
    res = job.run()
    assert res["status"] == "completed", res["message"]
    before, after = res["before"], res["after"]
    for m in (before, after):
        assert m["perplexity"] == pytest.approx(torch.tensor(m["loss"]).exp().item(), rel=1e-6)
        assert [r["head"] for r in m["per_head"]] == ["L1H0", "L1H1", "L1H2", "L1H3"]  # the regularized heads
        assert 0 <= m["entropy_data"] <= 1
    assert after["loss"] != before["loss"]
    rotary = kind != "gpt2"
    assert ("offset_sigma1" in before["per_head"][0]) == rotary
    log = job.snapshot().metrics()
    assert {"eval_loss", "term:kl", "term:entropy@L1", "entropy_data:L1H0"} <= set(log["name"])
    live_offsets = {"sigma1_offset_min:L1H0", "sigma1_offset_max:L1H3"} <= set(log["name"])
    assert live_offsets == rotary  # sigma_1(B(delta)) of the regularized rotary heads, logged while training

    store = RunStore()
    run = store.get(res["run_id"])
    assert run["task"] == "text" and run["summary"]["after"]["perplexity"] == pytest.approx(after["perplexity"])
    card = run["card"]
    assert card["hf"]["model_type"] == kind and card["text"]["block"] == 12 and card["trained"]["train"] == "all"
    assert (store.path(res["run_id"]) / "tokenizer.json").is_file()
    loaded = resolve(f"run:{res['run_id']}")
    assert hf_origin(loaded)["model_type"] == kind

    out = tmp_path / "exported"
    summary = export_family(loaded, out, hf_origin(loaded))
    assert summary["model_type"] == kind and "tokenizer.json" in summary["files"]
    exported = json.loads((out / "config.json").read_text())
    original = json.loads((folder / "config.json").read_text())
    for key in ("num_key_value_heads", "sliding_window", "rotary_pct", "partial_rotary_factor", "rope_parameters"):
        assert exported.get(key) == original.get(key), key
    tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    assert logits_equal(loaded.model, out, tokens) <= TOL
    with torch.no_grad():  # and our importer reads the export back to the same logits
        assert torch.allclose(load_hf(out).model(tokens), loaded.model(tokens), atol=TOL)
    assert (out / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    assert tok("w1 w2 w3")["input_ids"] == [1, 2, 3]


def test_the_cli_retrains_a_run_of_a_run_and_exports_it(tmp_path):
    """attn-lab retrain FOLDER --text ... --json, then retrain run:<id> (a fine-tune of a
    fine-tune, qk only), then export-hf run:<id>: transformers loads it with the same logits."""
    folder = tmp_path / "llama"
    write_tiny_hf(folder, "llama", num_key_value_heads=2)
    write_word_tokenizer(folder)
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"body": make_text(s, 20)}) + "\n" for s in range(8)))
    args = ["--text", str(tmp_path / "t.jsonl"), "--text-field", "body", "--block", "10", "--steps", "4"]
    first = cli("retrain", str(folder), *args, "--reg", "entropy@L0=0.1", "--lr", "0.01", "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["status"] == "completed" and out["text"]["documents"] == 8 and out["text"]["field"] == "body"
    assert out["before"]["perplexity"] > 1 and out["after"]["perplexity"] > 1 and out["tokens_per_s"] > 0
    assert {"head", "entropy_data", "top1_data", "sigma1", "offset_sigma1"} <= set(out["before"]["per_head"][0])
    second = cli("retrain", f"run:{out['run_id']}", *args, "--reg", "entropy@L1=0.1", "--train", "qk", "--json")
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert again["text"]["cached"] is True  # the same text and tokenizer: tokenized once
    assert again["trained"] == {"train": "qk", "kl": 0.0, "tensors": 2, "parameters": 4 * 32 * 8 + 2 * 32 * 8}
    parent, child = resolve(f"run:{out['run_id']}"), resolve(f"run:{again['run_id']}")
    assert child.card.parent == f"run:{out['run_id']}"
    p, c = dict(parent.model.named_parameters()), dict(child.model.named_parameters())
    assert {n for n in p if not torch.equal(p[n], c[n])} == {"blocks.1.attn.W_Q", "blocks.1.attn.W_K"}
    listed = {r["id"]: r for r in json.loads(cli("runs", "--json").stdout)}
    assert listed[out["run_id"]]["perplexity"] == pytest.approx(out["after"]["perplexity"])
    assert "perplexity" in cli("runs").stdout.splitlines()[1].split()  # a column of the listing's header
    exported = cli("export-hf", f"run:{again['run_id']}", "--out", str(tmp_path / "hf"), "--json")
    assert exported.returncode == 0, exported.stderr
    assert json.loads(exported.stdout)["model_type"] == "llama"
    tokens = torch.randint(0, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    assert logits_equal(child.model, tmp_path / "hf", tokens) <= TOL


def test_imported_models_without_text_or_tokenizer_say_what_is_missing(tmp_path):
    folder = tmp_path / "neox"
    write_tiny_hf(folder, "gpt_neox")
    (tmp_path / "t.txt").write_text(" ".join(f"w{i}" for i in range(100)))
    no_text = cli("retrain", str(folder), "--steps", "2")
    assert no_text.returncode == 2 and "give --text PATH" in no_text.stderr
    no_tok = cli("retrain", str(folder), "--text", str(tmp_path / "t.txt"), "--json")
    assert no_tok.returncode == 2 and "needs the model folder's own tokenizer.json" in no_tok.stderr
    assert json.loads(no_tok.stdout)["kind"] == "invalid"
    write_word_tokenizer(folder)
    short = cli("retrain", str(folder), "--text", str(tmp_path / "t.txt"), "--block", "64", "--steps", "1")
    last = short.stderr.strip().splitlines()[-1]  # after the tokenizing bars: one line (100 words + end of text)
    assert short.returncode == 2 and last.startswith("error: the text has 101 tokens, fewer than the 130 needed")
    assert RunStore().list_runs() == []  # nothing recorded


def test_an_imported_model_on_text_takes_a_batch_its_memory_allows(tmp_path, monkeypatch):
    """No --batch-size and no recipe (an imported model): the job takes text.task.default_batch of
    the model and block (the budget cut here so that it is 4, as a large vocabulary would make
    it), says it in --json and the human report, and a run of that run keeps it as its recipe; a
    given --batch-size wins."""
    from attn_core.text import task as text_task

    folder = tmp_path / "llama"
    write_tiny_hf(folder, "llama", num_key_value_heads=2)
    write_word_tokenizer(folder)
    (tmp_path / "t.txt").write_text(make_text(0, 60))
    loaded = resolve(str(folder))
    per_block = text_task.step_bytes_per_block(loaded.config, 10)
    monkeypatch.setattr(text_task, "STEP_MEMORY", 5 * per_block)  # room for 5 blocks: the default is 4
    args = ["--text", str(tmp_path / "t.txt"), "--block", "10", "--steps", "1"]
    first = cli("retrain", str(folder), *args, "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["batch_size"] == 4 and RunStore().get(out["run_id"])["card"]["train"]["batch_size"] == 4
    human = cli("retrain", str(folder), *args)
    assert human.returncode == 0 and "batches of 4 blocks of 10 tokens" in human.stdout
    monkeypatch.setattr(text_task, "STEP_MEMORY", 2**40)  # a run's recipe is its own, whatever the budget
    again = json.loads(cli("retrain", f"run:{out['run_id']}", *args, "--json").stdout)
    assert again["batch_size"] == 4
    given = json.loads(cli("retrain", str(folder), *args, "--batch-size", "3", "--json").stdout)
    assert given["batch_size"] == 3
    cfg = JobConfig(source=str(folder), text=str(tmp_path / "t.txt"), block=10, steps=1)
    assert TrainingJob.open(cfg, store=False).train_cfg.batch_size == 64  # the toys' 64 at most
