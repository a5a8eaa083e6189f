"""The probes a page measures sinks and data-space ranks on (``attn_core.text.probes``): the
model's task samples, a text (an upload or a file of the data folder, tokenized by the model
folder's tokenizer.json) or, on the Heatmaps page, the page's own input; and the cached calls.
``pick_probes`` returns a :class:`Choice`, or None (with a line saying why) until one is usable."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from attn_core import bilinear
from attn_core.hf.tokenizer import TOKENIZER
from attn_core.sources import LoadedModel
from attn_core.text import files as text_files
from attn_core.text.probes import PROBES, measure_ranks, measure_sinks
from ui.cache import cached
from ui.retrain_text import PLACES, pick_text
from ui.state import remember

KINDS = {"task": "task samples", "text": "a text", "input": "this input"}


@dataclass(frozen=True)
class Choice:
    """What the probes are: ``kind`` (a key of KINDS), the text's path and its modification time
    (what a cached result is keyed by, so an edited file is measured again)."""

    kind: str
    text: str | None = None
    stamp: int | None = None


def _has_tokenizer(loaded: LoadedModel) -> bool:
    return loaded.path is not None and Path(loaded.path).is_dir() and (Path(loaded.path) / TOKENIZER).exists()


def pick_probes(loaded: LoadedModel, key: str, with_input: bool = False) -> Choice | None:
    """The probe widgets (keys prefixed ``key``); None, with a line saying what is missing, until
    a usable choice is made."""
    kinds = (["task"] if loaded.task is not None else []) + (["text"] if _has_tokenizer(loaded) else [])
    kinds += ["input"] if with_input else []
    if not kinds:
        st.info(
            "This model has no task and no tokenizer.json: there is nothing to cut probes from "
            "(an imported model's folder needs its tokenizer.json)."
        )
        return None
    kind_col, pick_col = st.columns([2, 5])
    kind = kind_col.radio(
        "Probes",
        kinds,
        format_func=KINDS.get,
        key=remember(f"{key}_probes", kinds[0], kinds),
        help=f"{PROBES} held-out samples of the model's task, {PROBES} windows of 64 tokens of a text (tokenized "
        "by the model's tokenizer.json), or the input above as one probe",
    )
    if kind != "text":
        return Choice(kind)
    listed = text_files.data_files()
    where = ["upload"] + (["data"] if listed else [])
    origin = pick_col.radio("Text from", where, format_func=PLACES.get, horizontal=True, key=f"{key}_text_from")
    path = pick_text(origin, pick_col, f"{key}_probe", listed)
    if path is None:
        st.info("Upload a text to cut the probes from" + (" (or pick one in the data folder)." if listed else "."))
        return None
    return Choice("text", str(path), os.stat(path).st_mtime_ns)


@cached
def _sinks(loaded: LoadedModel, text: str | None, stamp: int | None, eps: float):
    return measure_sinks(loaded, text, eps)


@cached
def _input_sinks(loaded: LoadedModel, tokens: list[int], eps: float):
    return bilinear.sinks(loaded.model, [tokens], eps, f"this input ({len(tokens)} tokens) as one probe")


@cached
def _ranks(loaded: LoadedModel, text: str | None, stamp: int | None, frac: float):
    return measure_ranks(loaded, text, frac)


@cached
def _input_ranks(loaded: LoadedModel, tokens: list[int], frac: float):
    return bilinear.ranks(loaded.model, [tokens], frac, f"this input ({len(tokens)} tokens) as one probe")


def sinks_on(loaded: LoadedModel, choice: Choice, eps: float, tokens: list[int] | None = None):
    """The sinks on the chosen probes (``tokens``: the page's input, for the "input" choice)."""
    if choice.kind == "input":
        return _input_sinks(loaded, list(tokens), float(eps))
    return _sinks(loaded, choice.text, choice.stamp, float(eps))


def ranks_on(loaded: LoadedModel, choice: Choice, frac: float, tokens: list[int] | None = None):
    """Both ranks of every head, the data space on the chosen probes."""
    if choice.kind == "input":
        return _input_ranks(loaded, list(tokens), float(frac))
    return _ranks(loaded, choice.text, choice.stamp, float(frac))
