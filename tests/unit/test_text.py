"""Text as a task (attn_core.text): the inputs users have (.txt file or folder, .jsonl, Parquet),
tokenized once into the cache by the model's own tokenizer.json, cut into blocks with a
held-out split, sampled deterministically; bad input is one line and leaves nothing behind;
held-out measurement in chunks equals one dense computation; memory does not grow with the
corpus."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_core.text import child
from attn_core.text import corpus as C
from attn_core.text import measure as M
from attn_core.text.corpus import TextError, open_corpus
from attn_core.text.source import folder_tokenizer, tokenize_text
from attn_core.text.task import TextData, check_block, default_batch, split_streams, step_bytes_per_block, text_task
from tests.text_corpus import make_text, write_word_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder(tokenizer_folder):
    return tokenizer_folder


def ids(text: str) -> list[int]:
    return [int(w[1:]) for w in text.split()]


def tokenized(folder, path, **kw):
    tok, [(corpus, tf)] = tokenize_text(folder, "m", str(path), cache_root=folder.parent / "runs", **kw)
    return tf


# --- inputs ----------------------------------------------------------------------------------------


def test_txt_file_folder_jsonl_and_parquet_give_the_same_tokens(folder, tmp_path):
    docs = [make_text(seed, lines=5) for seed in range(3)]
    want = [i for d in docs for i in ids(d)]  # no eos: the folder has no config.json naming one
    (tmp_path / "one.txt").write_text("".join(docs))
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    for i, doc in enumerate(docs):
        (d / ("sub" if i == 2 else "") / f"{i}.txt").write_text(doc)
    (d / "notes.md").write_text("w5 w5 w5")  # not a text suffix inside a folder: skipped
    (d / ".hidden.txt").write_text("w7")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": doc, "id": i}) + "\n" for i, doc in enumerate(docs)))
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"body": docs + [None], "n": [1, 2, 3, 4]}), tmp_path / "d.parquet", row_group_size=2)
    for path, field in (("one.txt", None), ("docs", None), ("d.jsonl", None), ("d.parquet", "body")):
        tf = tokenized(folder, tmp_path / path, field=field)
        assert tf.array().tolist() == want, path
        assert tf.meta["documents"] == (1 if path == "one.txt" else 3)
    assert open_corpus(d).names() == ["0.txt", "1.txt", "sub/2.txt"]


def test_documents_are_separated_by_the_models_end_of_text_token(folder, tmp_path):
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": 99}))
    (tmp_path / "d.jsonl").write_text('{"text": "w1 w2"}\n\n{"text": "w3"}\n{"text": null}\n')
    tf = tokenized(folder, tmp_path / "d.jsonl")
    assert tf.array().tolist() == [1, 2, 99, 3, 99] and tf.meta["eos"] == 99


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    docs=st.lists(
        st.lists(st.tuples(st.integers(0, 99), st.sampled_from([" ", "\n", "  ", "\n\n"])), max_size=60),
        min_size=1,
        max_size=5,
    )
)
def test_cut_pieces_tokenize_like_whole_documents(folder, tmp_path, monkeypatch, docs):
    """Pieces cut at line ends (tiny pieces here) give the tokens of each whole document."""
    monkeypatch.setattr(C, "PIECE_CHARS", 16)
    monkeypatch.setattr(child, "BATCH_CHARS", 40)
    texts = ["".join(f"w{i}{sep}" for i, sep in doc) for doc in docs]
    d = Path(tempfile.mkdtemp(dir=tmp_path))
    for i, text in enumerate(texts):
        (d / f"{i:02d}.txt").write_text(text + "w1\n")
    tf = tokenized(folder, d)
    assert tf.array().tolist() == [i for text in texts for i in ids(text) + [1]]


def test_tokenized_once_then_found_in_the_cache(folder, tmp_path):
    path = tmp_path / "c.txt"
    path.write_text(make_text(0))
    first = tokenized(folder, path)
    again = tokenized(folder, path)
    assert not first.cached and again.cached and again.folder == first.folder
    assert first.folder.parent == tmp_path / "runs" / "text-cache"
    assert (first.folder / "tokens.bin").stat().st_size == 2 * first.n_tokens  # uint16 for 100 tokens
    assert isinstance(again.array(), np.memmap)
    path.write_text(make_text(1))  # new content: a new entry
    changed = tokenized(folder, path)
    assert not changed.cached and changed.folder != first.folder
    write_word_tokenizer(folder, 120)  # another tokenizer: a new entry
    assert tokenized(folder, path).folder not in (first.folder, changed.folder)
    assert sorted(p.name.startswith(".") for p in first.folder.parent.iterdir()) == [False] * 3  # no temp left


OTHER_PROCESS = """
import json, sys
sys.path.insert(0, {root!r})
from attn_core.text.source import tokenize_text
tok, [(corpus, tf)] = tokenize_text({folder!r}, "m", {text!r}, cache_root={cache!r})
print(json.dumps(dict(folder=str(tf.folder), cached=tf.cached, tokens=tf.n_tokens)))
"""


def test_two_processes_tokenizing_the_same_text_leave_one_entry(folder, tmp_path):
    """While this process tokenizes, another one tokenizes the same text into the same cache and
    finishes first (it runs from this one's progress callback, so the two overlap for certain):
    its clean-up leaves this live process's temporary folder alone, this one's rename finds the
    entry made meanwhile and uses it, and one entry with the text's tokens is left, nothing else."""
    path = tmp_path / "c.txt"
    path.write_text(make_text(0, lines=400))
    cache = folder.parent / "runs"
    other: list[dict] = []

    def progress(phase: str, done: int, total: int) -> None:
        if phase == "tokenizing" and not other:
            assert [p.name.startswith(".") for p in (cache / "text-cache").iterdir()] == [True]  # ours, in progress
            code = OTHER_PROCESS.format(root=str(ROOT), folder=str(folder), text=str(path), cache=str(cache))
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
            other.append(json.loads(out.stdout.strip().splitlines()[-1]))

    tok, [(corpus, tf)] = tokenize_text(folder, "m", str(path), cache_root=cache, progress=progress)
    assert other and other[0]["cached"] is False  # the other process made the entry, while this one was writing
    assert tf.cached and str(tf.folder) == other[0]["folder"] and tf.n_tokens == other[0]["tokens"]
    assert [p.name for p in (cache / "text-cache").iterdir()] == [tf.folder.name]  # no temporary folder left
    assert tf.array().tolist() == ids(path.read_text())


# --- bad input: one line, nothing saved ---------------------------------------------------------------


def _cache_entries(folder):
    cache = folder.parent / "runs" / "text-cache"
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


@pytest.mark.parametrize(
    "make, field, message",
    [
        (lambda p: p.write_bytes(b"w1 w2 \xff\xfe w3"), None, r"not UTF-8 text \(byte 6 cannot be decoded\)"),
        (lambda p: p.write_bytes(b""), None, "is empty"),
        (lambda p: p.write_text("  \n\n \t"), None, "holds only whitespace: there is no text to tokenize"),
        (lambda p: p.write_bytes(b"w1 w2\x00\x01\x02 w3"), None, r"binary file, not text \(a NUL byte at byte 5\)"),
        (lambda p: p.with_suffix(".jsonl").write_text('{"text": "w1"}\n{"body": "w2"}\n'), None, "line 2 has no field"),
        (lambda p: p.with_suffix(".jsonl").write_text('{"text": "w1"}\n'), "body", "line 1 has no field 'body'"),
        (lambda p: p.with_suffix(".jsonl").write_text("[1, 2]\n"), None, "line 1 is not a JSON object"),
        (lambda p: p.with_suffix(".jsonl").write_text('{"text": 3}\n'), None, "holds int, not text"),
        (lambda p: p.with_suffix(".jsonl").write_text('{"text": \n'), None, "not valid JSON"),
        (lambda p: p.with_suffix(".parquet").write_bytes(b"PAR1 not really"), None, "not a readable Parquet file"),
        (lambda p: p.mkdir(), None, "holds no .txt, .jsonl or .parquet file"),
    ],
    ids=[
        "not-utf8",
        "empty",
        "whitespace",
        "binary",
        "jsonl-missing-field",
        "jsonl-text-field",
        "jsonl-not-object",
        "jsonl-not-string",
        "jsonl-bad-json",
        "parquet-bad",
        "empty-folder",
    ],
)
def test_bad_text_is_one_line_and_leaves_nothing(folder, tmp_path, make, field, message):
    path = tmp_path / "bad.txt"
    make(path)
    target = next(p for p in tmp_path.iterdir() if p.name.startswith("bad"))
    with pytest.raises(TextError, match=message) as e:
        tokenized(folder, target, field=field)
    assert "\n" not in str(e.value)
    assert _cache_entries(folder) == []


def test_parquet_column_that_is_missing_or_not_text(folder, tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": [1, 2], "body": ["w1", "w2"]}), tmp_path / "d.parquet")
    with pytest.raises(TextError, match="column 'text' holds int64, not text"):
        tokenized(folder, tmp_path / "d.parquet")
    with pytest.raises(TextError, match=r"no column 'x' \(its columns: 'text', 'body'\)"):
        tokenized(folder, tmp_path / "d.parquet", field="x")
    assert tokenized(folder, tmp_path / "d.parquet", field="body").array().tolist() == [1, 2]
    (tmp_path / "plain.txt").write_text("w1 w2")
    with pytest.raises(TextError, match=r"--text-field body names a JSON key or a Parquet column, and .* is plain"):
        tokenized(folder, tmp_path / "plain.txt", field="body")
    assert tokenized(folder, tmp_path / "plain.txt", field="text").array().tolist() == [1, 2]  # the default: no harm


def test_fifo_device_missing_and_oversized_paths_are_refused_unopened(folder, tmp_path, monkeypatch):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)  # opening it would block: it must be refused before
    for path, message in ((fifo, "not a regular file"), ("/dev/zero", "not a regular file")):
        with pytest.raises(TextError, match=message):
            tokenized(folder, path)
    d = tmp_path / "d"
    d.mkdir()
    os.mkfifo(d / "x.txt")
    with pytest.raises(TextError, match="not a regular file"):
        tokenized(folder, d)
    with pytest.raises(TextError, match="does not exist"):
        tokenized(folder, tmp_path / "nope.txt")
    (tmp_path / "big.txt").write_text("w1 " * 100)
    monkeypatch.setattr(C, "MAX_CORPUS_BYTES", 100)
    with pytest.raises(ValueError, match=r"300 bytes; the limit of one corpus is 100 bytes"):
        tokenized(folder, tmp_path / "big.txt")
    assert _cache_entries(folder) == []


def test_a_folder_without_tokenizer_json_is_refused(tmp_path):
    (tmp_path / "c.txt").write_text("w1 w2")
    with pytest.raises(TextError, match="needs the model folder's own tokenizer.json, and m has none"):
        folder_tokenizer(tmp_path, "m")


def test_too_little_text_for_a_block_says_what_is_needed(folder, tmp_path):
    (tmp_path / "c.txt").write_text("w1 w2 w3 w4 w5 w6 w7 w8 w9 w10")
    tf = tokenized(folder, tmp_path / "c.txt")
    with pytest.raises(TextError, match=r"has 10 tokens, fewer than the 18 needed .* --eval-text"):
        split_streams(tf, None, 8, 100)
    with pytest.raises(TextError, match=r"held-out text \(--eval-text\) has 10 tokens, fewer than one block of 12"):
        split_streams(_long(folder, tmp_path), tf, 11, 100)
    with pytest.raises(TextError, match="the model has only 5 tokens"):
        split_streams(tf, None, 2, 5)
    long = _long(folder, tmp_path)
    with pytest.raises(TextError, match=r"held-out text \(--eval-text\) is the text trained on"):
        split_streams(long, long, 8, 100)
    with pytest.raises(ValueError, match=r"--block must be an integer in 2..16"):
        check_block(17, 16)
    assert check_block(None, 1024) == 256 and check_block(None, 16) == 16


def _long(folder, tmp_path):
    (tmp_path / "long.txt").write_text(make_text(3))
    return tokenized(folder, tmp_path / "long.txt")


# --- the task ---------------------------------------------------------------------------------------------


def _task(folder, tmp_path, block=8, lines=200):
    (tmp_path / "c.txt").write_text(make_text(0, lines))
    tf = tokenized(folder, tmp_path / "c.txt")
    train, held, _ = split_streams(tf, None, block, 100)
    tok, _ = folder_tokenizer(folder, "m")
    return text_task(TextData(train, held, block, 100, tok, {"files": ["c.txt"], "tokens": tf.n_tokens})), tf


def test_blocks_are_deterministic_and_held_out_blocks_never_overlap_training(folder, tmp_path):
    task, tf = _task(folder, tmp_path)
    stream = tf.array()
    n_held = len(task.data.held_out)
    assert n_held == max(9, int(np.ceil(0.1 * tf.n_tokens))) and len(task.data.train) == tf.n_tokens - n_held
    a, b = task.sample(32, seed=5), task.sample(32, seed=5)
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, task.sample(32, seed=6).tokens)
    assert a.tokens.shape == (32, 8) and a.mask.all() and torch.equal(a.targets[:, :-1], a.tokens[:, 1:])
    train_text = stream[: len(task.data.train)].tolist()
    for row in torch.cat([a.tokens, a.targets[:, -1:]], 1).tolist():  # every block is a window of the train part
        assert any(train_text[s : s + 9] == row for s in range(len(train_text) - 8))
    held = task.sample(task.data.held_out_blocks, seed=0, split="test")
    starts = sorted(int(np.where((np.lib.stride_tricks.sliding_window_view(task.data.held_out, 8) == r).all(1))[0][0])
                    for r in held.tokens.numpy())  # fmt: skip
    assert starts == [8 * i for i in range(task.data.held_out_blocks)]  # each non-overlapping block once
    assert task.names([1, 2]) == ["w1", "w2"] and task.encode("w3 w4") == [3, 4]


def test_text_loss_equals_cross_entropy_of_every_position(folder, tmp_path):
    task, _ = _task(folder, tmp_path)
    batch = task.sample(4, seed=1)
    logits = torch.randn(4, 8, 100, generator=torch.Generator().manual_seed(0))
    dense = sum(-torch.log_softmax(logits[b, t], -1)[batch.targets[b, t]] for b in range(4) for t in range(8)) / 32
    assert torch.allclose(task.loss(logits, batch), dense, atol=1e-5)
    assert torch.allclose(task.loss(logits.flatten(0, 1), batch), dense, atol=1e-5)  # the trainer's flat logits


@pytest.mark.parametrize("chunk_bytes", [1, 4 * 8 * 100 * 3, 2**28])
def test_held_out_measurement_in_chunks_equals_one_forward(folder, tmp_path, tiny_model, monkeypatch, chunk_bytes):
    task, _ = _task(folder, tmp_path)
    model = tiny_model("reverse", std=0.3, d_vocab=100, n_ctx=8, n_layers=2)
    monkeypatch.setattr(M, "CHUNK_BYTES", chunk_bytes)
    got = M.text_metrics(model, task, None, samples=10, seed=3)
    batch = task.sample(10, 3 + M.EVAL_SEED_OFFSET, split="test")
    with torch.no_grad():
        logits, cache = model.run_with_cache(batch.tokens)
    loss = F.cross_entropy(logits.reshape(-1, 100), batch.targets.reshape(-1))
    assert got["loss"] == pytest.approx(float(loss), rel=1e-5) and got["perplexity"] == pytest.approx(
        float(loss.exp()), rel=1e-5
    )
    assert got["samples"] == 10 and got["tokens"] == 80
    assert got["accuracy"] == pytest.approx(float((logits.argmax(-1) == batch.targets).float().mean()))
    A = cache["blocks.1.attn.hook_pattern"][:, 1]  # [b, T, T], head L1H1
    rows = A[:, 1:]  # rows with >= 2 visible keys
    n = torch.arange(2, 9, dtype=torch.float64)
    H = -(rows.double() * rows.double().clamp_min(1e-30).log()).sum(-1) / n.log()
    head = next(r for r in got["per_head"] if r["head"] == "L1H1")
    assert head["entropy_data"] == pytest.approx(float(H.mean()), rel=1e-4)
    assert head["top1_data"] == pytest.approx(float(rows.max(-1).values.mean()), rel=1e-4)
    assert head["singular_values"][0] == pytest.approx(
        float(
            torch.linalg.svdvals(
                model.blocks[1].attn.W_Q[1].detach() @ model.blocks[1].attn.W_K[1].detach().T / 8**0.5
            )[0]
        ),
        rel=1e-4,
    )
    evaluated = task.evaluate(model, samples=10, seed=3)
    assert evaluated["loss"] == pytest.approx(got["loss"], rel=1e-6)


def test_asking_for_more_held_out_blocks_than_there_are_measures_each_once(folder, tmp_path, tiny_model):
    task, _ = _task(folder, tmp_path)
    model = tiny_model("reverse", std=0.3, d_vocab=100, n_ctx=8)
    got = M.evaluate_text(model, task, samples=10**5)
    assert got["samples"] == task.data.held_out_blocks and got["tokens"] == 8 * task.data.held_out_blocks


# --- memory ---------------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    d=st.sampled_from([32, 128, 768, 2048]),
    layers=st.integers(1, 32),
    d_mlp=st.sampled_from([0, 64, 3072]),
    vocab=st.integers(2, 262_144),
    block=st.integers(2, 2048),
    kl=st.sampled_from([0.0, 0.5]),
)
def test_the_default_batch_is_the_largest_power_of_two_within_the_step_budget(d, layers, d_mlp, vocab, block, kl):
    from attn_core.model import ModelConfig
    from attn_core.text.task import MAX_DEFAULT_BATCH, STEP_MEMORY

    cfg = ModelConfig(d_model=d, n_layers=layers, n_heads=4, d_head=d // 4, d_mlp=d_mlp, d_vocab=vocab, n_ctx=block)
    b, per_block = default_batch(cfg, block, kl), step_bytes_per_block(cfg, block, kl)
    assert 1 <= b <= MAX_DEFAULT_BATCH and b & (b - 1) == 0
    assert b == 1 or b * per_block <= STEP_MEMORY  # within the budget (one block even when it is not)
    assert b == MAX_DEFAULT_BATCH or 2 * b * per_block > STEP_MEMORY  # and the largest such


def test_the_default_batch_of_published_shapes_is_what_the_help_says():
    """GPT-2 small at block 256 (the example --batch-size's help gives): 4; the toy-sized models
    of the tests keep the toys' 64; the KL term's extra logits lower it."""
    from attn_core.model import ModelConfig

    gpt2 = ModelConfig(d_model=768, n_layers=12, n_heads=12, d_head=64, d_mlp=3072, d_vocab=50_257, n_ctx=1024)
    assert step_bytes_per_block(gpt2, 256) == 4 * 256 * (4 * 50_257 + 12 * (16 * 768 + 3 * 3072 + 2 * 12 * 256))
    assert default_batch(gpt2, 256) == 4 and default_batch(gpt2, 1024) == 1
    tiny = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_head=8, d_mlp=48, d_vocab=100, n_ctx=64)
    assert default_batch(tiny, 64) == 64
    qwen = ModelConfig(d_model=896, n_layers=24, n_heads=14, d_head=64, d_mlp=4864, d_vocab=151_936, n_ctx=1024)
    assert default_batch(qwen, 256) == 2
    wide = ModelConfig(d_model=32, n_layers=1, n_heads=4, d_head=8, d_mlp=0, d_vocab=200_000, n_ctx=256)
    assert default_batch(wide, 256, kl=0.5) == 2 < default_batch(wide, 256) == 4


MEMORY_BOUND_MIB = 16  # what 44 MiB more text may add to the peak (holding it would add 88 MiB or more)


def _tokenizing_peak(folder, tmp_path, mib: int) -> dict:
    """The peak RSS (MiB) of the child that tokenizes a ``mib`` MiB file (no line ends in 1 MiB
    stretches too), as it reports it in the entry's meta.json."""
    text = tmp_path / f"big-{mib}.txt"
    line = make_text(7, lines=400).replace("\n", " ")
    with open(text, "w") as f:
        while f.tell() < mib * 2**20:
            f.write(line + ("\n" if f.tell() % 3 else ""))
    tf = tokenized(folder, text)
    assert tf.meta["bytes"] >= mib * 2**20 and tf.n_tokens > mib * 2**18
    return tf.meta


def test_tokenizing_a_large_file_does_not_hold_it_in_memory(folder, tmp_path):
    """A 48 MiB corpus and a 4 MiB one, each tokenized by its own child process: the child's
    peak RSS is about the same (the interpreter and the tokenizer, 45-60 MiB here), the larger's
    less than MEMORY_BOUND_MIB more: memory does not grow with the corpus."""
    small, large = (_tokenizing_peak(folder, tmp_path, mib) for mib in (4, 48))
    assert large["peak_rss_mib"] - small["peak_rss_mib"] < MEMORY_BOUND_MIB, (small, large)
    assert small["peak_rss_mib"] > 10  # the child's own figure, not a missing one


def test_perplexity_plot_is_exp_of_the_logged_losses():
    import pandas as pd

    from attn_core.figures.text import perplexity_plot

    log = pd.DataFrame(
        {
            "step": [1, 2, 2, 4],
            "name": ["task_loss", "task_loss", "eval_loss", "eval_loss"],
            "value": [3.0, 2.0, 2.5, 1.5],
        }
    )
    plot = perplexity_plot(log, before=float(np.exp(3.2)))
    train, held = plot.fig.data
    assert list(train.y) == pytest.approx(np.exp([3.0, 2.0]).tolist())
    assert list(held.x) == [0, 2, 4] and list(held.y) == pytest.approx(np.exp([3.2, 2.5, 1.5]).tolist())
    assert set(plot.data["name"]) == {"perplexity (training batch)", "perplexity (held-out)"}


def test_dashboard_text_comes_from_uploads_or_the_data_folder_only(tmp_path, monkeypatch):
    from attn_core.limits import LimitError
    from attn_core.text import files

    data = tmp_path / "data"
    (data / "books").mkdir(parents=True)
    (data / "books" / "a.txt").write_text("w1")
    (data / "b.jsonl").write_text('{"text": "w2"}\n')
    (data / "notes.md").write_text("not listed")
    (tmp_path / "secret.txt").write_text("outside")
    (data / "link.txt").symlink_to(tmp_path / "secret.txt")  # a link leading out is not listed
    monkeypatch.setenv(files.ENV_DATA, str(data))
    assert files.data_files() == ["b.jsonl", "books/", "books/a.txt"]
    assert files.data_path("books/a.txt") == data / "books" / "a.txt"
    for bad in ("../secret.txt", str(tmp_path / "secret.txt"), "link.txt", "books/../../secret.txt"):
        with pytest.raises(TextError, match="outside the data folder|not a name inside"):
            files.data_path(bad)
    with pytest.raises(TextError, match="is not in the data folder"):
        files.data_path("nope.txt")
    monkeypatch.delenv(files.ENV_DATA)
    assert files.data_files() == [] and files.data_root() is None
    with pytest.raises(TextError, match=r"set \$ATTN_LAB_DATA"):
        files.data_path("books/a.txt")
    kept = files.save_upload("My Notes.TXT", b"w1 w2", tmp_path / "runs")
    assert kept.name == "upload.txt" and kept.read_bytes() == b"w1 w2"
    assert files.save_upload("again.txt", b"w1 w2", tmp_path / "runs") == kept  # the same bytes kept once
    with pytest.raises(TextError, match="upload a .txt, .jsonl or .parquet file"):
        files.save_upload("model.safetensors", b"x", tmp_path / "runs")
    monkeypatch.setattr(files, "MAX_UPLOAD_MB", 1e-6)
    with pytest.raises(LimitError, match="the limit is 1e-06 MB"):
        files.save_upload("big.txt", b"w1 w2 w3", tmp_path / "runs")
