"""Hostile models (issue 25): what used to load and give wrong numbers with exit 0 — a sliding
window ignored by attribution, tensors of the wrong shape, a tensor in two shards, config fields
of the wrong type or spelled twice, rotary frequencies that overflow, safetensors headers that lie
about their sizes, and files of a model folder that are links leading out. Every model is built
here (tiny Hugging Face folders are written by transformers); each refusal is one sentence."""

import json
import os
import struct
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from attn_core import bilinear  # noqa: E402
from attn_core.checkpoint import CheckpointError  # noqa: E402
from attn_core.circuits.attribution import attribute, token_position_split  # noqa: E402
from attn_core.hooks import act_name  # noqa: E402
from attn_core.sources import resolve  # noqa: E402
from tests.conftest import make_tiny_model, write_tiny_gpt2, write_tiny_hf  # noqa: E402

WINDOW = 5


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and 0 < len(text) < 600, text
    return text


@pytest.fixture(scope="module")
def mistral(tmp_path_factory) -> Path:
    """A tiny Mistral whose layers see the last WINDOW keys only."""
    folder = tmp_path_factory.mktemp("mistral")
    write_tiny_hf(folder, "mistral", num_key_value_heads=1, sliding_window=WINDOW)
    return folder


# --- the model's own mask in every view and attribution -----------------------------------------------


@pytest.mark.parametrize("layer", [0, 1])
def test_attribution_keys_are_the_keys_the_windowed_head_sees(mistral, layer):
    loaded = resolve(mistral)
    ids = [7] * 20  # "cat" x 20: every key looks alike, only the mask tells them apart
    view = bilinear.sequence_view(loaded, ids, layer)
    with torch.no_grad():
        _, cache = loaded.model.run_with_cache(torch.tensor([ids]))
    S = cache[act_name("attn_scores", layer)][0]
    for head in range(4):
        for query in (3, 12, 19):
            a = attribute(loaded, ids, layer, head, query)
            seen = torch.nonzero(view.mask[query]).flatten().tolist()
            assert a.keys == seen == list(range(max(0, query - WINDOW + 1), query + 1))
            assert torch.allclose(a.scores, S[head, query, seen].double(), atol=1e-5)
            assert a.top(1)[0] in seen


def test_the_positional_view_and_long_views_use_the_layer_window():
    model = make_tiny_model("reverse", sliding_window=[3], std=0.5)
    from attn_core.sources import LoadedModel

    loaded = LoadedModel("windowed", model, model.cfg)
    n = min(model.cfg.n_ctx, bilinear.MAX_VIEW_TOKENS)
    view = bilinear.positional_view(loaded, 0)
    assert torch.equal(view.mask, bilinear.layer_mask(model, 0, n).cpu())
    assert not view.mask[n - 1, 0] and view.pattern[0, n - 1, : n - 3].abs().max() == 0
    ids = list(range(10))
    split = token_position_split(loaded, ids, 0, 9)
    assert split["key"].tolist() == [7, 8, 9]
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids]))
    assert torch.allclose(
        torch.tensor(split["score"].to_numpy()), cache[act_name("attn_scores", 0)][0, 0, 9, 7:].double(), atol=1e-5
    )


def test_kernel_approximations_refuse_a_windowed_head(mistral):
    from attn_core.kernels import head_qkv

    model = resolve(mistral).model
    q, _, _ = head_qkv(model, torch.arange(WINDOW), 1, 0)  # within the window: the causal form is exact
    assert q.shape[1] == WINDOW
    with pytest.raises(ValueError, match="sliding window of 5 keys") as e:
        head_qkv(model, torch.arange(12), 1, 0)
    one_line(e)


# --- every tensor's shape against the config; shards; lying headers ---------------------------------


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _rewrite(folder: Path, change, file: str = "model.safetensors") -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(str(folder / file))
    change(sd)
    save_file(sd, str(folder / file), metadata={"format": "pt"})


Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.mark.parametrize("shape", [(16, 64), (1024,)], ids=["16x64", "1-D"])
def test_a_tensor_of_another_shape_is_refused_by_name(mistral, tmp_path, shape):
    folder = _copy(mistral, tmp_path / "m")
    _rewrite(folder, lambda sd: sd.update({Q: sd[Q].reshape(shape).contiguous()}))
    with pytest.raises(CheckpointError, match=rf"tensor '{Q}' has shape \[{', '.join(map(str, shape))}\]") as e:
        resolve(folder)
    assert "config.json needs [32, 32]" in one_line(e)


def test_a_gpt2_tensor_of_another_shape_is_refused(tmp_path):
    write_tiny_gpt2(tmp_path)
    name = "transformer.h.1.attn.c_attn.weight"
    _rewrite(tmp_path, lambda sd: sd.update({name: sd[name][:, :64].contiguous()}))
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' has shape \[32, 64\]; config.json needs \[32, 96\]"):
        resolve(tmp_path)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qwen2-sharded")
    write_tiny_hf(folder, "qwen2", num_key_value_heads=2, max_shard_size="40KB")
    return folder


def test_a_tensor_in_two_shards_is_refused(sharded, tmp_path):
    folder = _copy(sharded, tmp_path / "m")
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    home = index[Q]
    other = next(f for f in sorted(set(index.values())) if f != home)
    from safetensors.torch import load_file

    stray = load_file(str(folder / home))[Q] * 3  # another copy of the tensor, with other values
    _rewrite(folder, lambda sd: sd.update({Q: stray}), other)
    with pytest.raises(CheckpointError, match="is in two shards") as e:
        resolve(folder)
    assert Q in one_line(e)


def test_the_index_decides_which_shard_holds_a_tensor(sharded, tmp_path):
    folder = _copy(sharded, tmp_path / "m")
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    home = index["weight_map"][Q]
    index["weight_map"][Q] = next(f for f in sorted(set(index["weight_map"].values())) if f != home)
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"puts tensor '{Q}' in .*, but it is in {home}") as e:
        resolve(folder)
    one_line(e)


def _lying_header(folder: Path, name: str, shape: list[int]) -> int:
    """Rewrite the folder's model.safetensors so that its header declares ``name`` with ``shape``
    (F16), its data a hole at the end of a sparse file; returns the declared file size."""
    from safetensors import safe_open

    tensors = {}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k).contiguous() for k in f.keys() if k != name}
    header, blobs, offset = {}, [], 0
    for k, t in tensors.items():
        data = t.numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    size = 2 * shape[0] * shape[1]
    header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = folder / "model.safetensors"
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
        out.truncate(8 + len(text) + offset + size)  # a hole: no disk, but the size the header declares
    return path.stat().st_size


def test_a_lying_header_is_refused_before_its_data_is_read(mistral, tmp_path):
    """lm_head.weight declared [50000000, 32] in a 3.2 GB sparse file (vocabulary 100): refused from
    the header, in a process whose peak memory stays far below the 3.2 GB (13.5 GB before)."""
    import subprocess
    import sys

    folder = _copy(mistral, tmp_path / "m")
    assert _lying_header(folder, "lm_head.weight", [50_000_000, 32]) > 3_000_000_000
    assert os.stat(folder / "model.safetensors").st_blocks * 512 < 10**8  # really sparse
    script = (
        "import resource, sys\n"
        "from attn_core.sources import resolve\n"
        "try:\n"
        f"    resolve({str(folder)!r})\n"
        "except ValueError as e:\n"
        "    print(e)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    message, peak = proc.stdout.strip().splitlines()
    assert "tensor 'lm_head.weight' has shape [50000000, 32]; config.json needs [100, 32]" in message
    # 0.45 GiB alone, 1.51 GiB once in a full run of the suite: far below the file either way
    assert int(peak) < 2 * 2**30, f"peak RSS {int(peak) / 2**30:.2f} GiB"


# --- one rule for every file of a model folder ------------------------------------------------------


@pytest.mark.parametrize(
    "kind, name",
    [("ours", "config.json"), ("ours", "model.safetensors"), ("ours", "card.json")]
    + [("hugging face", "config.json"), ("hugging face", "model.safetensors")],
)
def test_a_file_of_a_model_folder_that_links_out_is_refused(mistral, tmp_path, kind, name):
    from attn_core import checkpoint

    if kind == "ours":
        folder = tmp_path / "models" / "m"
        checkpoint.save(make_tiny_model(), folder, card={"task": "reverse"})
    else:
        folder = _copy(mistral, tmp_path / "m")
    outside = tmp_path / name
    (folder / name).rename(outside)
    (folder / name).symlink_to(outside)
    with pytest.raises(CheckpointError, match=f"'{name}' leads outside the model folder") as e:
        resolve(folder)
    one_line(e)


def test_our_format_checks_declared_shapes_before_reading(tmp_path):
    """A checkpoint of ours whose header declares W_E as [50000000, 16]: refused from the header."""
    from attn_core import checkpoint

    data = checkpoint.to_safetensors_bytes(make_tiny_model())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header["embed.W_E"]["shape"] = [50_000_000, 16]
    text = json.dumps(header).encode()
    lying = struct.pack("<Q", len(text)) + text + data[8 + n :]
    with pytest.raises(CheckpointError, match=r"tensor embed.W_E has shape \[50000000, 16\], the config needs") as e:
        checkpoint.load_bytes(lying)
    one_line(e)


# --- config fields: types, both spellings, rotary frequencies ---------------------------------------


@pytest.fixture(scope="module")
def gpt2_config(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("gpt2")
    write_tiny_gpt2(folder)
    return json.loads((folder / "config.json").read_text())


@pytest.fixture(scope="module")
def mistral_config(mistral) -> dict:
    return json.loads((mistral / "config.json").read_text())


GPT2_BAD = [
    ({"n_embd": 32.7}, "n_embd must be an integer, got 32.7"),
    ({"n_embd": "32"}, "n_embd must be an integer, got '32'"),
    ({"n_embd": float("inf")}, "n_embd must be an integer, got inf (not a finite number)"),  # JSON 1e400
    ({"n_layer": True}, "n_layer must be an integer, got True"),
    ({"activation_function": ["gelu"]}, "activation ['gelu'] is not supported"),
    ({"layer_norm_epsilon": "1e-5"}, "layer_norm_epsilon must be a finite number"),
    ({"scale_attn_weights": "no"}, "scale_attn_weights must be true or false, got 'no'"),
]
ROTARY_BAD = [
    ({"layer_types": ["sliding_attention", {"x": 1}]}, "layer_types holds {'x': 1}"),
    ({"layer_types": ["sliding_attention"]}, "layer_types must list one of"),
    ({"sliding_window": True}, "sliding_window must be an integer, got True"),
    ({"rope_parameters": ["linear", 2.0]}, "rope_parameters must be a JSON object (or null), got list"),
    ({"rope_parameters": "linear"}, "rope_parameters must be a JSON object (or null), got str"),
    ({"rope_scaling": [1, 2]}, "rope_scaling must be a JSON object (or null), got list"),
    ({"rope_scaling": "linear"}, "rope_scaling must be a JSON object (or null), got str"),
    ({"attention_bias": "false"}, "attention_bias must be true or false"),
    ({"num_key_value_heads": 1.0}, "num_key_value_heads must be an integer, got 1.0"),
    (
        {"rope_theta": 5e5},
        "gives the rope base twice and they disagree: rope_parameters.rope_theta = 10000.0 and rope_theta = 500000.0",
    ),
    (
        {"rope_scaling": {"type": "linear", "factor": 2.0}},
        "gives the rope scaling twice and they disagree: rope_parameters = None and rope_scaling = {'type': 'linear'",
    ),
    (
        {"rope_parameters": {"rope_type": "linear", "factor": 1e-300, "rope_theta": 10000.0}},
        "gives rotary frequencies that are not finite and positive",
    ),
    (
        {"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 1e-300}},
        "gives rotary frequencies that are not finite and positive",
    ),
    (
        {"rope_parameters": {"rope_type": "linear", "factor": "2"}},
        "rope_parameters factor must be a finite number",
    ),
    (  # one rotary per layer type: the sliding layers' was silently dropped
        {
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "sliding_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            }
        },
        "gives the layer types different rotary settings: rope_parameters.full_attention = {'rotary_dim': 8, "
        "'rope_theta': 10000.0, 'rope_scaling': None} and rope_parameters.sliding_attention",
    ),
    (
        {"rope_parameters": {"full_attention": {"rope_theta": 10000.0}, "rope_theta": 1e6}},
        "rope_parameters mixes per-layer-type entries (full_attention) with 'rope_theta'",
    ),
    (
        {"rope_parameters": {"sliding_attention": [1e6]}},
        "config.json rope_parameters sliding_attention must be a JSON object (or null), got list",
    ),
]


@pytest.mark.parametrize("change, message", GPT2_BAD, ids=[next(iter(c)) + str(i) for i, (c, _) in enumerate(GPT2_BAD)])
def test_gpt2_config_fields_of_the_wrong_type_are_refused(gpt2_config, change, message):
    from attn_core.hf import model_config

    with pytest.raises(CheckpointError) as e:
        model_config({**gpt2_config, **change})
    assert message in one_line(e)


@pytest.mark.parametrize(
    "change, message", ROTARY_BAD, ids=[next(iter(c)) + str(i) for i, (c, _) in enumerate(ROTARY_BAD)]
)
def test_rotary_config_fields_are_refused_not_coerced_or_dropped(mistral_config, change, message):
    from attn_core.hf import model_config

    with pytest.raises(CheckpointError) as e:
        model_config({**mistral_config, **change})
    assert message in one_line(e)


def test_both_spellings_that_agree_are_one_model(mistral_config):
    from attn_core.hf import model_config

    both = {**mistral_config, "rope_theta": 10000, "rope_scaling": None, "layer_types": ["sliding_attention"] * 2}
    assert model_config(both) == model_config(mistral_config)
    one_full = {**mistral_config, "layer_types": ["full_attention", "sliding_attention"]}
    assert model_config(one_full).sliding_window == [0, WINDOW]
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    per_type = {**mistral_config, "rope_parameters": {"full_attention": rope, "sliding_attention": {**rope}}}
    assert model_config(per_type) == model_config(mistral_config)
    only_sliding = {**mistral_config, "rope_parameters": {"sliding_attention": {**rope, "rope_theta": 5e5}}}
    assert model_config(only_sliding).rope_theta == 5e5  # read, not dropped for the default


def test_a_rope_factor_of_1e_300_is_refused_at_load_in_either_format(mistral, tmp_path):
    """No null scores, no 'plane 0 (omega inf)', no svd crash on the Spectrum page: the model does not load."""
    folder = _copy(mistral, tmp_path / "hf")
    raw = json.loads((folder / "config.json").read_text())
    raw["rope_parameters"] = {"rope_type": "linear", "factor": 1e-300, "rope_theta": 10000.0}
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="not finite and positive") as e:
        resolve(folder)
    one_line(e)
    from attn_core import checkpoint

    ours = tmp_path / "ours"
    checkpoint.save(make_tiny_model(positional="rotary", rope_scaling={"type": "linear", "factor": 2.0}), ours)
    cfg = json.loads((ours / "config.json").read_text())
    cfg["rope_scaling"]["factor"] = 1e-300
    (ours / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="not finite and positive"):
        resolve(ours)


# --- tokenizers: bounded in time, panics as one line -------------------------------------------------

# (a|aa)+ backtracks on each run of a's before it fails; 32 a's stay under Oniguruma's retry limit
# (no panic), so the text below costs seconds per segment, minutes in all: only the time bound ends it
SLOW_PATTERN, SLOW_TEXT = r"(?:(?:a|aa)+c)|b", ("a" * 32 + "b") * 600
PANIC_PATTERN, PANIC_TEXT = r"(a+)+$", "a" * 41 + "!"  # beyond the retry limit: the library panics


def _with_tokenizer(src: Path, dst: Path, pattern: str) -> Path:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    folder = _copy(src, dst)
    vocab = {w: i for i, w in enumerate(["[UNK]", "a", "b", "aa", "c"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    (folder / "tokenizer.json").write_text(tok.to_str())
    return folder


def test_tokenizing_is_bounded_in_time_and_a_panic_is_one_sentence(mistral, tmp_path):
    from attn_core.hf.tokenizer import encode, load_tokenizer
    from attn_core.limits import LimitError

    slow = load_tokenizer(_with_tokenizer(mistral, tmp_path / "slow", SLOW_PATTERN))
    with pytest.raises(LimitError, match="tokenizing the text took longer than 0.5 s, the limit") as e:
        encode(slow, SLOW_TEXT, timeout_s=0.5)
    assert "pre-tokenizer" in one_line(e)
    sane = slow.encode("ab aab", add_special_tokens=False).ids
    assert encode(slow, "ab aab") == sane and 2 in sane  # a sane text through the same tokenizer, in time
    panics = load_tokenizer(_with_tokenizer(mistral, tmp_path / "panic", PANIC_PATTERN))
    with pytest.raises(CheckpointError, match="tokenizer.json: tokenizing the text failed .*retry-limit") as e:
        encode(panics, PANIC_TEXT)
    one_line(e)


@pytest.mark.parametrize(
    "pattern, text, message, kind",
    [
        (SLOW_PATTERN, SLOW_TEXT, "tokenizing the text took longer than 5 s, the limit", "limit"),
        (PANIC_PATTERN, PANIC_TEXT, "tokenizer.json: tokenizing the text failed (Onig: Regex search error", "model"),
    ],
    ids=["backtracks", "panics"],
)
def test_cli_tokenizing_hostile_text_is_one_line(mistral, tmp_path, pattern, text, message, kind):
    import subprocess
    import sys

    folder = _with_tokenizer(mistral, tmp_path / "m", pattern)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "attn_core", "scores", str(folder), "--tokens", text, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), "RUST_BACKTRACE": "1"},
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "panicked" not in proc.stderr and "Traceback" not in proc.stderr
    assert message in proc.stderr
    assert json.loads(proc.stdout)["kind"] == kind


# --- refusals, not internal errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, text, message",
    [
        ("n_embd", "1e400", "n_embd must be an integer, got inf (not a finite number)"),
        ("activation_function", '["gelu"]', "activation ['gelu'] is not supported"),
    ],
)
def test_cli_config_of_the_wrong_type_is_a_refusal(tmp_path, field, text, message):
    from typer.testing import CliRunner

    from attn_core.cli import app

    write_tiny_gpt2(tmp_path)
    config = tmp_path / "config.json"
    raw = json.loads(config.read_text())
    raw[field] = "@@"
    config.write_text(json.dumps(raw).replace('"@@"', text))  # JSON's 1e400, not Python's
    res = CliRunner().invoke(app, ["scores", str(tmp_path), "--json"])
    assert res.exit_code == 2, res.output
    assert json.loads(res.stdout) == {"error": res.stderr.strip().removeprefix("error: "), "kind": "model"}
    assert message in res.stderr


def test_heads_on_a_large_vocabulary_under_a_memory_cap_is_a_refusal(tmp_path):
    """A vocabulary of 2^18 tokens: 32 x 64 logits need 2 GiB. Under ``ulimit -v`` (RLIMIT_AS) the
    machine's free memory is not what the process can have: refused by the memory check (it was
    "can't allocate 2147483648 bytes", exit 1)."""
    import resource
    import subprocess
    import sys

    from attn_core import checkpoint

    checkpoint.save(make_tiny_model(d_vocab=2**18, n_ctx=64), tmp_path / "big-vocab", card={})
    root = Path(__file__).resolve().parents[2]
    cap = 3 * 2**30

    def capped():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = subprocess.run(
        [sys.executable, "-m", "attn_core", "heads", str(tmp_path / "big-vocab"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"},
        preexec_fn=capped,
    )
    assert proc.returncode == 2, proc.stderr
    err = json.loads(proc.stdout)
    assert err["kind"] == "limit" and "needs about 2 GiB of memory; the limit is" in err["error"], err


def test_an_allocation_that_fails_anyway_is_one_limit_line():
    from attn_core.cli.common import out_of_memory

    torch_says = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 2147483648 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert (
        out_of_memory(torch_says)
        == "not enough memory: an allocation of 2 GiB failed (a memory cap?); use smaller sizes"
    )
