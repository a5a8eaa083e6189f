"""Head selections of the regularizers (and of telemetry): ``L<l>`` (every head of layer l) and
``L<l>H<h>`` items, parsed against a model and formatted back; a head's label (``L0H1``).
See ``attn_core.regularizers`` and docs/architecture.md."""

from __future__ import annotations

import re
from collections.abc import Iterable

from attn_core.model import ModelConfig
from attn_core.validate import is_int, shown

Heads = tuple[tuple[int, int], ...]

_ITEM = re.compile(r"^L(\d+)(?:H(\d+))?$", re.IGNORECASE)


def all_heads(cfg: ModelConfig) -> Heads:
    return tuple((l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads))


def parse_heads(text: None | str | Iterable, cfg: ModelConfig) -> Heads:
    """Resolve a head selection against a model: None/"" = every head; a string of ``L<l>`` and
    ``L<l>H<h>`` items separated by commas; or an iterable of ``(layer, head)`` pairs / layer ints.
    Raises ValueError naming the item that is malformed or out of range."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return all_heads(cfg)
    items: list = []
    if isinstance(text, str):
        for part in text.split(","):
            part = part.strip()
            m = _ITEM.match(part)
            if not m:
                raise ValueError(
                    f"head selection item {shown(part)} is not L<layer> or L<layer>H<head> (e.g. L0, L1H2)"
                )
            items.append(int(m.group(1)) if m.group(2) is None else (int(m.group(1)), int(m.group(2))))
    else:
        items = list(text)
    out: list[tuple[int, int]] = []
    for item in items:
        if is_int(item):
            _check_layer(cfg, item)
            out += [(item, h) for h in range(cfg.n_heads)]
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            l, h = int(item[0]), int(item[1])
            _check_layer(cfg, l)
            if not 0 <= h < cfg.n_heads:
                raise ValueError(
                    f"head L{l}H{h} is out of range: this model has {cfg.n_heads} heads per layer "
                    f"(H0..H{cfg.n_heads - 1})"
                )
            out.append((l, h))
        else:
            raise ValueError(f"head selection item {shown(item)} is not a layer or a (layer, head) pair")
    if not out:
        raise ValueError("the head selection is empty")
    return tuple(sorted(set(out)))


def _check_layer(cfg: ModelConfig, l: int) -> None:
    if not 0 <= l < cfg.n_layers:
        raise ValueError(
            f"layer L{l} is out of range: this model has {cfg.n_layers} layer"
            f"{'s' * (cfg.n_layers != 1)} (L0..L{cfg.n_layers - 1})"
        )


def format_heads(heads: Heads, cfg: ModelConfig | None = None) -> str:
    """The selection as a spec string, whole layers collapsed to ``L<l>``."""
    if cfg is not None and tuple(heads) == all_heads(cfg):
        return "all"
    parts = []
    layers = sorted({l for l, _ in heads})
    for l in layers:
        hs = [h for ll, h in heads if ll == l]
        if cfg is not None and len(hs) == cfg.n_heads:
            parts.append(f"L{l}")
        else:
            parts += [f"L{l}H{h}" for h in hs]
    return ",".join(parts)


def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def by_layer(heads: Heads) -> dict[int, list[int]]:
    """The selection grouped by layer: ``{layer: [head, ...]}`` in the selection's order."""
    out: dict[int, list[int]] = {}
    for l, h in heads:
        out.setdefault(l, []).append(h)
    return out
