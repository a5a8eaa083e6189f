"""The Retrain page's Text section: the text an imported model (one with a tokenizer.json and no
task) retrains on, its held-out text, blocks, the batch, what learns and the KL term; the text is
tokenized with a progress bar (once: the token cache keeps it) in a bounded child process
(``attn_core.text.child``), never in the page's script thread. ``text_inputs`` returns the
JobConfig's text settings, or None until a usable text is chosen; its errors speak the page's
words (``text.files.page_message``). ``say_estimate`` says how long a run would take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st

from attn_core.limits import MAX_BATCH, size_text
from attn_core.model import ModelConfig
from attn_core.runs import RunStore
from attn_core.text import files as text_files
from attn_core.text.corpus import open_corpus
from attn_core.text.source import prepare_text
from attn_core.text.task import HELD_OUT_FRACTION, default_batch, split_streams
from attn_core.training.config import TRAIN, TRAIN_HELP
from attn_core.training.estimate import CPU_STEP_FLOPS
from attn_core.training.text_defaults import STEP_MEMORY
from ui.markup import plain
from ui.models import job_source
from ui.state import MODEL_KEY, remember
from ui.widgets import number

PLACES = {"upload": "an upload", "data": "the data folder"}
UPLOADED_AS = "text_uploaded_as"  # kept upload path -> the name it was uploaded as (a shown command says it)


def pick_text(
    origin: str, col: Any, kind: str, listed: list[str], uploads: dict[Path, str] | None = None
) -> Path | None:
    """The path of a text picked in ``col``: an upload (kept by the hash of its bytes in the run
    store; ``uploads``, if given, learns the name it was uploaded as) or a name under $ATTN_LAB_DATA; None
    until one is given. ``kind`` keys the widgets (text, eval)."""
    if origin == "upload":
        up = col.file_uploader(  # no type=: Streamlit's own check of a name is a traceback; ours is a line
            "Text file" if kind == "text" else "Held-out text file",
            max_upload_size=text_files.MAX_UPLOAD_MB,
            key=f"{kind}_upload",
            help="A .txt file, .jsonl (one JSON object per line) or .parquet file",
        )
        if up is None:
            return None
        path = text_files.save_upload(up.name, up.getvalue())
        if uploads is not None:
            uploads[path] = text_files.upload_name(up.name)
        return path
    name = col.selectbox("File or folder", listed, key=remember(f"{kind}_data", listed[0], listed))
    return text_files.data_path(name)


def text_inputs(cfg: ModelConfig, lambdas: list[float], device: str = "cpu") -> dict | None:
    """The Text section (see the module's docstring); ``lambdas`` are the KL strengths offered,
    ``device`` the one picked (the default batch depends on it)."""
    st.subheader("Text")
    src_col, pick_col, field_col = st.columns([2, 4, 2])
    listed = text_files.data_files()
    where = ["upload"] + (["data"] if listed else [])
    origin = src_col.radio(
        "Text from",
        where,
        format_func=PLACES.get,
        key=remember("text_from", "upload", where),
        help=f"Upload a file (at most {text_files.MAX_UPLOAD_MB} MB), or pick one in the folder the server "
        f"names in ${text_files.ENV_DATA}",
    )
    held_col, held_pick_col, _ = st.columns([2, 4, 2])
    held_from = held_col.radio(
        "Held out",
        ["tail", *where],
        format_func={"tail": f"the last {HELD_OUT_FRACTION:.0%} of the text", **PLACES}.get,
        key=remember("text_held", "tail", ["tail", *where]),
        help="The text perplexity is measured on: the end of the training text (never trained on), or another text",
    )
    block_col, batch_col, train_col, kl_col = st.columns([2, 2, 3, 2])
    block = number(
        block_col,
        "Block (tokens)",
        2,
        cfg.n_ctx,
        "text_block",
        min(cfg.n_ctx, 256),
        step=16,
        help="Tokens per training sequence: blocks of the text, each scored on every next token",
    )
    batch = number(
        batch_col,
        "Batch (blocks, 0 = auto)",
        0,
        MAX_BATCH,
        "text_batch",
        0,
        help="Blocks per training step. 0 picks what the model, the block and the device allow: on the CPU "
        "the most blocks (a power of two, at most 64) whose step is estimated within "
        f"{CPU_STEP_FLOPS:.0e} operations; on a GPU within {STEP_MEMORY / 2**30:g} GiB of memory",
    )
    train = train_col.radio(
        "What learns", TRAIN, horizontal=True, key=remember("text_train", "all", TRAIN), help=TRAIN_HELP
    )
    kl = kl_col.select_slider(
        "KL to the start (λ)",
        [0.0] + lambdas,
        format_func=lambda v: "off" if v == 0 else f"{v:.3g}",
        key=remember("text_kl", 0.0, [0.0] + lambdas),
        help="λ·KL(starting model ‖ model) per token on the training batch: keeps behaviour while heads concentrate",
    )
    uploads: dict[Path, str] = {}
    try:
        path = pick_text(origin, pick_col, "text", listed, uploads)
        held_path = None if held_from == "tail" else pick_text(held_from, held_pick_col, "eval", listed, uploads)
        if path is None:
            st.info("Upload a text to retrain on" + (" (or pick one in the data folder)." if listed else "."))
            return None
        if held_from != "tail" and held_path is None:
            st.info("Upload the held-out text (or measure perplexity on the end of the training text).")
            return None
        field = None
        if {k for p in (path, held_path) if p is not None for k in open_corpus(p).kinds} - {"text"}:
            field = field_col.text_input(  # only .jsonl and Parquet files have fields
                "Text field",
                key=remember("text_field", "text"),
                help="The JSON key (.jsonl) or Parquet column that holds the text",
            )
        bar = st.progress(0.0, text="Reading the text…")

        def progress(phase: str, done: int, total: int) -> None:
            bar.progress(min(1.0, done / max(total, 1)), text=f"{phase}: {size_text(done)} of {size_text(total)}")

        source = job_source(st.session_state[MODEL_KEY])
        held_text = None if held_path is None else str(held_path)
        tf, *held_tf = prepare_text(source, str(path), field, held_text, RunStore(), progress)
        bar.empty()
        _, held, split = split_streams(tf, held_tf[0] if held_tf else None, int(block), cfg.d_vocab)
    except (ValueError, OSError) as e:  # TextError, the tokenizer's (in its child), LimitError
        st.error(f"This text cannot be used: {plain(text_files.page_message(e, uploads))}")
        return None
    st.caption(
        f"{tf.n_tokens:,} tokens in {tf.meta['documents']:,} document(s), "
        + ("found in the token cache" if tf.cached else f"tokenized in {tf.meta['seconds']:.1f} s")
        + f"; {len(held):,} tokens held out for perplexity ({split['held_out'].replace('eval-text', 'another text')})"
        + f"; blocks of {int(block)} tokens."
    )
    st.session_state.setdefault(UPLOADED_AS, {}).update({str(p): name for p, name in uploads.items()})
    auto = default_batch(cfg, int(block), float(kl), device)
    return dict(
        text=str(path),
        text_field=field or None,
        eval_text=held_text,
        block=int(block),
        train=train,
        kl=float(kl),
        batch_size=int(batch) or auto,
    )


def shown_command(cfg) -> None:
    """A run's ``attn-lab retrain`` command in the page's words: an uploaded model as ``upload:
    <name>``, an uploaded text by the name it was uploaded as (this session's); the command with
    the kept paths in the tooltip."""
    from attn_core.sources import shown_name

    shown = dict(st.session_state.get(UPLOADED_AS, {}))
    shown[cfg.source] = shown_name(cfg.source)
    said, full = cfg.command(shown), cfg.command()
    st.code(said, language="bash")
    if said != full:
        st.caption("Uploads are named as they were uploaded.", help=f"With the paths they are kept at: {full}")


def say_estimate(model, steps: int, batch: int, block: int, device: str, kl: float = 0.0) -> None:
    """The estimated duration of a run of ``model`` (on the CPU, as the page holds it) with these
    settings, before it starts (a caption; ``attn_core.training.estimate``)."""
    from attn_core.training import estimate

    e = estimate.run_seconds(model.cfg, steps, batch, block, device, kl, model=model if device == "cpu" else None)
    low, high = estimate.run_range(e["total_s"], estimate.load_per_core())
    st.caption(
        f"Estimated duration: {estimate.range_text(low, high)} on {device} ({steps:,} steps of "
        f"{batch} × {block} tokens, ~{e['step_s']:.2g} s a step, and ~{estimate.duration_text(e['measure_s'])} "
        "measuring before and after; a rough estimate from this machine's speed and load now, refined from the "
        "measured steps once the run goes)."
    )
