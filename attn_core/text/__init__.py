"""Text as a task: a user's corpus, tokenized by the model folder's own tokenizer.json
into a memory-mapped token file cached next to the run store, cut into fixed-length blocks for
next-token prediction with a held-out split.

- ``corpus``: the inputs (a .txt file or a folder of them, .jsonl with a text field, Parquet with a
  text column), checked before reading and streamed in pieces; bad text is one ``TextError``;
- ``tokens``: tokenizing into the cache (``tokenize``, ``TokenFile``, ``cache_dir``);
- ``task``: ``TextTask``, the toys' Task interface on text (blocks, the held-out split);
- ``measure``: held-out loss, perplexity, per-head concentration and spectra, in bounded memory;
- ``source``: the text task of a loaded model (``text_task_for``; a run's held-out block: ``held_out_tokens``, ``held_out_input``), what jobs, the CLI and pages call;
- ``probes``: the inputs sinks and data-space ranks are measured on (a text's windows or task
  samples) and the one call each for them (``measure_sinks``, ``measure_ranks``).
"""

from attn_core import lazy
from attn_core.text.corpus import MAX_CORPUS_BYTES, Corpus, TextError, open_corpus
from attn_core.training.text_defaults import DEFAULT_BLOCK, HELD_OUT_FRACTION

# the corpus checks and the defaults come with the package; tokenizing and the task (torch) when first read
__getattr__, __dir__ = lazy.exports(
    __name__,
    {
        "probes": ("Probes", "measure_ranks", "measure_sinks", "probes"),
        "source": ("held_out_input", "held_out_tokens", "text_task_for"),
        "task": ("TextTask",),
        "tokens": ("TokenFile", "cache_dir", "tokenize"),
    },
)

__all__ = [
    "DEFAULT_BLOCK",
    "HELD_OUT_FRACTION",
    "MAX_CORPUS_BYTES",
    "Corpus",
    "Probes",
    "TextError",
    "TextTask",
    "TokenFile",
    "cache_dir",
    "held_out_input",
    "held_out_tokens",
    "measure_ranks",
    "measure_sinks",
    "open_corpus",
    "probes",
    "text_task_for",
    "tokenize",
]
