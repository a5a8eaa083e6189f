"""Export to a transformers GPT-2 folder (attn_core.hf.export, ``attn-lab export-hf``): the
folder opens in transformers, which computes the same logits and attention patterns as our
model, and our importer reads it back to the same scores; what does not map is refused with
the reason, and nothing existing is ever overwritten.

Tolerances: fp32 logits agree to 1e-5 relative to the largest logit (trained zoo models have
logits near 20, where one fp32 step is 2e-6), tiny random models to 1e-5 absolute; in fp64 the
mapping is exact up to the fp32 storage of the weights (1e-6)."""

import json
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers")

from attn_core import bilinear as bl  # noqa: E402
from attn_core.checkpoint import CheckpointError, LoadedModel  # noqa: E402
from attn_core.hf import load_hf  # noqa: E402
from attn_core.hf.export import export_gpt2, gpt2_config, gpt2_tensors, tokenizer_files  # noqa: E402
from attn_core.hooks import act_name  # noqa: E402
from attn_core.model import ModelConfig, Transformer  # noqa: E402
from attn_core.runs import RunStore  # noqa: E402
from attn_core.sources import resolve  # noqa: E402
from tests.conftest import make_tiny_model  # noqa: E402

ZOO_GPT2 = ["copy-1l", "induction-2l", "modadd-1l-mlp", "reverse-1l", "sort-2l-mlp"]
FILES = ["README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.json"]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "attn_core", *args], capture_output=True, text=True, timeout=300)


def tokens_for(cfg: ModelConfig, seed: int = 0, batch: int = 4) -> torch.Tensor:
    return torch.randint(0, cfg.d_vocab, (batch, cfg.n_ctx), generator=torch.Generator().manual_seed(seed))


def open_hf(folder):
    return transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()


def check_same_model(ours: Transformer, hf, tokens: torch.Tensor, rel: bool) -> None:
    """Logits (fp32 and fp64) and every layer's attention pattern agree."""
    with torch.no_grad():
        logits, cache = ours.run_with_cache(tokens)
        ref = hf(tokens, output_attentions=True)
    tol = 1e-5 * (max(1.0, float(logits.abs().max())) if rel else 1.0)
    assert (logits - ref.logits).abs().max() <= tol
    for layer, A in enumerate(ref.attentions):
        assert torch.allclose(cache[act_name("pattern", layer)], A, atol=1e-5)
    with torch.no_grad():
        exact = (ours.double()(tokens) - hf.double()(tokens).logits).abs().max()
    ours.float(), hf.float()
    assert exact <= 1e-6


def check_round_trip(ours: Transformer, folder, tokens: torch.Tensor) -> LoadedModel:
    """Our importer reads the export back to the same scores, patterns and logits."""
    back = load_hf(folder)
    with torch.no_grad():
        logits, cache = ours.run_with_cache(tokens)
        logits2, cache2 = back.model.run_with_cache(tokens)
    assert (logits - logits2).abs().max() <= 1e-5 * max(1.0, float(logits.abs().max()))
    for layer in range(ours.cfg.n_layers):
        S, S2 = cache[act_name("attn_scores", layer)], cache2[act_name("attn_scores", layer)]
        assert torch.allclose(S, S2, atol=1e-5, rtol=1e-5)
    return back


@pytest.mark.parametrize("name", ZOO_GPT2)
def test_zoo_models_open_in_transformers_with_the_same_logits(name, tmp_path):
    loaded = resolve(name)
    summary = export_gpt2(loaded, tmp_path / name, bl.token_names(loaded))
    folder = tmp_path / name
    assert sorted(p.name for p in folder.iterdir()) == FILES == summary["files"]
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary folder left beside it
    hf_cfg = json.loads((folder / "config.json").read_text())
    assert hf_cfg["model_type"] == "gpt2" and hf_cfg["vocab_size"] == loaded.config.d_vocab
    hf = open_hf(folder)
    assert hf.lm_head.weight.data_ptr() != hf.transformer.wte.weight.data_ptr()  # untied, as written
    tokens = tokens_for(loaded.config)
    check_same_model(loaded.model, hf, tokens, rel=True)
    back = check_round_trip(loaded.model, folder, tokens)
    assert bl.token_names(back) == bl.token_names(loaded)  # vocab.json carries the task's names
    assert "b_U folded" in " ".join(summary["notes"])  # every zoo model has a nonzero b_U
    assert f"`{name}`" in (folder / "README.md").read_text()


def test_tokenizer_encodes_like_the_task(tmp_path):
    loaded = resolve("sort-2l-mlp")
    export_gpt2(loaded, tmp_path / "s", bl.token_names(loaded))
    text = "15 3 10 0 |"
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "s")
    assert tok(text)["input_ids"] == bl.input_ids(loaded, text) == [15, 3, 10, 0, 16]
    assert tok.decode(bl.input_ids(loaded, text)) == text
    assert tok("15 a 3 1x 153")["input_ids"] == [15, 3]  # words that are no token name are dropped whole
    assert tok("a")["input_ids"] == []  # TransformerLens probes with "a": no error


@settings(max_examples=25, deadline=None)
@given(
    names=st.lists(
        st.text(st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=1, max_size=4),
        min_size=1,
        max_size=30,
        unique=True,
    ),
    data=st.data(),
)
def test_tokenizer_round_trips_any_token_names(names, data):
    from tokenizers import Tokenizer

    files = tokenizer_files(names, n_ctx=8)
    if any(n.split() != [n] for n in names):  # whitespace inside a name: no word-level tokenizer
        assert files == {}
        return
    tok = Tokenizer.from_str(files["tokenizer.json"])
    ids = data.draw(st.lists(st.integers(0, len(names) - 1), max_size=10))
    assert tok.encode(" ".join(names[i] for i in ids)).ids == ids
    assert json.loads(files["vocab.json"]) == {n: i for i, n in enumerate(names)}


def test_no_tokenizer_for_names_that_repeat_or_hold_spaces():
    assert tokenizer_files(["a", "a"], 4) == {} and tokenizer_files(["a b", "c"], 4) == {}
    only_vocab = tokenizer_files(["Ġthe", "x"], 4, words=False)
    assert list(only_vocab) == ["vocab.json"] and json.loads(only_vocab["vocab.json"]) == {"Ġthe": 0, "x": 1}


def test_attention_only_model_gets_mlps_that_add_nothing(tmp_path):
    # d_mlp 0, no attention biases; 26 tokens <= d_model 32, so the random b_U folds
    model = make_tiny_model("induction", std=0.3, d_model=32, d_head=16, n_layers=2)
    loaded = LoadedModel(name="tiny", model=model, config=model.cfg)
    summary = export_gpt2(loaded, tmp_path / "t")
    assert summary["n_inner"] == 128 and summary["tokenizer"] is False  # 4 d_model, TransformerLens' width
    assert "README.md" in summary["files"] and "vocab.json" not in summary["files"]
    hf = open_hf(tmp_path / "t")
    outputs = []
    hooks = [blk.mlp.register_forward_hook(lambda m, i, o: outputs.append(o)) for blk in hf.transformer.h]
    tokens = tokens_for(model.cfg, seed=1)
    check_same_model(model, hf, tokens, rel=False)
    for h in hooks:
        h.remove()
    assert outputs and all(torch.equal(o, torch.zeros_like(o)) for o in outputs)  # gelu(0) 0 + 0 = 0 exactly
    back = check_round_trip(model, tmp_path / "t", tokens)
    assert back.config.d_mlp == 128


def _tiny(seed=0, **config) -> Transformer:
    """A tiny model of the reverse task (11 tokens, d_model 16) with every weight random,
    the unembedding bias included."""
    return make_tiny_model("reverse", seed, std=0.3, **config)


@pytest.mark.parametrize(
    "config",
    [
        dict(d_mlp=24, attn_bias=True, mlp_act="gelu_tanh"),  # MLP padded from 24 to 64 units
        dict(positional="none", n_layers=2),  # wpe of zeros
        dict(d_qk=[[8, 5]], attn_bias=True),  # a narrower (grown) head: padded, scale folded
        dict(d_qk=[[3, 5]], d_mlp=80),  # every head narrower; an MLP wider than 4 d_model
    ],
    ids=["mlp-padded", "no-positions", "narrow-head", "narrow-heads-wide-mlp"],
)
def test_mappable_variants(config, tmp_path):
    model = _tiny(**config)
    summary = export_gpt2(LoadedModel(name="tiny", model=model, config=model.cfg), tmp_path / "t")
    assert summary["n_inner"] == max(64, model.cfg.d_mlp)
    tokens = tokens_for(model.cfg, seed=2)
    check_same_model(model, open_hf(tmp_path / "t"), tokens, rel=False)
    check_round_trip(model, tmp_path / "t", tokens)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_heads=st.sampled_from([1, 2, 4]),
    n_layers=st.integers(1, 2),
    d_mlp=st.sampled_from([0, 8, 64]),
    attn_bias=st.booleans(),
    positional=st.sampled_from(["learned", "none"]),
    mlp_act=st.sampled_from(["gelu", "gelu_tanh"]),
    seed=st.integers(0, 10_000),
)
def test_any_mappable_config_gives_the_same_logits(n_heads, n_layers, d_mlp, attn_bias, positional, mlp_act, seed):
    """In memory (no folder): transformers' GPT2LMHeadModel built from gpt2_config, holding
    gpt2_tensors strictly (no tensor missing or left over), equals our model."""
    model = _tiny(
        seed,
        n_heads=n_heads,
        d_head=16 // n_heads,
        n_layers=n_layers,
        d_mlp=d_mlp,
        attn_bias=attn_bias,
        positional=positional,
        mlp_act=mlp_act,
    )
    tensors, _ = gpt2_tensors(model)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**gpt2_config(model.cfg), attn_implementation="eager"))
    hf.load_state_dict(tensors, strict=True)
    check_same_model(model, hf.eval(), tokens_for(model.cfg, seed), rel=False)


@pytest.mark.parametrize(
    "config, reason",
    [
        (dict(qk="merged"), "merged W_QK"),
        (dict(normalization="none"), "no LayerNorm"),
        (dict(entmax_alpha=1.5), "alpha-entmax (alpha=1.5)"),
        (dict(d_head=4), "n_heads x d_head = 2 x 4 differs from d_model 16"),
        (dict(d_qk=[[8, 12]]), "head L0H1 has query/key width 12 > d_head 8"),
    ],
)
def test_models_that_do_not_map_are_refused_with_the_reason(config, reason, tmp_path):
    model = _tiny(**config)
    with pytest.raises(CheckpointError, match="does not map onto GPT-2") as e:
        export_gpt2(LoadedModel(name="tiny", model=model, config=model.cfg), tmp_path / "t")
    assert reason in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_bias_outside_the_row_space_of_W_U_is_refused(tmp_path):
    # 26 tokens > d_model 16: W_U's 16 rows cannot span a random b_U
    model = make_tiny_model("induction", std=0.3)
    loaded = LoadedModel(name="tiny", model=model, config=model.cfg)
    with pytest.raises(CheckpointError, match=r"unembedding bias b_U .* not in the row space of W_U.*no bias"):
        export_gpt2(loaded, tmp_path / "new" / "t")
    assert list(tmp_path.iterdir()) == []  # refused before any folder is made
    with torch.no_grad():
        model.unembed.b_U.zero_()  # a zero b_U needs no fold
    summary = export_gpt2(loaded, tmp_path / "t")
    assert not any("b_U" in n for n in summary["notes"])
    check_same_model(model, open_hf(tmp_path / "t"), tokens_for(model.cfg), rel=False)


def test_destination_is_never_overwritten(tmp_path):
    loaded = resolve("reverse-1l")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="already exists and is not empty"):
        export_gpt2(loaded, full)
    assert [p.name for p in full.iterdir()] == ["keep.txt"] and (full / "keep.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="is a file"):
        export_gpt2(loaded, tmp_path / "file")
    with pytest.raises(CheckpointError, match="is a file, not a folder"):
        export_gpt2(loaded, tmp_path / "file" / "sub")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "model.safetensors" in export_gpt2(loaded, empty)["files"]  # an empty folder is filled
    assert "model.safetensors" in export_gpt2(loaded, tmp_path / "a" / "b")["files"]  # parents are made
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "empty", "file", "full"]


def test_an_imported_gpt2_goes_back_to_transformers(tiny_gpt2, tmp_path):
    """transformers -> attn-lab (load_hf) -> export-hf -> transformers: the same logits as the
    original, written as its own family (GPT-2); its vocab.json and generation_config.json come
    along (no word-level tokenizer: its names are not words)."""
    original = open_hf(tiny_gpt2)
    proc = cli("export-hf", "gpt2-tiny", "--out", str(tmp_path / "again"), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["tokenizer"] is False and summary["notes"] == []  # GPT-2 maps tensor for tensor
    assert summary["files"] == ["README.md", "config.json", "generation_config.json", "model.safetensors", "vocab.json"]
    again = open_hf(tmp_path / "again")
    tokens = torch.randint(0, 100, (3, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.allclose(again(tokens).logits, original(tokens).logits, atol=1e-5, rtol=1e-5)
    assert bl.token_names(load_hf(tmp_path / "again"))[:2] == ["tok0", "tok1"]


def test_opens_in_transformer_lens(tmp_path):
    """TransformerLens (4.x, TransformerBridge) boots the folder: same logits and patterns, and
    the task's token names. TransformerLens is no dependency of attn-lab: skipped without it."""
    tl = pytest.importorskip("transformer_lens.model_bridge")
    loaded = resolve("modadd-1l-mlp")
    export_gpt2(loaded, tmp_path / "m", bl.token_names(loaded))
    bridge = tl.TransformerBridge.boot_transformers(str(tmp_path / "m"), device="cpu")
    tokens = tokens_for(loaded.config)
    with torch.no_grad():
        logits, cache = loaded.model.run_with_cache(tokens)
        ref, ref_cache = bridge.run_with_cache(tokens)
    assert (logits - ref).abs().max() <= 1e-5 * max(1.0, float(logits.abs().max()))
    name = act_name("pattern", 0)  # TransformerLens' own hook names
    assert torch.allclose(cache[name], ref_cache[name], atol=1e-5)
    assert bridge.to_str_tokens(tokens[0]) == [bl.token_names(loaded)[i] for i in tokens[0]]


def test_cli_exports_a_zoo_model_and_a_run(tmp_path):
    out = tmp_path / "ind"
    proc = cli("export-hf", "induction-2l", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["out"] == str(out) and summary["files"] == FILES and summary["tokenizer"] is True
    assert (summary["n_layer"], summary["n_head"], summary["n_embd"]) == (2, 4, 64)
    again = cli("export-hf", "induction-2l", "--out", str(out))
    assert again.returncode == 2 and "not empty" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    merged = cli("export-hf", "recall-2l-merged", "--out", str(tmp_path / "m"))
    assert merged.returncode == 2 and "merged W_QK" in merged.stderr and "Traceback" not in merged.stderr
    assert not (tmp_path / "m").exists()
    store = RunStore()  # the one in ATTN_LAB_RUNS, which the subprocess inherits
    run_id = store.create("reverse-1l", "reverse", {})
    model = _tiny(seed=3, d_mlp=32, attn_bias=True)
    store.finish(run_id, "completed", model, {"task": "reverse", "parent": "reverse-1l"})
    proc = cli("export-hf", f"run:{run_id}", "--out", str(tmp_path / "run"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert f"run:{run_id}" in (tmp_path / "run" / "README.md").read_text()
    check_same_model(model, open_hf(tmp_path / "run"), tokens_for(model.cfg), rel=False)
