"""A text task for a loaded model: its folder's own ``tokenizer.json`` tokenizes the user's text
(``--text``, ``--text-field``, ``--eval-text``, ``--block``) into the token cache, and the
streams become a :class:`~attn_core.text.task.TextTask` of the model's vocabulary and context.

This is where a retrain on text starts (``retraining.parent`` calls :func:`text_task_for`), and
what the CLI and the dashboard call first, with a progress callback, so that the job finds the
corpus already tokenized.
"""

from __future__ import annotations

import functools
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


# --- held-out text of a run, for the views ----------------------------------------------------------


def run_text(loaded: LoadedModel) -> dict | None:
    """What the card of a run on text says about its text (``details["text"]``), or None."""
    facts = (loaded.card.details or {}).get("text") if loaded.card is not None else None
    return facts if isinstance(facts, dict) and facts.get("path") and facts.get("block") else None


@functools.lru_cache(maxsize=8)
def _run_task(key: str, folder: str, name: str, text: tuple, block: int, d_vocab: int, cache: str | None) -> TextTask:
    """The text task of a run: its text (``(path, field, eval_text)``) tokenized by the tokenizer
    of its ``folder`` (found in the token cache under ``cache``). Cached by the weights' ``key``
    and the settings: building it hashes the text."""
    path, field, eval_text = text
    tok, done = tokenize_text(Path(folder), name, path, field, eval_text, cache)
    (_, main), *rest = done
    train, held_out, _ = split_streams(main, rest[0][1] if rest else None, block, d_vocab)
    return text_task(TextData(train, held_out, block, d_vocab, tok, {}))


def held_out_tokens(loaded: LoadedModel, seed: int = 0) -> list[int]:
    """One held-out block of the text a run trained on (its ``--eval-text``, or the held-out end
    of its text), drawn by ``seed``, tokenized by the run's own tokenizer (found in the token
    cache): the input its before/after views share. A ValueError (TextError) says why there is
    none: not a run on text, or its text is gone or changed."""
    from attn_core.validate import check_seed

    facts = run_text(loaded)
    if facts is None or loaded.path is None:
        raise TextError(f"{loaded.name} was not trained on text, so it has no held-out text")
    cache = str(Path(facts["cache"]).parent.parent) if facts.get("cache") else None  # <root>/text-cache/<key>
    folder = loaded.path if Path(loaded.path).is_dir() else Path(loaded.path).parent
    text = (facts["path"], facts.get("field"), facts.get("eval_text"))
    task = _run_task(
        loaded.key or str(folder), str(folder), loaded.name, text, int(facts["block"]), loaded.config.d_vocab, cache
    )
    return task.sample(1, check_seed("the sample seed", seed), split="test").tokens[0].tolist()


def has_sample(loaded: LoadedModel) -> bool:
    """Whether :func:`held_out_input` has an input for ``loaded``: its task's, or its text's."""
    return loaded.task is not None or run_text(loaded) is not None


def held_out_input(loaded: LoadedModel, seed: int = 0) -> list[int]:
    """A held-out input of ``loaded``: a sample of its task (``bilinear.sample_tokens``), or for a
    run on text one held-out block of its text (:func:`held_out_tokens`), never random tokens."""
    from attn_core.bilinear import sample_tokens as task_sample

    if loaded.task is not None or run_text(loaded) is None:
        return task_sample(loaded, seed)
    return held_out_tokens(loaded, seed)
