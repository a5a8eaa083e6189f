"""Tokenizing a user's corpus with a user's ``tokenizer.json`` is untrusted work, done here in a
child process (a fresh interpreter, ``python -m attn_core.text.child``) so that nothing it does
reaches the caller, a dashboard's script thread included:

- a Rust panic (``pyo3_runtime.PanicException``, a ``BaseException``), an error of the tokenizer
  (a missing unknown token) and bad text end as one sentence (:class:`TokenizerError`, or the
  corpus's :class:`~attn_core.text.corpus.TextError`);
- memory is bounded (``RLIMIT_AS`` in the child, :func:`memory_bound`): a normalizer that makes text
  thousands of times longer fails there (the library aborts, SIGABRT) and is one sentence here;
- time is bounded by what was read (:data:`BASE_S` and :data:`S_PER_MB` per MB of text read so
  far), so a pre-tokenizer pattern that backtracks without end is killed early, whatever the
  corpus's size;
- progress comes back as it goes, Ctrl-C (and any stop the caller asks for) ends the child at
  once, and the child dies with its parent (``PR_SET_PDEATHSIG``).

The child reads the corpus through :meth:`Corpus.pieces` with the fingerprint the cache key was
made from, so the token file describes exactly the bytes that were hashed (a file changed while
it was tokenized fails), and writes the tokens (with their SHA-256, the cache's checksum) into
the file the caller names.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from attn_core.limits import LimitError
from attn_core.text.corpus import Corpus, TextError

TOKENIZER = "tokenizer.json"
BATCH_CHARS = 2**19  # characters tokenized in one encode_batch call (8 pieces: both cores busy)
BASE_S = 30.0  # seconds the child may take before its first MB (start-up, loading the tokenizer)
S_PER_MB = 20.0  # and per MB of text read (a sane tokenizer takes well under 1 s per MB)
AHEAD_BYTES = 2**20  # bytes of text the time bound allows beyond what was reported done
BASE_MEMORY = 2**30  # address space of the child before the tokenizer and the text (Python, numpy, pyarrow)
PROGRESS_S = 0.2  # seconds between two progress reports of the child
STDERR_KEEP = 4096  # bytes of the child's stderr kept (to tell an allocation failure)

Progress = Callable[[str, int, int], None]


class TokenizerError(TextError):
    """The tokenizer.json failed on the text (a panic, an error of the library, a crash, beyond
    its memory or time bound); the message starts with ``tokenizer.json:``."""


class TokenizerLimit(TokenizerError, LimitError):
    """The tokenizer went beyond its bound of memory or time (an error of kind ``limit``)."""


def dtype_for(vocab_size: int) -> str:
    """The token file's dtype: uint16 when the vocabulary fits, else uint32 (little-endian)."""
    return "<u2" if vocab_size <= 2**16 else "<u4"


def memory_bound(corpus: Corpus, tokenizer_bytes: int) -> int:
    """Bytes of address space the child may use: :data:`BASE_MEMORY`, 32 x the tokenizer.json
    (its parsed tables), 256 bytes per character of a batch (the encodings, their offsets and
    ids), and what the largest file of the corpus needs at once (a Parquet row group: 4 x the
    file; one JSON line: 8 x, at most ``MAX_LINE_BYTES``). At least that, whatever the machine;
    where less memory is free, the machine's own limits act first."""
    from attn_core.text import corpus as C

    largest = {
        kind: max((s for k, s in zip(corpus.kinds, corpus.sizes) if k == kind), default=0)
        for kind in C.SUFFIXES.values()
    }
    return (
        BASE_MEMORY
        + 32 * tokenizer_bytes
        + 256 * BATCH_CHARS
        + 4 * largest["parquet"]
        + 8 * min(largest["jsonl"], C.MAX_LINE_BYTES)
    )


def tokenize_in_child(
    corpus: Corpus,
    tokenizer_json: str,
    eos: int | None,
    out: Path,
    expect: str,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
) -> dict:
    """Tokenize ``corpus`` by ``tokenizer_json`` (its text) into ``out`` in a bounded child (see
    the module); ``expect`` is the corpus's fingerprint (the cache key's). Returns the counts
    (tokens, documents, characters, max_id, dtype, seconds, tokens_sha256, peak_rss_mib). Raises
    TextError (bad or changed text), TokenizerError (the tokenizer failed or went beyond its
    bounds), KeyboardInterrupt (Ctrl-C, or ``stop()`` became true): the child is gone then."""
    from attn_core.text import corpus as C

    request = {
        "path": str(corpus.path),
        "files": [str(f) for f in corpus.files],
        "kinds": list(corpus.kinds),
        "sizes": list(corpus.sizes),
        "field": corpus.field,
        "expect": expect,
        "eos": eos,
        "out": str(out),
        "memory": memory_bound(corpus, len(tokenizer_json)),
        "batch_chars": BATCH_CHARS,
        "piece_chars": C.PIECE_CHARS,
        "read_bytes": C.READ_BYTES,
        "tokenizer": tokenizer_json,
    }
    root = str(Path(__file__).resolve().parents[2])  # the folder attn_core is imported from
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
        "MALLOC_ARENA_MAX": "2",  # glibc reserves 64 MiB of address space per arena otherwise
        "RUST_BACKTRACE": "0",
        "TOKENIZERS_PARALLELISM": "true",
        "ATTN_LAB_PARENT": str(os.getpid()),
        "RAYON_NUM_THREADS": str(
            min(8, max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))
        ),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "attn_core.text.child"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        close_fds=True,
    )
    try:
        return _follow(proc, json.dumps(request).encode(), corpus, progress, stop)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            f.close()


def _follow(proc, request: bytes, corpus: Corpus, progress, stop) -> dict:
    """Send the request, then read the child's reports until its answer, within the bounds."""
    try:
        proc.stdin.write(request)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it ended before reading: said below
    started, done, err, lines = time.monotonic(), 0, b"", b""
    answer = None
    streams = [proc.stdout, proc.stderr]
    while streams:
        limit = BASE_S + S_PER_MB * (done + AHEAD_BYTES) / 2**20
        left = started + limit - time.monotonic()
        if left <= 0:
            proc.kill()
            raise TokenizerLimit(
                f"{TOKENIZER}: tokenizing {corpus.path} took longer than {limit:.0f} s, its time bound ({BASE_S:g} s "
                f"and {S_PER_MB:g} s per MB of text; {done / 2**20:.1f} MB done): its pre-tokenizer pattern may "
                "backtrack without end on this text; nothing was kept"
            )
        if stop is not None and stop():
            raise KeyboardInterrupt
        ready, _, _ = select.select(streams, [], [], min(left, 0.25))
        for stream in ready:
            chunk = os.read(stream.fileno(), 1 << 16)
            if not chunk:
                streams.remove(stream)
            elif stream is proc.stderr:
                err = (err + chunk)[-STDERR_KEEP:]
            else:
                lines += chunk
                *whole, lines = lines.split(b"\n")
                for line in whole:
                    msg = json.loads(line)
                    if "p" in msg:
                        done = msg["p"][1]
                        if progress is not None:
                            progress(*msg["p"])
                    else:
                        answer = msg
    code = proc.wait()
    if answer is not None and "ok" in answer:
        return answer["ok"]
    if answer is not None:
        kinds = {"text": TextError, "limit": LimitError, "tokenizer-limit": TokenizerLimit}
        cls = kinds.get(answer["kind"], TokenizerError)
        raise cls(answer["error"])
    raise _crash(corpus, code, err)


def _crash(corpus: Corpus, code: int, err: bytes) -> TokenizerError:
    """The sentence of a child that ended without an answer (killed, aborted, out of memory)."""
    what = f"{TOKENIZER}: tokenizing {corpus.path}"
    if b"memory allocation of" in err or b"MemoryError" in err or b"std::bad_alloc" in err:
        return TokenizerLimit(
            f"{what} needed more memory than its bound (a normalizer or pre-tokenizer that makes the text many times "
            "longer?); nothing was kept"
        )
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        return TokenizerError(f"{what} crashed ({name}); nothing was kept")
    return TokenizerError(f"{what} ended without an answer (exit status {code}); nothing was kept")


# --- the child ------------------------------------------------------------------------------------


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _die_with_parent(parent: int) -> None:
    """Ask Linux to kill this process when its parent ends (and end now if it already has)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)


def _run(req: dict) -> dict:
    """Tokenize as the request says; the counts of :func:`tokenize_in_child`."""
    import hashlib
    from array import array

    from tokenizers import Tokenizer

    from attn_core.text import corpus as C

    C.PIECE_CHARS, C.READ_BYTES = req["piece_chars"], req["read_bytes"]
    try:
        tok = Tokenizer.from_str(req["tokenizer"])
        tok.no_truncation()
        tok.no_padding()
    except BaseException as e:  # noqa: BLE001 -- a panic is a BaseException
        raise TokenizerError(f"{TOKENIZER}: reading it failed ({_first(e)})") from None
    files = tuple(map(Path, req["files"]))
    corpus = Corpus(Path(req["path"]), files, tuple(req["kinds"]), tuple(req["sizes"]), req["field"])
    dtype = dtype_for(tok.get_vocab_size(with_added_tokens=True))
    code, top = ("H", 2**16 - 1) if dtype == "<u2" else ("I", 2**32 - 1)
    eos = req["eos"]
    counts = {"tokens": 0, "documents": 0, "characters": 0, "max_id": -1, "text_tokens": 0}
    digest, batch, size, blank = hashlib.sha256(), [], 0, True
    last = [0.0]

    def reading(done: int, total: int) -> None:
        if time.monotonic() - last[0] >= PROGRESS_S or done == total:
            last[0] = time.monotonic()
            _say({"p": ["tokenizing", done, total]})

    def flush(fh) -> None:
        try:
            encodings = tok.encode_batch_fast([text for text, _ in batch], add_special_tokens=False)
        except BaseException as e:  # noqa: BLE001 -- the tokenizer's errors and panics
            raise TokenizerError(f"{TOKENIZER}: tokenizing {corpus.path} failed ({_first(e)})") from None
        for enc, (_, ends) in zip(encodings, batch):
            ids = enc.ids
            counts["text_tokens"] += len(ids)
            if ends and eos is not None:
                ids.append(eos)
            if ids:
                counts["max_id"] = max(counts["max_id"], max(ids))
                if counts["max_id"] > top:
                    raise TokenizerError(f"{TOKENIZER} produced id {counts['max_id']}, beyond its own vocabulary")
                values = array(code, ids)
                if sys.byteorder == "big":
                    values.byteswap()
                data = values.tobytes()
                digest.update(data)
                fh.write(data)
                counts["tokens"] += len(ids)
            counts["documents"] += bool(ends)
        batch.clear()

    started = time.perf_counter()
    with open(req["out"], "wb") as fh:
        for text, ends in corpus.pieces(reading, expect=req["expect"]):
            blank = blank and not text.strip()
            batch.append((text, ends))
            size += len(text)
            counts["characters"] += len(text)
            if size >= req["batch_chars"]:
                flush(fh)
                size = 0
        if batch:
            flush(fh)
        fh.flush()
        os.fsync(fh.fileno())
    if blank:
        raise TextError(f"{corpus.path} holds only whitespace: there is no text to tokenize")
    if counts["text_tokens"] == 0:
        raise TokenizerError(f"{TOKENIZER} made no token of the text of {corpus.path} (its normalizer removes it all?)")
    peak = next((int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")), 0)
    return {
        **counts,
        "dtype": dtype,
        "seconds": round(time.perf_counter() - started, 3),
        "tokens_sha256": digest.hexdigest(),
        "peak_rss_mib": round(peak / 1024, 1),
    }


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]


def main() -> None:
    """The child: read the request on stdin, answer on stdout (see :func:`tokenize_in_child`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends it (Ctrl-C reaches both)
    parent = int(os.environ.get("ATTN_LAB_PARENT", os.getppid()))
    _die_with_parent(parent)
    req = json.loads(sys.stdin.buffer.read())
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (req["memory"], req["memory"]))
    except (ImportError, ValueError, OSError):
        pass
    try:
        _say({"ok": _run(req)})
    except TokenizerLimit as e:
        _say({"error": str(e), "kind": "tokenizer-limit"})
    except TokenizerError as e:
        _say({"error": str(e), "kind": "tokenizer"})
    except (TextError, LimitError) as e:
        _say({"error": str(e), "kind": "limit" if isinstance(e, LimitError) else "text"})
    except MemoryError:
        _say(
            {
                "error": f"{TOKENIZER}: tokenizing {req['path']} needed more memory than its bound "
                "(a normalizer or pre-tokenizer that makes the text many times longer?); nothing was kept",
                "kind": "tokenizer-limit",
            }
        )
    except BaseException as e:  # noqa: BLE001 -- anything else of the tokenizer: one sentence
        _say({"error": f"{TOKENIZER}: tokenizing {req['path']} failed ({_first(e)})", "kind": "tokenizer"})
    os._exit(0)


if __name__ == "__main__":
    main()
