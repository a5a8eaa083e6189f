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
from attn_core.hf.family_export import folder_origin
from attn_core.hf.tokenizer import TOKENIZER, load_tokenizer
from attn_core.sources import weights_path
from attn_core.text.corpus import DEFAULT_FIELD, TextError, open_corpus
from attn_core.text.task import TextData, TextTask, check_block, split_streams, text_task
from attn_core.text.tokens import Progress, cache_dir, prepare, tokenize, tokenizer_key


def eos_id(folder: Path, vocab_size: int) -> int | None:
    """The end-of-text token put between documents: ``eos_token_id`` (the first of a list) of the
    config the model came from (``hf.family_export.folder_origin``) when it is a token of the
    tokenizer, else None."""
    origin = folder_origin(folder)
    eos = (origin or {}).get("config", {}).get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    ok = isinstance(eos, int) and not isinstance(eos, bool) and 0 <= eos < vocab_size
    return eos if ok else None


def folder_tokenizer(folder: Path | None, name: str):
    """(tokenizer, its SHA-256) of a model folder's tokenizer.json; a TextError when it has none."""
    folder = Path(folder) if folder is not None and Path(folder).is_dir() else None
    try:
        tok = load_tokenizer(folder) if folder is not None else None
    except CheckpointError as e:
        raise TextError(str(e)) from None
    if tok is None:
        raise TextError(
            f"retraining on text needs the model folder's own {TOKENIZER}, and {name} has none "
            "(text is tokenized by the model's tokenizer)"
        )
    tok = prepare(tok)
    return tok, tokenizer_key(tok.to_str().encode("utf-8"))


def model_folder(source: str, store=None) -> Path:
    """The folder of a source's weights (a Hugging Face folder, a run's folder), found without
    loading the model."""
    return weights_path(source, store).parent


def tokenize_text(
    folder: Path | None,
    name: str,
    text: str,
    field: str | None = None,
    eval_text: str | None = None,
    cache_root: str | Path | None = None,
    progress: Progress | None = None,
    stop=None,
):
    """(tokenizer, [(corpus, token file)] of ``text`` and, when given, ``eval_text``): tokenized by
    the folder's tokenizer into the cache (found there when done before), in a bounded child
    (``text.child``); ``stop()`` true ends it as Ctrl-C does."""
    corpus = open_corpus(text, field)
    held_corpus = open_corpus(eval_text, field, "--eval-text") if eval_text is not None else None
    kinds = {k for c in (corpus, held_corpus) if c is not None for k in c.kinds}
    if field not in (None, DEFAULT_FIELD) and kinds == {"text"}:
        raise TextError(
            f"--text-field {field} names a JSON key or a Parquet column, and {corpus.path} is plain text "
            "(.jsonl and .parquet files have fields)"
        )
    tok, tok_sha = folder_tokenizer(folder, name)
    eos = eos_id(folder, tok.get_vocab_size(with_added_tokens=True))
    directory = cache_dir(cache_root)
    done = [(corpus, tokenize(corpus, tok, tok_sha, eos, directory, progress, stop))]
    if held_corpus is not None:
        held_progress = None if progress is None else (lambda phase, d, t: progress(f"{phase} --eval-text", d, t))
        done.append((held_corpus, tokenize(held_corpus, tok, tok_sha, eos, directory, held_progress, stop)))
    return tok, done


def prepare_text(source: str, text: str, field=None, eval_text=None, store=None, progress=None, stop=None) -> list:
    """Tokenize the text of a retrain of ``source`` into the cache before the job starts (the CLI
    and the dashboard call this with a progress bar; the job then finds it): the token files."""
    folder = model_folder(source, store)
    root = store.root if store is not None else None
    return [tf for _, tf in tokenize_text(folder, source, text, field, eval_text, root, progress, stop)[1]]


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
    started = time.perf_counter()
    tok, done = tokenize_text(loaded.path, loaded.name, text, field, eval_text, cache_root, progress)
    (corpus, main), *rest = done
    held = rest[0][1] if rest else None
    train, held_out, split = split_streams(main, held, block, cfg.d_vocab)
    facts = {
        "path": str(corpus.path),
        "files": corpus.names(),
        "field": corpus.field if any(k != "text" for k in corpus.kinds) else None,
        "bytes": corpus.bytes,
        "documents": main.meta["documents"],
        "tokens": main.n_tokens,
        "characters": main.meta["characters"],
        "eval_text": None if held is None else str(rest[0][0].path),
        "held_out": split["held_out"],
        "train_tokens": len(train),
        "held_out_tokens": len(held_out),
        "block": block,
        "eos_token_id": main.meta["eos"],
        "tokenizer_sha256": main.meta["tokenizer_sha256"],
        "cache": str(main.folder),
        "cached": main.cached and (held is None or held.cached),
        "tokenize_s": round(time.perf_counter() - started, 3),
        "tokenized_s": main.meta.get("seconds"),
    }
    data = TextData(train, held_out, block, cfg.d_vocab, tok, facts)
    facts["held_out_blocks"] = data.held_out_blocks
    return text_task(data)


def held_out_sample(loaded: LoadedModel, run_config: dict, seed: int = 0, cache_root=None) -> list[int]:
    """One held-out block of the text a run on text was trained on (``run_config``: the run's
    record's config, with ``text``, ``text_field``, ``eval_text`` and ``block``), as the run
    split it: what its before/after views are drawn on, rather than random tokens. The text comes
    from the token cache (``cache_root``: the run store's); a text that is gone raises TextError."""
    if not run_config.get("text"):
        raise ValueError("this run was not trained on a text")
    task = text_task_for(
        loaded,
        run_config["text"],
        run_config.get("text_field"),
        run_config.get("eval_text"),
        run_config.get("block"),
        cache_root,
    )
    return task.sample(1, seed=int(seed), split="test").tokens[0].tolist()
