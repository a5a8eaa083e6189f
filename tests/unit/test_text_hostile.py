"""The text surfaces as a hostile user meets them (issue 31): the token cache is untrusted input
(damaged entries are rebuilt, never trusted, never a crash or a hang), a user's tokenizer.json
runs in a bounded child (a panic, an error, an allocation failure or a runaway pattern is one
sentence, Ctrl-C ends it at once), a corpus that changes while it is read keeps nothing, text
folders keep the model folder's rule on links, and uploads are named and kept by their content.
Small corpora and word-level tokenizers built with the ``tokenizers`` library."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attn_core import destinations
from attn_core.checkpoint import CheckpointError
from attn_core.limits import LimitError
from attn_core.text import child, files
from attn_core.text import corpus as C
from attn_core.text import tokens as T
from attn_core.text.child import TokenizerError, TokenizerLimit
from attn_core.text.corpus import TextError, open_corpus
from attn_core.text.source import tokenize_text
from attn_core.untrusted import model_file
from tests.text_corpus import make_text

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folder(tokenizer_folder):
    return tokenizer_folder


def tokenized(folder, path, **kw):
    tok, [(corpus, tf)] = tokenize_text(folder, "m", str(path), cache_root=folder.parent / "runs", **kw)
    return tf


def cache_names(folder) -> list[str]:
    cache = folder.parent / "runs" / "text-cache"
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def with_tokenizer(folder: Path, **changes) -> Path:
    """The folder's tokenizer.json with top-level parts replaced (a normalizer, a pre-tokenizer ...)."""
    data = json.loads((folder / "tokenizer.json").read_text())
    for key, value in changes.items():
        data[key] = {**data[key], **value} if key == "model" else value
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


def children(pid: int, named: str = "") -> list[int]:
    """The live processes whose parent is ``pid`` (and whose command line holds ``named``)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            line = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and named in line:
            out.append(int(stat.parent.name))
    return out


# --- the token cache --------------------------------------------------------------------------------


def _damage(tf: T.TokenFile, how: str) -> None:
    meta, tokens = tf.folder / T.META, tf.folder / T.TOKENS
    m = json.loads(meta.read_text())
    if how == "dtype-object":  # crashed numpy's memmap (SIGSEGV) before
        meta.write_text(json.dumps({**m, "dtype": {"names": ["a"], "formats": ["<u2"], "offsets": [2**40]}}))
    elif how == "meta-fifo":  # opening it blocked for ever before
        meta.unlink()
        os.mkfifo(meta)
    elif how == "shorter-tokens":  # a count that matches the shortened file
        tokens.write_bytes(tokens.read_bytes()[:-200])
        meta.write_text(json.dumps({**m, "tokens": m["tokens"] - 100}))
    elif how == "random-ids":  # in range, same size
        tokens.write_bytes(bytes((7 * i) % 50 if i % 2 == 0 else 0 for i in range(tokens.stat().st_size)))
    elif how == "dtype-changed":  # the same bytes read as uint32
        meta.write_text(json.dumps({**m, "dtype": "<u4", "tokens": m["tokens"] // 2}))
    elif how == "tokens-link":
        tokens.unlink()
        tokens.symlink_to("/dev/zero")
    elif how == "entry-is-a-file":
        shutil.rmtree(tf.folder)
        tf.folder.write_text("x")
    elif how == "meta-deep":
        meta.write_text("[" * 100_000 + "]" * 100_000)
    elif how == "checksum-missing":
        meta.write_text(json.dumps({k: v for k, v in m.items() if k != "tokens_sha256"}))


class TestTokenCacheIsHostileInput:
    @pytest.mark.timeout(120)
    @pytest.mark.parametrize(
        "how",
        [
            "dtype-object",
            "meta-fifo",
            "shorter-tokens",
            "random-ids",
            "dtype-changed",
            "tokens-link",
            "entry-is-a-file",
            "meta-deep",
            "checksum-missing",
        ],
    )
    def test_a_damaged_entry_is_made_again_never_trusted(self, folder, tmp_path, how):
        path = tmp_path / "c.txt"
        path.write_text(make_text(0, lines=60))
        first = tokenized(folder, path)
        want = first.array().tolist()
        _damage(first, how)
        again = tokenized(folder, path)
        assert not again.cached and again.folder == first.folder  # rebuilt in its place
        assert again.array().tolist() == want
        assert cache_names(folder) == [first.folder.name]  # nothing aside, no temporary folder
        assert tokenized(folder, path).cached  # and found the next time

    def test_a_damaged_entry_that_cannot_be_removed_is_named(self, folder, tmp_path):
        """The cache folder made immutable (chattr +i: not even root renames in it): the
        message says which folder to delete."""
        path = tmp_path / "c.txt"
        path.write_text(make_text(0, lines=20))
        first = tokenized(folder, path)
        _damage(first, "random-ids")
        cache = first.folder.parent
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(cache)]).returncode != 0:
            pytest.skip("chattr +i is not available here")
        try:
            with pytest.raises(OSError, match=f"the token cache entry {first.folder} is damaged .*checksum") as e:
                tokenized(folder, path)
        finally:
            subprocess.run(["chattr", "-i", str(cache)], check=True)
        assert str(e.value).endswith("delete that folder and run again")

    def test_temporary_folders_of_a_killed_tokenization_are_removed(self, folder, tmp_path):
        cache = folder.parent / "runs" / "text-cache"
        cache.mkdir(parents=True)
        gone = subprocess.Popen(["true"])
        gone.wait()
        live = subprocess.Popen(["sleep", "60"])
        try:
            dead = cache / f".{'a' * 40}.tmp-{destinations._HOST}-{gone.pid}-abc123"
            alive = cache / f".{'b' * 40}.tmp-{destinations._HOST}-{live.pid}-abc123"
            old = cache / f".{'c' * 40}.tmp-0000beef-1-abc123"  # another host's, three days old
            for d in (dead, alive, old):
                d.mkdir()
                (d / T.TOKENS).write_bytes(b"\0" * 10)
            os.utime(old, (time.time() - 3 * 86400,) * 2)
            path = tmp_path / "c.txt"
            path.write_text(make_text(0, lines=20))
            tf = tokenized(folder, path)
            assert cache_names(folder) == sorted([tf.folder.name, alive.name])
        finally:
            live.kill()
            live.wait()

    def test_a_file_rewritten_and_its_time_set_back_is_tokenized_again(self, folder, tmp_path):
        """The same size and modification time, other bytes: the change time tells (no user
        can set it back), so the corpus is hashed again and a new entry made."""
        path = tmp_path / "c.txt"
        path.write_text("w1 w2 w3 w4\n")
        first = tokenized(folder, path)
        st = os.stat(path)
        path.write_text("w5 w6 w7 w8\n")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        again = tokenized(folder, path)
        assert not again.cached and again.array().tolist() == [5, 6, 7, 8] != first.array().tolist()


class TestACorpusChangedWhileReadKeepsNothing:
    @pytest.mark.parametrize("how", ["rewrite", "truncate", "append", "rewrite-and-restore"])
    def test_the_reader_refuses_text_that_changed_under_it(self, tmp_path, monkeypatch, how):
        monkeypatch.setattr(C, "PIECE_CHARS", 64)
        monkeypatch.setattr(C, "READ_BYTES", 64)
        path = tmp_path / "c.txt"
        original = make_text(0, lines=40)
        path.write_text(original)
        corpus = open_corpus(path)
        pieces = corpus.pieces(expect=corpus.fingerprint())
        next(pieces)
        if how == "rewrite":
            path.write_text(original.replace("w", "v"))
        elif how == "truncate":
            os.truncate(path, 100)
        elif how == "append":
            with open(path, "a") as f:
                f.write("w1 w2\n")
        else:
            path.write_text(original[::-1])
            path.write_text(original)
        with pytest.raises(TextError, match="changed while it was read .* nothing was kept"):
            list(pieces)

    def test_a_file_changed_before_the_child_reads_it_is_not_cached(self, folder, tmp_path):
        """Changed after it was hashed (the cache key) and before it was tokenized: nothing is
        kept; restored, it is tokenized from what it holds."""
        path = tmp_path / "c.txt"
        original = make_text(0, lines=60)
        path.write_text(original)

        def change(phase, done, total):
            if phase == "hashing" and done == total:
                with open(path, "a") as f:
                    f.write("w9 " * 1000)

        with pytest.raises(TextError, match="changed while it was read"):
            tokenized(folder, path, progress=change)
        assert cache_names(folder) == []
        path.write_text(original)
        tf = tokenized(folder, path)
        assert not tf.cached and tf.array().tolist() == [int(w[1:]) for w in original.split()]


# --- the tokenizer in its bounded child -----------------------------------------------------------------


class TestTokenizerInABoundedChild:
    def test_a_normalizer_that_expands_text_ends_at_the_memory_bound(self, folder, tmp_path, monkeypatch):
        monkeypatch.setattr(child, "BASE_MEMORY", 512 * 2**20)
        with_tokenizer(folder, normalizer={"type": "Replace", "pattern": {"String": " "}, "content": "x" * 2000})
        path = tmp_path / "c.txt"
        path.write_text("w1 w2 " * 40_000)
        started = time.monotonic()
        with pytest.raises(TokenizerLimit, match=r"^tokenizer.json: tokenizing .* needed more memory than its bound"):
            tokenized(folder, path)
        assert time.monotonic() - started < 60 and cache_names(folder) == []

    def test_a_panic_reading_the_tokenizer_is_one_sentence_and_prints_nothing(self, folder, tmp_path, capfd):
        with_tokenizer(folder, normalizer={"type": "Precompiled", "precompiled_charsmap": "AAAA//8AAQID"})
        (tmp_path / "c.txt").write_text("w1 w2")
        with pytest.raises(TextError, match=r"^tokenizer.json: reading it failed \(Precompiled: ") as e:
            tokenized(folder, tmp_path / "c.txt")
        assert "\n" not in str(e.value)
        assert "panicked" not in capfd.readouterr().err

    @pytest.mark.parametrize(
        "changes, text, message",
        [
            (
                {
                    "pre_tokenizer": {
                        "type": "Split",
                        "pattern": {"Regex": "(a+)+b"},
                        "behavior": "Isolated",
                        "invert": False,
                    }
                },
                "w1 " + "a" * 40 + "c w2",
                r"failed \(Onig: Regex search error: retry-limit-in-match over\)",
            ),
            ({"model": {"unk_token": "[UNK]"}}, "w1 unknown w2", r"failed \(WordLevel error: Missing \[UNK\] token"),
        ],
        ids=["regex-panic", "missing-unknown-token"],
    )
    def test_a_tokenizer_error_or_panic_is_one_sentence(self, folder, tmp_path, changes, text, message):
        with_tokenizer(folder, **changes)
        (tmp_path / "c.txt").write_text(text)
        with pytest.raises(TokenizerError, match=r"^tokenizer.json: tokenizing .*" + message) as e:
            tokenized(folder, tmp_path / "c.txt")
        assert "\n" not in str(e.value) and cache_names(folder) == []

    def test_typed_text_with_a_lone_surrogate_is_one_sentence(self, folder):
        """Undecodable bytes of a command line arrive as lone surrogates ($'\\xff' is '\\udcff')."""
        from attn_core.hf.tokenizer import encode, load_tokenizer

        with pytest.raises(ValueError, match=r"character 4 is a lone surrogate, '\\udcff'"):
            encode(load_tokenizer(folder), "w1 \udcff w2")

    def test_a_runaway_pattern_is_killed_at_the_time_bound(self, folder, tmp_path, monkeypatch):
        """``\\s+$`` is quadratic on a long run of spaces (about 9 s for 20,000 here): with a bound of
        1 s plus 1 s per MB, the child is killed after about a second, and is gone."""
        monkeypatch.setattr(child, "BASE_S", 1.0)
        monkeypatch.setattr(child, "S_PER_MB", 1.0)
        with_tokenizer(
            folder,
            pre_tokenizer={"type": "Split", "pattern": {"Regex": r"\s+$"}, "behavior": "Isolated", "invert": False},
        )
        (tmp_path / "c.txt").write_text("w1" + " " * 40_000 + "w2")
        before = set(children(os.getpid()))  # other tests of the session may have left their own
        started = time.monotonic()
        with pytest.raises(TokenizerLimit, match=r"took longer than 2 s, its time bound \(1 s and 1 s per MB") as e:
            tokenized(folder, tmp_path / "c.txt")
        assert time.monotonic() - started < 20 and isinstance(e.value, LimitError)  # unbounded, it runs ~36 s
        assert set(children(os.getpid())) <= before and cache_names(folder) == []

    def test_progress_comes_back_and_a_stop_ends_the_child(self, folder, tmp_path):
        path = tmp_path / "c.txt"
        path.write_text(make_text(1, lines=400))
        seen = []
        tokenized(folder, path, progress=lambda *p: seen.append(p))
        assert seen[-1] == ("tokenizing", path.stat().st_size, path.stat().st_size)
        made = cache_names(folder)
        path.write_text(make_text(2, lines=400))
        before = set(children(os.getpid()))  # other tests of the session may have left their own
        with pytest.raises(KeyboardInterrupt):
            tokenized(folder, path, stop=lambda: True)
        assert set(children(os.getpid())) <= before and cache_names(folder) == made

    def test_ctrl_c_ends_the_child_at_once(self, folder, tmp_path):
        """SIGINT to a process whose child runs a runaway pattern: both are gone (the child ignores
        SIGINT; its parent kills it). The test waits for what it needs, never for a
        time: the parent prints ``read`` once its child has reported the whole text read (the child
        then runs the pattern, about 15 minutes unbounded), and its time bound is an hour, so only
        Ctrl-C can end the child before the test's own bound."""
        with_tokenizer(
            folder,
            pre_tokenizer={"type": "Split", "pattern": {"Regex": r"\s+$"}, "behavior": "Isolated", "invert": False},
        )
        (tmp_path / "c.txt").write_text("w1" + " " * 200_000 + "w2")
        code = (  # the parent's side of the child, without torch (which takes long to import)
            "import sys\n"
            f"sys.path.insert(0, {str(ROOT)!r})\n"
            "from pathlib import Path\n"
            "from attn_core.text import child, corpus\n"
            "child.BASE_S = 3600.0\n"
            "def progress(what, done, total):\n"
            "    if done == total:\n"
            "        print('read', flush=True)\n"
            f"c = corpus.open_corpus({str(tmp_path / 'c.txt')!r})\n"
            f"tok = Path({str(folder / 'tokenizer.json')!r}).read_text()\n"
            f"child.tokenize_in_child(c, tok, None, Path({str(tmp_path / 'tokens.bin')!r}), c.fingerprint(), progress=progress)\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            line = proc.stdout.readline()  # the child has read the text: it runs the pattern now
            assert line == "read\n", proc.communicate()[1]
            [worker] = children(proc.pid, "attn_core.text.child")
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=300)  # a parent that waited for its child would take ~15 min
        finally:
            proc.kill()
        assert proc.returncode == -signal.SIGINT and err.rstrip().endswith("KeyboardInterrupt"), err
        assert not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]


# --- text folders: links and unreadable parts ----------------------------------------------------------


def _unprivileged(code: str) -> str:
    """Run ``code`` (the standard library and attn_core's light modules only) as a process that
    file modes apply to (as root: uid nobody, no capabilities)."""
    cmd = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: file modes cannot be made to apply")
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--bounding-set=-all", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if "No module named 'attn_core'" in out.stderr:
        pytest.skip("the repository cannot be read by an unprivileged user here")
    return out.stdout + out.stderr


@pytest.fixture
def open_tmp():
    """A folder every user may enter (pytest's own is private to its user)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="attn-lab-test-"))
    d.chmod(0o755)
    yield d
    for p in d.rglob("*"):
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(d)


class TestTextFolders:
    def test_a_link_leading_out_is_refused_and_one_inside_is_read_once(self, tmp_path):
        outside = tmp_path / "secret.txt"
        outside.write_text("w1")
        d = tmp_path / "docs"
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "a.txt").write_text("w2")
        (d / "same.txt").symlink_to(d / "sub" / "a.txt")  # inside: read
        (d / "again").symlink_to(d / "sub")  # a folder inside: skipped (its files are read where they are)
        assert open_corpus(d).names() == ["same.txt", "sub/a.txt"]
        (d / "leak.txt").symlink_to(outside)
        with pytest.raises(TextError, match=r"leak.txt is a link leading outside the folder .*docs"):
            open_corpus(d)
        (d / "leak.txt").unlink()
        (d / "out").symlink_to(tmp_path)
        with pytest.raises(TextError, match="out is a link leading outside the folder"):
            open_corpus(d)

    def test_link_loops_are_one_sentence(self, tmp_path, monkeypatch):
        (tmp_path / "a.txt").symlink_to(tmp_path / "b.txt")
        (tmp_path / "b.txt").symlink_to(tmp_path / "a.txt")
        with pytest.raises(TextError, match="is a dangling link or a link loop"):
            open_corpus(tmp_path / "a.txt")
        d = tmp_path / "docs"
        d.mkdir()
        (d / "ok.txt").write_text("w1")
        (d / "x.txt").symlink_to(d / "y.txt")
        (d / "y.txt").symlink_to(d / "x.txt")
        with pytest.raises(TextError, match=r"x.txt cannot be read \(a link loop\)"):
            open_corpus(d)
        monkeypatch.setenv(files.ENV_DATA, str(d))  # the dashboard's data folder: not listed, one sentence
        assert files.data_files() == ["ok.txt"]
        with pytest.raises(TextError, match="is a dangling link or a link loop"):
            files.data_path("x.txt")
        with pytest.raises(CheckpointError, match="Too many levels of symbolic links"):  # a model folder's too
            from attn_core.untrusted import read_model_file

            read_model_file(d, "x.txt", 100)
        assert model_file(d, "ok.txt") == d / "ok.txt"

    def test_an_unreadable_subfolder_is_refused_like_an_unreadable_file(self, open_tmp):
        d = open_tmp / "docs"
        (d / "locked").mkdir(parents=True)
        (d / "a.txt").write_text("w1")
        (d / "locked" / "b.txt").write_text("w2")
        (d / "locked").chmod(0o000)
        code = (
            "from attn_core.text.corpus import open_corpus, TextError\n"
            "try:\n"
            f"    print(open_corpus({str(d)!r}).names())\n"
            "except TextError as e:\n"
            "    print('TextError:', e)\n"
        )
        try:
            out = _unprivileged(code)
        finally:
            (d / "locked").chmod(0o755)
        assert f"TextError: --text: the folder {d / 'locked'} cannot be read (Permission denied)" in out, out


# --- uploads ------------------------------------------------------------------------------------------------


class TestUploads:
    @pytest.mark.parametrize(
        "name, message",
        [
            ("evil.csv", r"upload a .txt, .jsonl or .parquet file, not 'evil.csv'"),
            ("", "has no usable name"),
            ("a\x00b.txt", "has no usable name"),
            ("x\udcff.txt", "has no usable name"),
            (None, "has no usable name"),
        ],
        ids=["csv", "empty", "nul", "surrogate", "none"],
    )
    def test_a_bad_name_is_one_sentence(self, tmp_path, name, message):
        with pytest.raises(TextError, match=message) as e:
            files.save_upload(name, b"w1 w2", tmp_path / "runs")
        assert "\n" not in str(e.value)
        assert not (tmp_path / "runs").exists()

    def test_uploads_are_kept_by_their_content(self, tmp_path):
        a = files.save_upload("notes.txt", b"w1 w2", tmp_path / "runs")
        b = files.save_upload("notes.txt", b"w3 w4", tmp_path / "runs")  # the same name and size
        assert a != b and a.read_bytes() == b"w1 w2" and b.read_bytes() == b"w3 w4"
        a.write_bytes(b"w9 w9")  # a kept file that no longer holds its bytes is written again
        assert files.save_upload("again.txt", b"w1 w2", tmp_path / "runs") == a and a.read_bytes() == b"w1 w2"
        assert files.upload_name("C:\\Users\\me\\My Notes.TXT") == "My Notes.TXT"

    @pytest.mark.parametrize(
        "name, data, message",
        [
            ("s.jsonl", b'{"text": "w1 \\ud800 w2"}\n', r"line 1: field 'text' holds a lone surrogate"),
            ("e.txt", b" \n\t \n", "holds only whitespace: there is no text to tokenize"),
        ],
        ids=["jsonl-lone-surrogate", "whitespace"],
    )
    def test_bad_uploaded_text_is_one_sentence_in_the_pages_words(self, folder, tmp_path, name, data, message):
        kept = files.save_upload(name, data, tmp_path / "runs")
        with pytest.raises(TextError, match=message) as e:
            tokenized(folder, kept)
        said = files.page_message(e.value, {kept: name})
        assert said.startswith(name) and str(tmp_path) not in said and "\n" not in said

    def test_parquet_with_duplicate_columns_is_one_sentence(self, folder, tmp_path):
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        table = pa.Table.from_arrays([pa.array(["w1"]), pa.array(["w2"])], names=["text", "text"])
        pq.write_table(table, tmp_path / "d.parquet")
        with pytest.raises(TextError, match="has 2 columns named 'text'"):
            tokenized(folder, tmp_path / "d.parquet")

    def test_page_message_names_no_flag_and_no_store_path(self, tmp_path):
        kept = tmp_path / "runs" / files.UPLOADS / "abc" / "upload.jsonl"
        error = TextError(f"{kept} line 2 has no field 'text' (its fields: 'body'); name the text with --text-field")
        said = files.page_message(error, {kept: "mine.jsonl"})
        assert said == "mine.jsonl line 2 has no field 'text' (its fields: 'body'); name it in the Text field box"
