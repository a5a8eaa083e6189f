"""A text task for a loaded model: its folder's own ``tokenizer.json`` tokenizes the user's text
(``--text``, ``--text-field``, ``--eval-text``, ``--block``) into the token cache, and the
streams become a :class:`~attn_core.text.task.TextTask` of the model's vocabulary and context.

This is where a retrain on text starts (``training.job`` calls :func:`text_task_for`), and
what the CLI and the dashboard call first, with a progress callback, so that the job finds the
corpus already tokenized.
"""

from __future__ import annotations

import time
from pathlib import Path

from attn_core.checkpoint import CheckpointError, LoadedModel
from attn_core.hf.family_export import hf_origin
from attn_core.hf.tokenizer import TOKENIZER, load_tokenizer
from attn_core.text.corpus import TextError, open_corpus
from attn_core.text.task import TextData, TextTask, check_block, split_streams, text_task
from attn_core.text.tokens import Progress, cache_dir, prepare, tokenize, tokenizer_key


def eos_id(loaded: LoadedModel) -> int | None:
    """The end-of-text token put between documents: the origin config's ``eos_token_id`` (the
    first of a list) when it is a token of the model, else None."""
    origin = hf_origin(loaded)
    eos = (origin or {}).get("config", {}).get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    ok = isinstance(eos, int) and not isinstance(eos, bool) and 0 <= eos < loaded.config.d_vocab
    return eos if ok else None


def model_tokenizer(loaded: LoadedModel):
    """(tokenizer, its SHA-256) of the model folder's tokenizer.json; a TextError when it has none."""
    folder = loaded.path if loaded.path is not None and Path(loaded.path).is_dir() else None
    try:
        tok = load_tokenizer(folder) if folder is not None else None
    except CheckpointError as e:
        raise TextError(str(e)) from None
    if tok is None:
        raise TextError(
            f"retraining on text needs the model folder's own {TOKENIZER}, and {loaded.name} has none "
            "(text is tokenized by the model's tokenizer)"
        )
    tok = prepare(tok)
    return tok, tokenizer_key(tok.to_str().encode("utf-8"))


def text_task_for(
    loaded: LoadedModel,
    text: str,
    field: str | None = None,
    eval_text: str | None = None,
    block: int | None = None,
    cache_root: str | Path | None = None,
    progress: Progress | None = None,
) -> TextTask:
    """The text task of ``loaded`` on ``text`` (see the module); ``cache_root`` the run store's
    data directory (the cache is its ``text-cache``); ``progress(phase, done, total)`` follows
    hashing and tokenizing (bytes). Bad text raises TextError, one sentence, and leaves nothing."""
    cfg = loaded.config
    block = check_block(block, cfg.n_ctx)
    corpus = open_corpus(text, field)
    held_corpus = open_corpus(eval_text, field, "--eval-text") if eval_text is not None else None
    tok, tok_sha = model_tokenizer(loaded)
    eos = eos_id(loaded)
    directory = cache_dir(cache_root)
    started = time.perf_counter()
    main = tokenize(corpus, tok, tok_sha, eos, directory, progress)
    held = None
    if held_corpus is not None:
        held_progress = None if progress is None else (lambda phase, d, t: progress(f"{phase} --eval-text", d, t))
        held = tokenize(held_corpus, tok, tok_sha, eos, directory, held_progress)
    train, held_out, split = split_streams(main, held, block, cfg.d_vocab)
    facts = {
        "path": str(corpus.path),
        "files": corpus.names(),
        "field": corpus.field if any(k != "text" for k in corpus.kinds) else None,
        "bytes": corpus.bytes,
        "documents": main.meta["documents"],
        "tokens": main.n_tokens,
        "characters": main.meta["characters"],
        "eval_text": None if held_corpus is None else str(held_corpus.path),
        "held_out": split["held_out"],
        "train_tokens": len(train),
        "held_out_tokens": len(held_out),
        "block": block,
        "eos_token_id": eos,
        "tokenizer_sha256": tok_sha,
        "cache": str(main.folder),
        "cached": main.cached and (held is None or held.cached),
        "tokenize_s": round(time.perf_counter() - started, 3),
        "tokenized_s": main.meta.get("seconds"),
    }
    data = TextData(train, held_out, block, cfg.d_vocab, tok, facts)
    facts["held_out_blocks"] = data.held_out_blocks
    return text_task(data)
