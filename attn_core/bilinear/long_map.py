"""A multi-resolution map of one head on a long input, from its blocked scores
(``bilinear.blocked``): the whole T x T (or a zoomed region of it) pooled into tiles so that it
draws in at most ``pixels`` cells a side, the sink column (key 0) apart, and the tidy tables a
page or an export writes (the map's cells; every query's top-k keys with their tokens).

A region of at most ``pixels`` positions a side is drawn at full resolution (one cell per
query x key). With the sink apart, the map's keys start at 1 and the column of key 0 is pooled
over the same query tiles on its own: a sink that takes most of every row's weight would
otherwise be the maximum of every tile of the first column and flatten the colour scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from attn_core.bilinear.blocked import POOLS, LayerQK, Progress, RowStats, pooled, tile_for
from attn_core.validate import check_int

VALUES = ("pattern", "scores")
PIXELS = 800  # cells a side of a map by default (a figure's plot area)
MAX_PIXELS = 4096  # plotly draws images of a few thousand pixels a side at most


@dataclass
class LongMap:
    """Tiles of A (or S) over queries rows[0]..rows[1]-1 and keys cols[0]..cols[1]-1: cell (a, b)
    pools queries rows[0] + a*tile.. and keys key_first + b*tile..; ``sink`` [nr] pools key 0 over
    the same query tiles (None when key 0 is drawn in the map or outside the region). CPU tensors."""

    layer: int
    head: int
    n: int
    rows: tuple[int, int]
    cols: tuple[int, int]
    key_first: int
    tile: int
    pool: str
    value: str
    cells: torch.Tensor  # [nr, nc], NaN where a tile has no visible cell
    sink: torch.Tensor | None

    @property
    def full_resolution(self) -> bool:
        return self.tile == 1

    def query_range(self, a: int) -> tuple[int, int]:
        """Positions (first, last) of the queries of row ``a`` of tiles."""
        first = self.rows[0] + a * self.tile
        return first, min(self.rows[1], first + self.tile) - 1

    def key_range(self, b: int) -> tuple[int, int]:
        first = self.key_first + b * self.tile
        return first, min(self.cols[1], first + self.tile) - 1

    def frame(self) -> pd.DataFrame:
        """Tidy: one line per tile (its query and key ranges, the pooled value), the sink's tiles
        with key range 0..0."""
        nr, nc = self.cells.shape
        a = torch.arange(nr, device="cpu").repeat_interleave(nc)
        b = torch.arange(nc, device="cpu").repeat(nr)
        q_first = self.rows[0] + a * self.tile
        k_first = self.key_first + b * self.tile
        parts = [
            pd.DataFrame(
                dict(
                    query_first=q_first.numpy(),
                    query_last=(torch.clamp(q_first + self.tile, max=self.rows[1]) - 1).numpy(),
                    key_first=k_first.numpy(),
                    key_last=(torch.clamp(k_first + self.tile, max=self.cols[1]) - 1).numpy(),
                    value=self.cells.flatten().double().numpy(),
                )
            )
        ]
        if self.sink is not None:
            first = self.rows[0] + torch.arange(nr, device="cpu") * self.tile
            parts.insert(
                0,
                pd.DataFrame(
                    dict(
                        query_first=first.numpy(),
                        query_last=(torch.clamp(first + self.tile, max=self.rows[1]) - 1).numpy(),
                        key_first=0,
                        key_last=0,
                        value=self.sink.double().numpy(),
                    )
                ),
            )
        out = pd.concat(parts, ignore_index=True)
        return out.assign(layer=self.layer, head=self.head, pool=self.pool, measure=self.value)


def _span(name: str, span: tuple[int, int] | None, n: int) -> tuple[int, int]:
    if span is None:
        return 0, n
    lo, hi = span
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo < hi <= n):
        raise ValueError(f"{name} {span!r} must be positions (first, end) with 0 <= first < end <= {n}")
    return lo, hi


def long_map(
    qk: LayerQK,
    stats: RowStats | None,
    rows: tuple[int, int] | None = None,
    cols: tuple[int, int] | None = None,
    pixels: int = PIXELS,
    pool: str = "max",
    value: str = "pattern",
    sink_apart: bool = True,
    progress: Progress | None = None,
) -> LongMap:
    """The map of ``stats.head`` (A needs the rows' lse from ``stats``; S does not) over a region
    (default the whole input), tiled to at most ``pixels`` cells a side."""
    if value not in VALUES:
        raise ValueError(f"value must be one of {', '.join(VALUES)}, got {value!r}")
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
    if stats is None:
        raise ValueError("a map needs the head's row statistics (row_stats)")
    pixels = check_int("pixels", pixels, 1, MAX_PIXELS)
    n, head = qk.n, stats.head
    r0, r1 = _span("rows", rows, n)
    c0, c1 = _span("cols", cols, n)
    apart = sink_apart and c0 == 0 and c1 > 1
    k0 = 1 if apart else c0
    tile = tile_for(max(r1 - r0, c1 - k0), pixels)
    lse = stats.lse if value == "pattern" else None
    cells = pooled(qk, head, lse, (r0, r1), (k0, c1), tile, pool, progress)
    sink = pooled(qk, head, lse, (r0, r1), (0, 1), tile, pool)[:, 0] if apart else None
    return LongMap(
        qk.layer, head, n, (r0, r1), (c0, c1), k0, tile, pool, value, cells.cpu(), None if sink is None else sink.cpu()
    )


def top_frame(stats: RowStats, labels: Sequence[str], queries: Sequence[int] | None = None) -> pd.DataFrame:
    """Tidy per-query top-k: query, query_label, rank, key, key_label, offset (key - query),
    score, weight, and the row's entropy and sink mass; every query unless ``queries``."""
    keys = stats.top_keys.cpu()
    pick = (
        torch.arange(stats.n, device="cpu")
        if queries is None
        else torch.tensor(list(queries), dtype=torch.long, device="cpu")
    )
    keys = keys[pick]
    k = keys.shape[1]
    q = pick.repeat_interleave(k)
    key = keys.flatten()
    real = key >= 0
    q, key = q[real], key[real]
    rank = torch.arange(1, k + 1, device="cpu").repeat(len(pick))[real]
    at = pick.repeat_interleave(k)[real], torch.arange(k, device="cpu").repeat(len(pick))[real]
    lab = list(labels)
    return pd.DataFrame(
        dict(
            head=stats.head,
            query=q.numpy(),
            query_label=[lab[i] for i in q.tolist()],
            rank=rank.numpy(),
            key=key.numpy(),
            key_label=[lab[i] for i in key.tolist()],
            offset=(key - q).numpy(),
            score=stats.top_scores.cpu()[at].double().numpy(),
            weight=stats.top_weights.cpu()[at].double().numpy(),
            entropy=stats.entropy.cpu()[q].double().numpy(),
            sink=stats.sink.cpu()[q].double().numpy(),
        )
    )
