"""The text a shipped text model is trained on, and its tokenizer, both made here from files that
ship with the repo (no download), so ``attn-lab train --preset`` reproduces the model.

The corpus is ``assets/text/lab-manual.txt``: this lab's own manual (README.md and docs/*.md,
concatenated once, kept as a file so that later edits of the manual do not change the recipe).
:func:`train_tokenizer` trains a byte-level BPE tokenizer of ``vocab`` tokens on it with Hugging
Face ``tokenizers`` (deterministic: same corpus, same tokenizer.json); :func:`corpus_task` cuts
the corpus's tokens into a :class:`~attn_core.text.task.TextTask`, the last
:data:`~attn_core.training.text_defaults.HELD_OUT_FRACTION` held out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attn_core.destinations import SHIPPED
from attn_core.text.task import TextData, TextTask, text_task
from attn_core.training.text_defaults import HELD_OUT_FRACTION

CORPUS = SHIPPED / "text" / "lab-manual.txt"
MAX_CORPUS_BYTES = 16 * 2**20


def read_corpus(path: Path = CORPUS) -> str:
    """The corpus's text (a regular file of at most 16 MiB, UTF-8)."""
    from attn_core import limits

    return limits.read_file(path, MAX_CORPUS_BYTES, f"the corpus {path.name}").decode("utf-8")


def train_tokenizer(text: str, vocab: int) -> str:
    """A byte-level BPE tokenizer of ``vocab`` tokens trained on ``text``, as tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return tok.to_str(pretty=False)


def corpus_task(text: str, tokenizer_json: str, block: int, name: str) -> TextTask:
    """Next-token prediction on blocks of ``block`` tokens of ``text`` tokenized by
    ``tokenizer_json``; the last :data:`HELD_OUT_FRACTION` of the tokens are held out."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    ids = np.asarray(tok.encode(text).ids, dtype=np.int64)
    cut = int(len(ids) * (1 - HELD_OUT_FRACTION))
    if cut < block + 1 or len(ids) - cut < block + 1:
        raise ValueError(f"the corpus has {len(ids)} tokens: too few for blocks of {block}")
    facts = dict(files=[name], tokens=len(ids), train_tokens=cut, held_out_tokens=len(ids) - cut, block=block)
    return text_task(TextData(ids[:cut], ids[cut:], block, tok.get_vocab_size(), tok, facts))
