"""Shared fixtures. Tests never write into the repository: runs and exports go to tmp paths.

Model factories live here, one each: ``tiny_model`` (a freshly initialised toy Transformer
shaped for a task), ``save_model`` (such a model saved as a named user model, found by the zoo
through ATTN_LAB_MODELS) and ``tiny_gpt2`` (a random GPT-2 folder written by transformers, a
model with no task). Helpers and module-scoped fixtures that cannot take a fixture import the
functions behind them: ``from tests.conftest import make_tiny_model, write_tiny_gpt2``."""

import json
import os

# The toy models are tiny: one intra-op thread is faster than two, and subprocesses (CLI tests,
# the dashboard server) inherit the setting through the environment.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

torch.set_num_threads(1)

# Property tests draw the same examples on every run ("repeatable"), so the suite's verdict does
# not change from one run of the same code to the next; `pytest --hypothesis-profile explore` draws
# new, random ones to look for new counterexamples; a failure found so is fixed and its example
# kept as a test of its own.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("repeatable")


# pytest-xdist (scripts/test.sh runs `-n 2 --dist loadgroup`): every test file is one group, so a
# file's module fixtures are built once, on one worker, unless its tests name groups of their own
# (independent subprocess runs, as in test_scripts.py); the tests that drive Chromium against a
# dashboard server or start a local Ray form one group, run one after another on one worker, so
# that two servers, browsers or Ray clusters never fight over the two cores while the other worker
# goes through the rest. Without xdist the marks change nothing.
HEAVY = "browser-and-ray"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("browser") or item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group(HEAVY), append=False)
        elif not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(autouse=True)
def _isolated_data_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_LAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("ATTN_LAB_MODELS", raising=False)


# --- model factories ------------------------------------------------------------------------------


def make_tiny_model(task: str = "reverse", seed: int = 0, *, std: float | None = None, **config):
    """A freshly initialised toy Transformer with the vocabulary and context of ``task``: one layer,
    two heads, d_model 16, d_head 8 unless ``config`` says otherwise.

    Without ``std`` it is initialised as training initialises it (``init_model(cfg, seed)``). With
    ``std`` every weight is drawn from N(0, std) after ``torch.manual_seed(seed)`` (the global
    generator), so attention is far from uniform, and the model is returned in eval mode."""
    from attn_core.model import ModelConfig, Transformer
    from attn_core.tasks import get_task
    from attn_core.training.trainer import init_model

    t = get_task(task)
    shape = dict(n_layers=1, n_heads=2, d_model=16, d_head=8, d_vocab=t.d_vocab, n_ctx=t.n_ctx)
    cfg = ModelConfig(**{**shape, **config})
    if std is None:
        return init_model(cfg, seed)
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
        if cfg.d_qk is not None:
            model.zero_qk_padding()
    return model


# The kinds of model every formula of the bilinear and circuits tests is checked on (ModelConfig
# changes to a 2-layer, 3-head model): plain factored heads, biases, merged W_QK, grown d_qk, no norm.
MODEL_KINDS = {
    "factored": {},
    "biased": dict(attn_bias=True, d_mlp=16),
    "merged": dict(qk="merged"),
    "grown": dict(d_qk=[[6, 9, 4], [7, 6, 6]]),
    "no_norm_no_pos": dict(normalization="none", positional="none"),
}
# what every record of bilinear.spectrum (and `attn-lab spectrum --json`) holds, at least
SPECTRUM_KEYS = {"layer", "head", "singular_values", "eigenvalues_sym", "stable_rank", "effective_rank"}
SPECTRUM_KEYS |= {"spectral_norm", "nuclear_norm", "frobenius_norm"}


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module's tests, restored after it (the CPU is shared: two
    threads under contention are many times slower than one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tokenizer_folder(tmp_path):
    """A model folder with only a word-level tokenizer.json (w0 .. w99)."""
    from tests.text_corpus import write_word_tokenizer

    f = tmp_path / "model"
    f.mkdir()
    write_word_tokenizer(f)
    return f


@pytest.fixture
def tiny_model():
    """``tiny_model(task="reverse", seed=0, std=None, **config)``: see :func:`make_tiny_model`."""
    return make_tiny_model


@pytest.fixture
def save_model(tmp_path, monkeypatch):
    """``save_model(name, task="reverse", card=None, seed=0, **config)`` saves a tiny model as the
    user model ``name`` (its card ``{"task": task}`` unless ``card`` is given; ``card={}`` makes a
    model without a task) in a folder listed in ATTN_LAB_MODELS, and returns its folder."""

    from attn_core import checkpoint

    root = tmp_path / "models"
    root.mkdir(exist_ok=True)
    monkeypatch.setenv("ATTN_LAB_MODELS", str(root))

    def save(name: str, task: str = "reverse", card=None, seed: int = 0, **config):
        checkpoint.save(
            make_tiny_model(task, seed, **config), root / name, card={"task": task} if card is None else card
        )
        return root / name

    return save


TINY_HF = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48, vocab_size=100)


def write_tiny_hf(folder, family: str, dtype=None, max_shard_size=None, **overrides):
    """A random tiny model of a Hugging Face ``family`` (gpt_neox, llama, mistral, qwen2) built by
    transformers with eager attention and saved into ``folder`` (sharded with
    ``max_shard_size``, in ``dtype`` when given); returns the transformers model as saved, in
    float32 (read back from the folder when saved in another dtype). Weights are drawn far from uniform attention, so comparisons mean something."""
    transformers = pytest.importorskip("transformers")
    config_cls, model_cls = {
        "gpt_neox": (transformers.GPTNeoXConfig, transformers.GPTNeoXForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[family]
    cfg = config_cls(
        **{**TINY_HF, "max_position_embeddings": 64, "attn_implementation": "eager", **overrides},
    )
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3 if p.dim() > 1 else 0.1)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    if dtype is None:
        model.save_pretrained(folder, safe_serialization=True, **kwargs)
        return model
    model.to(dtype).save_pretrained(folder, safe_serialization=True, **kwargs)
    # The reference reads the rounded weights back into float32 (its rotary buffers stay float32).
    return model_cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def write_tiny_gpt2(folder, **overrides):
    """A random GPT-2 (2 layers, 4 heads, d_model 32, 100 tokens, context 16) saved by
    transformers into ``folder`` with a vocab.json; returns the transformers model. Its weights
    are drawn far from uniform attention, so comparisons with it mean something."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=100,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
        **overrides,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3 if p.dim() > 1 else 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "vocab.json").write_text(json.dumps({f"tok{i}": i for i in range(100)}))
    return model


@pytest.fixture
def tiny_gpt2(tmp_path, monkeypatch):
    """A random GPT-2 folder named ``gpt2-tiny`` in a folder listed in ATTN_LAB_MODELS (a model
    with no task); returns its folder."""
    root = tmp_path / "hf-models"
    folder = root / "gpt2-tiny"
    folder.mkdir(parents=True)
    write_tiny_gpt2(folder)
    monkeypatch.setenv("ATTN_LAB_MODELS", str(root))
    return folder


# --- the CLI, as the tests call it --------------------------------------------------------------


def cli_run(*args):
    """``attn-lab ARGS`` in this process (typer's CliRunner); every argument as a string."""
    from typer.testing import CliRunner

    from attn_core.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def cli_json(*args) -> dict:
    """The JSON document of ``attn-lab ARGS --json``, which must succeed."""
    result = cli_run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def cli_main(capsys, *args) -> tuple[int, str, str]:
    """``attn-lab ARGS`` through ``attn_core.cli.main`` (its exit code, stdout, stderr)."""
    from attn_core.cli import main

    with pytest.raises(SystemExit) as done:
        main(list(args))
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


def one_line_error(result, *words, after_progress: bool = False) -> str:
    """A refusal: exit 2 and one ``error:`` line naming ``words``, no traceback; with
    ``after_progress`` progress lines (tokenizing a text) may come before it."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    if not after_progress:
        assert len(lines) == 1, result.stderr
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in result.stderr, result.stderr
    assert all(w in errors[0] for w in words), errors[0]
    return errors[0]


def refused(args: list, message: str) -> str:
    """``attn-lab ARGS --json`` refused with exit 2: its last stderr line names ``message`` and the
    JSON document on stdout carries the same error."""
    res = cli_run(*args, "--json")
    assert res.exit_code == 2, res.output
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and message in line, line
    assert json.loads(res.stdout)["error"] == line.removeprefix("error: ")
    return line


@pytest.fixture(scope="module")
def gpt2_with_text(tmp_path_factory):
    """(folder, text): a GPT-2 folder built by transformers with a word-level tokenizer.json, and a
    text of 60 lines for it (one per test module)."""
    from tests.text_corpus import make_text, write_word_tokenizer

    root = tmp_path_factory.mktemp("gpt2")
    folder = root / "gpt2"
    folder.mkdir()
    write_tiny_gpt2(folder)
    write_word_tokenizer(folder)
    text = root / "text.txt"
    text.write_text(make_text(1, lines=60))
    return folder, text
