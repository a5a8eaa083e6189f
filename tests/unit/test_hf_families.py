"""Hugging Face families with rotary positions and grouped-query attention: tiny random models
built by transformers in the test, saved to a temporary folder and loaded through
``sources.resolve``; transformers' eager attention is the reference."""

import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")

from attn_core import bilinear as bl  # noqa: E402
from attn_core.bilinear.offsets import (  # noqa: E402
    free_form,
    offset_form,
    offset_spectrum,
    pair_scores,
    reference_spectra,
)
from attn_core.checkpoint import CheckpointError  # noqa: E402
from attn_core.hooks import act_name  # noqa: E402
from attn_core.sources import resolve  # noqa: E402
from tests.conftest import write_tiny_hf  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
CASES = {
    "neox-partial-parallel": ("gpt_neox", {}, {}),
    "neox-half-rotary-sequential": ("gpt_neox", {"rotary_pct": 0.5, "use_parallel_residual": False}, {}),
    "llama-gqa-bias-llama3": (
        "llama",
        {
            "num_key_value_heads": 2,
            "attention_bias": True,
            "tie_word_embeddings": True,
            "rope_scaling": {**LLAMA3, "original_max_position_embeddings": 16},
        },
        {},
    ),
    "mistral-window-mqa": ("mistral", {"num_key_value_heads": 1, "sliding_window": 5}, {}),
    "qwen2-gqa-sharded": ("qwen2", {"num_key_value_heads": 2}, {"max_shard_size": "40KB"}),
    "llama-bf16": ("llama", {"num_key_value_heads": 2}, {"dtype": torch.bfloat16}),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    family, overrides, save = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    reference = write_tiny_hf(folder, family, **save, **overrides)
    return request.param, reference, folder


def _tokens(n: int = 20, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 100, (batch, n), generator=torch.Generator().manual_seed(1))


def test_patterns_and_logits_match_transformers(case):
    name, reference, folder = case
    loaded = resolve(folder)  # a Hugging Face folder works wherever a model NAME does
    assert loaded.task is None and loaded.config.positional == "rotary"
    if "sharded" in name:
        assert (folder / "model.safetensors.index.json").is_file() and not (folder / "model.safetensors").exists()
    tokens = _tokens()
    with torch.no_grad():
        ref = reference(tokens, output_attentions=True)
        logits, cache = loaded.model.run_with_cache(tokens)
    for layer in range(2):
        A_ref = ref.attentions[layer]
        assert A_ref.max() > 0.5  # peaked patterns: a real comparison
        assert torch.allclose(cache[act_name("pattern", layer)], A_ref, atol=1e-5), (name, layer)
    assert torch.allclose(logits, ref.logits, atol=1e-4, rtol=1e-4)


def test_config_maps_every_option(case):
    name, reference, folder = case
    cfg = resolve(folder).config
    hf = reference.config
    assert cfg.n_heads == hf.num_attention_heads and cfg.d_head == 8
    if name.startswith("neox"):
        assert cfg.rotary_dims == (4 if "half" in name else 2)
        assert cfg.parallel_attn == ("parallel" in name) and cfg.normalization == "layernorm"
    else:
        assert cfg.normalization == "rmsnorm" and cfg.gated_mlp and cfg.rotary_dims == 8
        assert cfg.kv_heads == hf.num_key_value_heads
    if "llama3" in name:
        assert cfg.rope_scaling["type"] == "llama3" and cfg.rope_scaling["original_max_position_embeddings"] == 16
    if "window" in name:
        assert cfg.sliding_window == [5, 5]


def test_grouped_heads_name_their_key_head(case):
    name, _, folder = case
    cfg = resolve(folder).config
    heads = [cfg.kv_head(h) for h in range(cfg.n_heads)]
    expected = {"mistral-window-mqa": [0, 0, 0, 0], "llama-gqa-bias-llama3": [0, 0, 1, 1]}
    assert heads == expected.get(name, heads)
    if cfg.kv_heads < cfg.n_heads:  # query heads that share a key head share W_K in their form
        attn = resolve(folder).model.blocks[0].attn
        assert torch.equal(attn.per_head("W_K")[0], attn.per_head("W_K")[1])


def test_rotary_form_reproduces_the_scores_at_every_offset(case):
    """S_ij = x_i' B'(j - i) x_j'^T with B(delta) = W_Q R(delta) W_K^T / sqrt(d)."""
    _, _, folder = case
    model = resolve(folder).model
    T = 12
    tokens = _tokens(T, 1)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        for layer in range(2):
            X = cache[act_name("attn_in", layer)][0]
            aug = bl.has_bias(model)
            Xa = bl.augment(X) if aug else X
            S = cache[act_name("attn_scores", layer)][0]  # [h, T, T]
            for delta in range(-(T - 1), 1):
                form = bl.layer_form(model, layer, aug, offset=delta)
                rows = torch.arange(-delta, T)
                got = form.bilinear(Xa)[:, rows, rows + delta]  # [h, n]
                want = S[:, rows, rows + delta]
                assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (layer, delta)


def test_offset_spectrum_against_dense(case):
    name, _, folder = case
    model = resolve(folder).model
    attn = model.blocks[1].attn
    head = 3
    W_Q, W_K = attn.W_Q[head].double(), attn.per_head("W_K")[head].double()
    scale = model.cfg.d_head**-0.5
    frame = offset_spectrum(model, 1, head, offsets=[0, -1, -7], k=8)
    at0 = frame[frame.delta == 0].singular_value.to_numpy()
    dense0 = torch.linalg.svdvals(W_Q @ W_K.T * scale)[:8]  # un-rotated W_Q W_K^T / sqrt(d)
    assert torch.allclose(torch.tensor(at0, dtype=torch.float64), dense0, rtol=1e-4, atol=1e-5)
    forms = offset_form(model, 1, head, [0, -1, -7])
    for j, delta in enumerate([0, -1, -7]):
        assert torch.allclose(forms.dense[j].double(), bl.layer_form(model, 1, offset=delta)[head].dense.double())
    r = model.cfg.rotary_dims
    free = free_form(model, 1, head)
    ref = reference_spectra(model, 1, head)
    unrotated = ref[ref.part == "un-rotated W_Q W_K^T"].singular_value.to_numpy()
    assert torch.allclose(torch.tensor(unrotated, dtype=torch.float64), dense0, rtol=1e-4, atol=1e-5)
    if r < model.cfg.d_head:
        want = torch.linalg.svdvals(W_Q[:, r:] @ W_K[:, r:].T * scale)
        assert torch.allclose(free.singular_values.double(), want[: len(free.singular_values)], rtol=1e-4, atol=1e-5)
        assert ref.part.nunique() == 2
    else:
        assert free is None and ref.part.nunique() == 1


def test_views_detectors_and_spectrum_work(case):
    _, _, folder = case
    loaded = resolve(folder)
    ids = _tokens(16, 1)[0].tolist()
    seq = bl.sequence_view(loaded, ids, layer=1)
    with torch.no_grad():
        _, cache = loaded.model.run_with_cache(torch.tensor([ids]))
    assert torch.allclose(seq.scores, cache[act_name("attn_scores", 1)][0], atol=1e-5)
    v0 = bl.vocabulary_view(loaded, layer=0, heads=[0], offset=0)
    v5 = bl.vocabulary_view(loaded, layer=0, heads=[0], offset=-5)
    assert v0.scores.shape == (1, 100, 100) and not torch.allclose(v0.scores, v5.scores)
    spec = bl.spectrum_frame(loaded.model)
    assert len(spec.groupby(["layer", "head"])) == 8
    det = bl.head_detectors(loaded.model, seed=0)
    assert len(det) == 8 * len(bl.DETECTORS) and det.score.notna().all()
    with torch.no_grad():
        x, y = bl.vocab_inputs(loaded.model, 0, [5, 7])
    pairs = pair_scores(loaded.model, 0, 0, x, y, offsets=[0, -1, -2])
    aug = bl.has_bias(loaded.model)
    xa, ya = (bl.augment(v[None]) if aug else v[None] for v in (x, y))
    with torch.no_grad():
        want = [float(bl.layer_form(loaded.model, 0, aug, d)[0].bilinear(xa, ya)) for d in (0, -1, -2)]
    assert pairs.score.tolist() == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_both_config_spellings_give_one_model(tmp_path):
    """transformers 4 wrote rotary_pct / rotary_emb_base / rope_scaling; 5 writes rope_parameters."""
    folder = tmp_path / "v5"
    write_tiny_hf(folder, "gpt_neox", rotary_pct=0.5)
    raw = json.loads((folder / "config.json").read_text())
    assert "rope_parameters" in raw
    old = dict(raw)
    params = old.pop("rope_parameters")
    old.update(rotary_pct=params["partial_rotary_factor"], rotary_emb_base=params["rope_theta"])
    v4 = tmp_path / "v4"
    v4.mkdir()
    (v4 / "config.json").write_text(json.dumps(old))
    shutil.copy(folder / "model.safetensors", v4 / "model.safetensors")  # a link leading out would be refused
    a, b = resolve(folder).config, resolve(v4).config
    assert (a.rotary_dims, a.rope_theta) == (b.rotary_dims, b.rope_theta) == (4, 10000.0)
    llama = json.loads(json.dumps({**raw, "model_type": "llama"}))
    llama.update(rope_scaling={"type": "linear", "factor": 2.0}, rope_theta=5e5)
    llama.pop("rope_parameters")
    from attn_core.hf import model_config

    cfg = model_config(llama)
    assert cfg.rope_scaling == {"type": "linear", "factor": 2.0} and cfg.rope_theta == 5e5


def test_tokenizer_json_gives_labels_and_round_trips(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attn_core.hf.tokenizer import encode, load_tokenizer, token_strings

    write_tiny_hf(tmp_path, "llama", num_key_value_heads=2)
    vocab = {w: i for i, w in enumerate(["[UNK]", "the", "cat", "sat", "on", "mat", "a", "dog"])}
    vocab.update({f"w{i}": i for i in range(len(vocab), 100)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = resolve(tmp_path)
    names = bl.token_names(loaded)
    assert names[:4] == ["[UNK]", "the", "cat", "sat"] and len(names) == 100 and len(set(names)) == 100
    ids = bl.input_ids(loaded, "the cat sat on the mat")
    assert ids == [1, 2, 3, 4, 1, 5]
    assert load_tokenizer(tmp_path).decode(ids) == "the cat sat on the mat"
    assert encode(load_tokenizer(tmp_path), "a dog") == [6, 7]
    assert token_strings(load_tokenizer(tmp_path), 3) == ["[UNK]", "the", "cat"]


def _folder_with(tmp_path, **config_changes):
    write_tiny_hf(tmp_path, "llama", num_key_value_heads=2)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.update(config_changes)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model_type": "bert"}, "model_type 'bert' is not supported"),
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}, "rope type 'dynamic'"),
        ({"hidden_size": 64}, "does not match|shape"),
        ({"num_key_value_heads": 3}, "multiple of n_kv_heads"),
        ({"hidden_act": "mish"}, "activation 'mish'"),
    ],
)
def test_bad_folders_get_one_line(tmp_path, changes, message):
    folder = _folder_with(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=message) as e:
        resolve(folder)
    assert "\n" not in str(e.value)


def test_a_model_too_large_for_memory_is_refused_before_reading(tmp_path):
    from attn_core.limits import available_memory

    per_layer = 4 * 8192**2 + 3 * 8192 * 32768  # float32 parameters of one layer at this width
    layers = min(128, available_memory() // (4 * per_layer) + 2)
    big = {"hidden_size": 8192, "intermediate_size": 32768, "num_hidden_layers": layers, "head_dim": 128}
    folder = _folder_with(tmp_path, num_attention_heads=64, num_key_value_heads=8, **big)
    with pytest.raises(CheckpointError, match=r"GiB as float32; only .* GiB of memory is available"):
        resolve(folder)


def test_missing_weights_and_pickles_are_refused(tmp_path):
    folder = _folder_with(tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        resolve(folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(CheckpointError, match="pickle and is never read"):
        resolve(folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../outside.safetensors"}}))
    with pytest.raises(CheckpointError, match="not a .safetensors file in the folder"):
        resolve(folder)


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _folder_with(tmp_path)
    sd = load_file(str(folder / "model.safetensors"))
    sd.pop("model.layers.1.self_attn.k_proj.weight")
    save_file(sd, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="layers.1.self_attn.k_proj.weight"):
        resolve(folder)


def test_attribution_splits_rotary_scores_by_plane(case):
    from attn_core import circuits

    name, _, folder = case
    loaded = resolve(folder)
    ids = _tokens(14, 1)[0].tolist()
    attr = circuits.attribute(loaded, ids, layer=1, head=2, query=11)
    with torch.no_grad():
        _, cache = loaded.model.run_with_cache(torch.tensor([ids]))
    seen = list(range(12 - (loaded.config.window(1) or 12), 12))  # the keys the model's mask shows
    assert attr.keys == seen
    want = cache[act_name("attn_scores", 1)][0, 2, 11, seen].double()
    assert torch.allclose(attr.scores, want, atol=1e-5)  # the planes add up to the model's score
    cfg = loaded.config
    assert attr.terms.shape == (len(seen), cfg.rotary_dims // 2 + (cfg.rotary_dims < cfg.d_head))
    assert attr.frame(top=2)["term"].iloc[0].startswith("plane 0")
    margin = attr.runner_up()
    order = attr.ranking()
    assert margin["difference"].sum() == pytest.approx(float(attr.scores[order[0]] - attr.scores[order[1]]), abs=1e-6)


def test_a_shard_linked_from_outside_the_folder_is_refused(tmp_path):
    """The index names the shards: a name that is a link leading out of the folder is not read."""
    folder = tmp_path / "model"
    write_tiny_hf(folder, "qwen2", max_shard_size="40KB", num_key_value_heads=2)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    outside = tmp_path / "elsewhere.safetensors"
    (folder / shard).rename(outside)
    (folder / shard).symlink_to(outside)
    with pytest.raises(CheckpointError, match="leads outside the model folder"):
        resolve(folder)
