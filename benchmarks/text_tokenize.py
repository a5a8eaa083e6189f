"""Tokenizing a corpus into the token cache (``attn_core.text``): throughput and memory.

A corpus of English-like text (pseudo-words from syllables, Zipf-distributed, sentences and
paragraphs) is generated, a byte-level BPE tokenizer (8192 tokens) is trained on its first
megabytes with the ``tokenizers`` library (no download), and a fresh process tokenizes the
corpus into the cache, then samples training batches from the memory-mapped tokens:

    python benchmarks/text_tokenize.py              # 256 MB corpus
    python benchmarks/text_tokenize.py --mb 1024    # the 1 GB case
    python benchmarks/text_tokenize.py --quick      # 4 MB, nothing saved
    python benchmarks/text_tokenize.py --mb 4 --out benchmarks/results/text_tokenize_4mib.json   # another size, its own file

Prints MB/s and tokens/s of tokenizing (hashing included) and of a cache hit (in the same
process: the corpus's hash is remembered), the peak RSS (``VmHWM``) of the child process that
tokenizes (``attn_core.text.child``: it must not grow with the corpus) and the growth of the
calling process's own peak RSS while it waits, and after sampling 100 batches from the memory map
both the peak RSS (which counts the file pages the map touched: page cache, not a copy) and the
anonymous RSS (``RssAnon``: what the process allocated).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import record  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "text_tokenize.json"
BLOCK_MB = 16  # generated once, written as many times as the size needs (lines shuffled each time)

CHILD = """
import json, sys, time
sys.path.insert(0, {root!r})
import torch
from attn_core.text.source import tokenize_text
from attn_core.text.task import TextData
from benchmarks.record import peak_rss_kib as hwm, rss_anon_kib
base, base_anon = hwm(), rss_anon_kib()
t = time.perf_counter()
tok, [(corpus, tf)] = tokenize_text({folder!r}, "bench", {text!r}, cache_root={cache!r})
seconds = time.perf_counter() - t
after_tokenize = hwm()
t = time.perf_counter()
tokenize_text({folder!r}, "bench", {text!r}, cache_root={cache!r})
hit_s = time.perf_counter() - t
arr = tf.array()
data = TextData(arr[: len(arr) * 9 // 10], arr[len(arr) * 9 // 10 :], 256, 8192)
g = torch.Generator().manual_seed(0)
t = time.perf_counter()
for _ in range(100):
    data.generate(64, g, "train")
sample_s = (time.perf_counter() - t) / 100
print(json.dumps(dict(seconds=seconds, hit_s=hit_s, sample_ms=sample_s * 1e3, tokens=tf.n_tokens, bytes=corpus.bytes,
                      base_kib=base, tokenize_kib=after_tokenize, peak_kib=hwm(), cached=tf.cached,
                      child_peak_mib=tf.meta["peak_rss_mib"],
                      anon_growth_kib=rss_anon_kib() - base_anon)))
"""


def words(rng: random.Random, n: int = 6000) -> list[str]:
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    return ["".join(rng.choice(syllables) for _ in range(rng.choice((1, 1, 2, 2, 2, 3, 4)))) for _ in range(n)]


def block(rng: random.Random, mb: float) -> list[str]:
    """Paragraphs of sentences whose words follow Zipf's law, about ``mb`` megabytes."""
    vocab = words(rng)
    weights = [1 / (r + 1) for r in range(len(vocab))]
    lines, size = [], 0
    while size < mb * 2**20:
        sentences = []
        for _ in range(rng.randrange(2, 7)):
            w = rng.choices(vocab, weights, k=rng.randrange(5, 18))
            sentences.append(" ".join(w).capitalize() + rng.choice((".", ".", ".", "?", "!")))
        lines.append(" ".join(sentences))
        size += len(lines[-1]) + 1
    return lines


def write_corpus(path: Path, mb: float) -> int:
    rng = random.Random(0)
    lines = block(rng, min(mb, BLOCK_MB))
    with open(path, "w", encoding="utf-8") as f:
        while f.tell() < mb * 2**20:
            rng.shuffle(lines)
            f.write("\n".join(lines) + "\n")
    return path.stat().st_size


def train_tokenizer(corpus: Path, folder: Path) -> None:
    from tokenizers import ByteLevelBPETokenizer

    sample = folder / "sample.txt"
    with open(corpus, encoding="utf-8") as f:
        sample.write_text(f.read(4 * 2**20), encoding="utf-8")
    tok = ByteLevelBPETokenizer()
    tok.train([str(sample)], vocab_size=8192, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    tok.save(str(folder / "tokenizer.json"))
    sample.unlink()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=256, help="corpus size in MiB")
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 MiB, nothing saved")
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"where to save the JSON (default {RESULTS})")
    args = ap.parse_args()
    mb = 4 if args.quick else args.mb
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus, folder = tmp / "corpus.txt", tmp / "model"
        folder.mkdir()
        t = time.perf_counter()
        size = write_corpus(corpus, mb)
        train_tokenizer(corpus, folder)
        print(f"corpus {size / 2**20:.0f} MiB and tokenizer made in {time.perf_counter() - t:.1f} s", flush=True)
        code = CHILD.format(root=str(ROOT), folder=str(folder), text=str(corpus), cache=str(tmp / "runs"))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
    growth = (r["tokenize_kib"] - r["base_kib"]) / 1024
    result = dict(
        corpus_mib=round(size / 2**20, 1),
        tokens=r["tokens"],
        tokenize_s=round(r["seconds"], 2),
        mib_per_s=round(size / 2**20 / r["seconds"], 1),
        tokens_per_s=round(r["tokens"] / r["seconds"]),
        cache_hit_s=round(r["hit_s"], 2),
        sample_batch_ms=round(r["sample_ms"], 3),
        tokenizing_child_peak_rss_mib=r["child_peak_mib"],
        caller_peak_rss_growth_mib=round(growth, 1),
        peak_rss_growth_with_sampling_mib=round((r["peak_kib"] - r["base_kib"]) / 1024, 1),
        anonymous_rss_growth_after_sampling_mib=round(r["anon_growth_kib"] / 1024, 1),
        tokenizer="byte-level BPE, 8192 tokens (trained here)",
        **record.environment(),
    )
    print(json.dumps(result, indent=2))
    if not args.quick:
        record.save(result, args.out)


if __name__ == "__main__":
    main()
