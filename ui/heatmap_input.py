"""The Heatmaps page's input and query: a task sample, a held-out block of the text a run was
trained on, random tokens or typed text/tokens, the query position (moved to the last token when the input changes) and k of the top-k metric, all
written into the URL. A model with a tokenizer takes text typed or pasted in a multi-line box
(line breaks kept) or read from an uploaded file (kept and checked as the Retrain page's text
uploads are, ``attn_core.text.files``); text longer than the input may be is cut to its first
tokens, and the page says so."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from attn_core import bilinear
from attn_core.bilinear import blocked, position_labels
from attn_core.bilinear.tokens import encode_first
from attn_core.hf import tokenizer as hf_tokenizer
from attn_core.sources import LoadedModel
from attn_core.text import files as text_files
from attn_core.text import source as text_source
from attn_core.text.files import page_message
from attn_core.text.prefix import read_prefix
from ui.markup import plain
from ui.state import follow_input, remember, to_url
from ui.widgets import number

SOURCES = {"text": "held-out text", "sample": "task sample", "random": "random tokens", "typed": "typed tokens"}
DEFAULT_LENGTH = 1024  # random tokens by default: the context, at most this many (and what the limits allow)
TEXT_FROM = {"box": "typed or pasted", "file": "a file"}


@dataclass(frozen=True)
class Input:
    """The tokens the page looks at, their labels (position:token), the query and k."""

    source: str  # a key of SOURCES
    tokens: list[int]
    labels: list[str]
    query: int
    k: int

    @property
    def long(self) -> bool:
        """Over ``LONG_INPUT`` tokens: the long view (``ui.heatmap_long``, blocked scores of one head), no T x T."""
        return len(self.tokens) > blocked.LONG_INPUT


def _tokens(loaded: LoadedModel, source: str) -> tuple[list[int], int | None]:
    """The input's tokens and its seed (None for typed input), from the widgets of ``source``."""
    cfg = loaded.config
    if source == "typed" and bilinear.tokenizer(loaded) is not None:
        return _text_tokens(loaded), None
    if source == "typed":
        names = bilinear.token_names(loaded)
        text = st.text_input(
            "Tokens (space-separated)",
            key=remember("typed", " ".join(names[: min(8, len(names))])),
            help=f"Token names of the vocabulary (or ids), at most {cfg.n_ctx} tokens",
        )
        return bilinear.encode(loaded, text), None
    s_col, l_col = st.columns(2)
    seed = int(
        number(
            s_col,
            "Seed",
            0,
            2**31 - 1,
            "input_seed",
            0,
            help="Seed of the sample / the random tokens: the same seed gives the same input",
            param="seed",
        )
    )
    if source == "sample":
        return bilinear.sample_tokens(loaded, seed), seed
    if source == "text":  # a held-out block of the run's text, as the run split it
        return text_source.held_out_tokens(loaded, seed), seed  # tokenized once per run (the token cache)
    longest = max(2, blocked.longest_input(loaded.model))  # the context (blocked past LONG_INPUT)
    length = number(
        l_col,
        "Length",
        2,
        longest,
        "random_length",
        min(longest, DEFAULT_LENGTH),
        param="length",
        help=f"Number of tokens, 2..{longest}"
        + (f" (the context is {cfg.n_ctx}; {_why_shorter(cfg)} allows {longest})" if longest < cfg.n_ctx else ""),
    )
    return bilinear.random_tokens(loaded, seed, int(length)), seed


def _why_shorter(cfg) -> str:
    """What cuts the input below the context: the memory limit, or alpha-entmax heads, which have
    no blocked rows (a dense view of at most ``LONG_INPUT`` tokens)."""
    return "the memory limit" if cfg.entmax_alpha == 1.0 else "alpha-entmax (a dense view only)"


def _text_tokens(loaded: LoadedModel) -> list[int]:
    """Text typed or pasted in a multi-line box, or the text of an uploaded file, by the model's
    tokenizer.json; cut to the most tokens an input may have (the page says so)."""
    longest = max(2, blocked.longest_input(loaded.model))
    origin = st.radio(
        "Text from",
        list(TEXT_FROM),
        format_func=TEXT_FROM.get,
        horizontal=True,
        key=remember("heatmap_text_from", "box", list(TEXT_FROM)),
    )
    if origin == "file":
        up = st.file_uploader(  # no type=: Streamlit's own check of a name is a traceback; ours is a line
            "Text file",
            max_upload_size=text_files.MAX_UPLOAD_MB,
            key="heatmap_text_file",
            help=f"A .txt, .jsonl (one JSON object per line, its text field) or .parquet file; its first {longest} "
            "tokens are the input",
        )
        if up is None:
            st.info("Upload a text file to look at its first tokens.")
            st.stop()
        path = text_files.save_upload(up.name, up.getvalue())
        text, _ = read_prefix(path, hf_tokenizer.MAX_TEXT_CHARS)
        if not text.strip():
            raise ValueError(f"{text_files.upload_name(up.name)} holds no text")
    else:
        text = st.text_area(
            "Text",
            key=remember("typed_text", "The cat sat on the mat. The cat sat"),
            height=160,
            help=f"Any text, line breaks included, split into tokens by the model's tokenizer.json (its first "
            f"{longest} tokens are the input)",
        )
    ids, total = encode_first(loaded, text[: hf_tokenizer.MAX_TEXT_CHARS], longest)
    if total > len(ids):
        st.caption(f"The text has {total:,} tokens: its first {len(ids):,} are the input.")
    return ids


def pick_input(loaded: LoadedModel) -> Input:
    """The input's widgets, then the query slider and k; stops the page with one line when the
    input does not work."""
    c_source, c_input = st.columns([3, 5])
    on_text = text_source.run_text(loaded) is not None
    choices = [s for s in SOURCES if (s != "sample" or loaded.task is not None) and (s != "text" or on_text)]
    source = c_source.radio(
        "Input",
        choices,
        format_func=SOURCES.get,
        horizontal=True,
        key=remember("input", choices[0], choices, param="input"),
        help="A held-out sample of the model's task (or of the text the run was trained on), uniform random "
        "tokens, or your own tokens",
    )
    with c_input:
        try:
            tokens, seed = _tokens(loaded, source)
            blocked.check_input(loaded.model, tokens)  # a view of this input fits the limits, or one line here
        except (ValueError, OSError) as e:  # a text gone or changed since the run: one line
            st.error(f"This input does not work: {plain(page_message(e) if source == 'text' else e)}")
            st.stop()
    labels = position_labels(loaded, tokens)
    queries = range(len(labels))
    # New typed text, another length or another model moves the query to the last token (where the next
    # token is predicted); another seed of the same length keeps it (the same position, compared across samples).
    follow_input("query", (loaded.key, source, tokens if source == "typed" else len(tokens)), queries[-1])
    c_query, c_k = st.columns([5, 1])
    query = c_query.select_slider(
        "Query position i",
        options=list(queries),
        key=remember("query", queries[-1], queries, param="query"),
        format_func=lambda q: labels[q],
        help="x = X[i], the attention input at position i (position:token); its row of S and A is outlined",
    )
    k = c_k.number_input(
        "k (top-k)",
        min_value=1,
        max_value=len(labels),
        step=1,
        key=remember("topk", 1, range(1, len(labels) + 1)),
        help="k of the top-k mass metric",
    )
    to_url(input=source, query=query, seed=seed, length=len(tokens) if source == "random" else None)
    return Input(source, tokens, labels, query, int(k))
