"""The pickers every page shares: the layer/head picker, the scores-or-pattern choice, and the
"needs a task" guard."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import streamlit as st

from attn_core.card import Card
from attn_core.figures.bilinear import VALUE_LABELS
from attn_core.model import ModelConfig
from attn_core.sources import LoadedModel
from attn_core.tasks import Task
from ui.markup import plain
from ui.state import ALL_HEADS, HEAD_KEY, LAYER_KEY, remember


def value_choice(label: str, key: str, default: str, where: Any = st) -> str:
    """The scores-or-pattern radio of a heatmap (``figures.bilinear.VALUES``), remembered under ``key``."""
    values = list(VALUE_LABELS)
    return where.radio(label, values, horizontal=True, key=remember(key, default, values), format_func=VALUE_LABELS.get)


def layer_head_picker(
    config: ModelConfig,
    where: Sequence | None = None,
    *,
    all_heads: bool = False,
    disabled: bool = False,
    url: bool = True,
    head_help: str = "",
) -> tuple[int, int | str]:
    """The layer and head selectboxes of every page that looks at one head; returns (layer, head).

    Their keys are the same on every page, so a choice follows the user from page to page (and
    falls back to 0 on a model with fewer layers or heads); with ``url`` the first choice comes
    from the URL parameters ``layer`` and ``head``. ``where``: the two containers to draw them in
    (columns, a form's columns; default: the page). ``all_heads`` adds :data:`ALL_HEADS`, drawn
    as "all (grid)"; ``head_help`` is added to the head's tooltip."""
    layer_at, head_at = where if where is not None else (st, st)
    layers = range(config.n_layers)
    heads = [*range(config.n_heads), *([ALL_HEADS] if all_heads else [])]
    layer = layer_at.selectbox(
        "Layer",
        layers,
        disabled=disabled,
        key=remember(LAYER_KEY, 0, layers, param="layer" if url else None),
        help=f"Layer l, 0..{config.n_layers - 1}",
    )
    grid = ", or a grid of every head of the layer" if all_heads else ""
    head = head_at.selectbox(
        "Head",
        heads,
        disabled=disabled,
        key=remember(HEAD_KEY, 0, heads, param="head" if url else None),
        format_func=lambda h: "all (grid)" if h == ALL_HEADS else head_name(config, h),
        help=f"Head h, 0..{config.n_heads - 1}{grid}{head_help}"
        + (
            f". Grouped-query attention: {config.n_heads // config.kv_heads} query heads share each of "
            f"the {config.kv_heads} key/value heads (kv g)"
            if config.kv_heads < config.n_heads
            else ""
        ),
    )
    return layer, head


def head_name(config: ModelConfig, head: int) -> str:
    """A query head's label in pickers: "3", or "3 (kv 1)" with grouped-query attention."""
    return f"{head} (kv {config.kv_head(head)})" if config.kv_heads < config.n_heads else str(head)


def reproduce_command(card: Card) -> str | None:
    """The command that retrains a zoo model from its preset, as a user can run it anywhere (the
    card's own ``command`` wrote into assets/models/, which exists): trains the recipe and seed
    again and prints the held-out accuracy; ``--out`` with a new folder keeps the weights. None
    when the card names no known preset."""
    from attn_core.presets import PRESETS

    if card.preset not in PRESETS:
        return None
    return f"attn-lab train --preset {card.preset}  # add --out NEW_FOLDER to keep the weights"


def require_task(loaded: LoadedModel, why: str) -> Task:
    """The guard of a page that needs the model's task (its data, its loss): without one the page
    says "<model> has no known task in its card, so <why>." and stops there."""
    if loaded.task is None:
        st.warning(f"{plain(loaded.name)} has no known task in its card, so {why}.")
        st.stop()
    return loaded.task
