"""Text for the tests, made here (no downloads): a word-level tokenizer.json over ``w0 .. w{n-1}``
written into a model folder, and seeded text in those words with structure a model can learn
(each line a random phrase said twice, so its second half is predictable from the first)."""

from __future__ import annotations

import random
from pathlib import Path


def write_word_tokenizer(folder: Path, n: int = 100) -> Path:
    """A tokenizer.json (tokenizers' WordLevel, split on whitespace and punctuation) whose words
    ``w0 .. w{n-1}`` are token ids 0 .. n-1; an unknown word is w0."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(n)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = Path(folder) / "tokenizer.json"
    tok.save(str(path))
    return path


def make_text(seed: int = 0, lines: int = 200, n: int = 100) -> str:
    """``lines`` lines, each a phrase of 3-7 words w1 .. w{n-1} said twice."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        phrase = [f"w{rng.randrange(1, n)}" for _ in range(rng.randrange(3, 8))]
        out.append(" ".join(phrase + phrase))
    return "\n".join(out) + "\n"
