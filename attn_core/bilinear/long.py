"""A head's view of a long input for one query: an exact window, the top-k keys and a pooled
overview instead of n^2 cells, from the one long-input engine (``bilinear.blocked``).

Inputs over :data:`~attn_core.bilinear.blocked.LONG_INPUT` tokens are long (the one threshold; the
default top-k is ``blocked.TOP_K``). For one head and one query position i, :class:`LongView` holds:

- ``window``: the exact S and A of the ``w`` positions lo..hi that end at i (at 0..w-1 for an
  early query), as a w x w square with the causal mask: query i's row there is its scores
  against keys i-w+1..i, and A is normalised over each row's whole span (every key it sees and
  the head's learned sink logit, as the model does), not over the window;
- ``top``: the k keys with the largest attention A_ij anywhere in 0..i (``torch.topk`` of the
  row; with softmax the order is that of the scores), with position, label, score, probability;
- ``overview``: A (and S) of every query and key pooled into at most ``blocks`` x ``blocks``
  cells of b x b positions, b = ceil(n / blocks) (``blocked.pooled``, a block at a time).
  Max-pooling (the default) keeps a sharp head visible: a head that puts all its weight on one
  key per query shows 1.0 in every block its keys fall in, where a mean over b x b cells would
  fade it to about 1/b. ``pool="mean"`` gives the block average of the visible cells instead.
  Blocks with no visible cell (above the causal diagonal) are NaN.

:func:`layer_scores` runs the model once up to the layer (``queries_keys.layer_qk``: the forward
stops after the layer's ``k``) and keeps Q and K of every head, never S of the whole layer; each
head's row log-normalisers (``lse``, with the sink) come from one blocked pass
(``blocked.row_stats``) the first time the head is looked at. A head or query change is then a
few blocks of Q K^T. Softmax heads only: alpha-entmax rows have no log-normaliser to merge a
block at a time, and ``layer_qk`` refuses them in one sentence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch

from attn_core import metrics
from attn_core.bilinear import blocked
from attn_core.bilinear.blocked import LONG_INPUT, POOLS, TOP_K
from attn_core.bilinear.checks import check_layer, check_loaded
from attn_core.bilinear.queries_keys import LayerQK, layer_qk
from attn_core.bilinear.tokens import position_labels
from attn_core.bilinear.views import View
from attn_core.sources import LoadedModel
from attn_core.validate import is_int

__all__ = ["LONG_INPUT", "TOP_K", "WINDOW", "BLOCKS", "POOLS", "LongView", "LayerScores", "layer_scores", "pool_blocks"]
__all__ += ["ROW_METRICS", "rows_table"]

WINDOW = 64  # positions in the exact window
BLOCKS = 256  # the overview has at most BLOCKS x BLOCKS cells


def _check_int(name: str, value, lo: int, hi: int | None = None) -> int:
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        top = f"..{hi}" if hi is not None else " or more"
        raise ValueError(f"{name} must be an integer in {lo}{top}, got {value!r}")
    return int(value)


@dataclass
class LongView:
    """One head's scores for one query of a long input: an exact window, the top-k keys and a
    pooled overview (see the module doc). Positions are absolute (0..n-1)."""

    layer: int
    head: int
    query: int
    n: int
    labels: list[str]  # "pos:token" of every position
    lo: int  # the window is positions lo..hi (queries and keys)
    hi: int
    window_scores: torch.Tensor  # [w, w], S[lo:hi+1, lo:hi+1]
    window_pattern: torch.Tensor  # [w, w]
    window_mask: torch.Tensor  # [w, w] bool, True where the key is visible
    top: pd.DataFrame  # rank, key, label, score, prob: the k keys of the query's row with largest A
    block: int  # overview cells are block x block positions
    pool: str  # "max" | "mean"
    overview_pattern: torch.Tensor | None  # [nb, nb], NaN where a block has no visible cell (None: not asked for)
    overview_scores: torch.Tensor | None  # [nb, nb]
    row_scores: torch.Tensor  # [n], the query's full row (kept on the server, for its metrics)
    row_pattern: torch.Tensor  # [n]
    row_mask: torch.Tensor  # [n] bool, the keys the query sees
    meta: dict = field(default_factory=dict)

    @property
    def window_labels(self) -> list[str]:
        return self.labels[self.lo : self.hi + 1]

    @property
    def n_blocks(self) -> int:
        return math.ceil(self.n / self.block)

    def block_range(self, b: int) -> tuple[int, int]:
        """Positions (first, last) of overview block ``b``."""
        return b * self.block, min(self.n, (b + 1) * self.block) - 1

    def concentration(self, k: int = 1) -> dict[str, float]:
        """Every concentration metric of the query's whole row (attn_core.metrics)."""
        values = metrics.concentration(self.row_pattern[None], self.row_mask[None], k=k)
        return {name: float(v[0]) for name, v in values.items()}

    def window_frame(self) -> pd.DataFrame:
        """Tidy window: query, key (absolute positions), labels, score, prob, visible."""
        w = self.hi - self.lo + 1
        q, k = torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")
        q, k = q.flatten() + self.lo, k.flatten() + self.lo
        return pd.DataFrame(
            dict(
                layer=self.layer,
                head=self.head,
                query=q.numpy(),
                key=k.numpy(),
                query_label=[self.labels[i] for i in q.tolist()],
                key_label=[self.labels[i] for i in k.tolist()],
                score=self.window_scores.flatten().numpy(),
                prob=self.window_pattern.flatten().numpy(),
                visible=self.window_mask.flatten().numpy(),
            )
        )

    def overview_frame(self) -> pd.DataFrame:
        """Tidy overview: one line per block (its position ranges, pooled A and S)."""
        nb = self.n_blocks
        qb, kb = torch.meshgrid(torch.arange(nb), torch.arange(nb), indexing="ij")
        qb, kb = qb.flatten(), kb.flatten()
        return pd.DataFrame(
            dict(
                layer=self.layer,
                head=self.head,
                query_block=qb.numpy(),
                key_block=kb.numpy(),
                query_first=(qb * self.block).numpy(),
                query_last=torch.clamp((qb + 1) * self.block, max=self.n).numpy() - 1,
                key_first=(kb * self.block).numpy(),
                key_last=torch.clamp((kb + 1) * self.block, max=self.n).numpy() - 1,
                pool=self.pool,
                prob=self.overview_pattern.flatten().numpy(),
                score=self.overview_scores.flatten().numpy(),
            )
        )


def pool_blocks(M: torch.Tensor, mask: torch.Tensor, block: int, pool: str = "max") -> torch.Tensor:
    """``M`` [..., n, n] pooled over its visible cells (``mask`` [n, n]) in ``block`` x ``block``
    tiles, [..., nb, nb] with nb = ceil(n / block): the max (or mean) of the visible cells of
    each tile, NaN for a tile with none."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
    n = M.shape[-1]
    nb = math.ceil(n / block)
    pad = nb * block - n
    M = torch.nn.functional.pad(M, (0, pad, 0, pad))
    vis = torch.nn.functional.pad(mask, (0, pad, 0, pad), value=False)
    tiles = M.reshape(*M.shape[:-2], nb, block, nb, block)
    vis = vis.reshape(nb, block, nb, block)
    count = vis.sum((1, 3))
    if pool == "max":
        out = tiles.masked_fill(~vis, -math.inf).amax((-3, -1))
    else:
        out = tiles.masked_fill(~vis, 0.0).sum((-3, -1)) / count.clamp_min(1)
    return out.masked_fill(count == 0, math.nan)


@dataclass
class LayerScores:
    """Q and K of one layer on one input (what a page caches per (model key, tokens, layer)) and
    each head's row log-normalisers once computed: ``view(...)`` is a head's :class:`LongView`,
    ``pattern(head)`` and ``dense(heads)`` the n x n of heads for tables computed on the server."""

    qk: LayerQK
    labels: list[str]
    lse_of: dict[int, torch.Tensor] = field(default_factory=dict)  # head -> [n], filled as heads are looked at

    @property
    def layer(self) -> int:
        return self.qk.layer

    @property
    def token_ids(self) -> list[int]:
        return list(self.qk.token_ids or [])

    @property
    def n(self) -> int:
        return self.qk.n

    @property
    def n_heads(self) -> int:
        return self.qk.n_heads

    @property
    def mask(self) -> torch.Tensor:
        """[n, n] bool on the CPU, the keys each query sees (n x n: for server-side tables)."""
        at = torch.arange(self.n, device=self.qk.q.device)
        return self.qk.visible(at, at).cpu()

    def _head(self, head: int) -> int:
        if not is_int(head) or not 0 <= head < self.n_heads:
            raise ValueError(f"head {head!r} is outside 0..{self.n_heads - 1}")
        return int(head)

    def lse(self, head: int) -> torch.Tensor:
        """[n]: log of each row's normaliser, over the keys it sees and the head's learned sink
        logit (``blocked.row_stats``, once per head)."""
        h = self._head(head)
        if h not in self.lse_of:
            self.lse_of[h] = blocked.row_stats(self.qk, h, k=1, offsets=1).lse
        return self.lse_of[h]

    def _block(self, h: int, rows: tuple[int, int], cols: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """S and A (float32, on the CPU) of queries rows[0]..rows[1]-1 against keys cols[0]..cols[1]-1."""
        S = self.qk.scores(h, rows[0], rows[1], cols[0], cols[1])
        A = (S - self.lse(h)[rows[0] : rows[1], None]).exp()
        return S.float().cpu(), A.float().cpu()

    def scores(self, head: int) -> torch.Tensor:
        """S [n, n] of ``head``, -inf where the key is not visible (server-side tables)."""
        return self._block(self._head(head), (0, self.n), (0, self.n))[0]

    def pattern(self, head: int) -> torch.Tensor:
        """A [n, n] of ``head`` as the model attends (its rows leave the sink's share out)."""
        return self._block(self._head(head), (0, self.n), (0, self.n))[1]

    def dense(self, heads: Sequence[int] | None = None) -> View:
        """A :class:`View` of ``heads`` (default all) for tables computed on the server (its n^2
        cells are not meant for a browser)."""
        heads = list(range(self.n_heads)) if heads is None else [self._head(h) for h in heads]
        pairs = [self._block(h, (0, self.n), (0, self.n)) for h in heads]
        S, A = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        meta = {"n_tokens": self.n}
        return View("sequence", self.layer, heads, self.labels, self.labels, S, A, self.mask, self.token_ids, meta)

    def concentration_table(self, k: int = 1, heads: Sequence[int] | None = None) -> pd.DataFrame:
        """``View.concentration_table`` of every head (or ``heads``) over all n query rows, one
        head at a time (so at most one head's A is held)."""
        heads = range(self.n_heads) if heads is None else heads
        return pd.concat([self.dense([h]).concentration_table(k) for h in heads], ignore_index=True)

    def view(
        self,
        head: int,
        query: int,
        window: int = WINDOW,
        k: int = TOP_K,
        blocks: int | None = BLOCKS,
        pool: str = "max",
    ) -> LongView:
        """The :class:`LongView` of ``head`` for query position ``query`` (negative counts from
        the end): a window of ``window`` positions, the ``k`` top keys, an overview of at most
        ``blocks`` x ``blocks`` cells pooled by ``pool`` (``blocks=None``: no overview)."""
        h, n = self._head(head), self.n
        if not is_int(query) or not -n <= query < n:
            raise ValueError(f"query {query!r} is outside 0..{n - 1} ({n} tokens)")
        i = int(query) % n
        w = min(_check_int("window", window, 1), n)
        k = _check_int("k", k, 1)
        b = n if blocks is None else math.ceil(n / _check_int("blocks", blocks, 1))
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
        lo = max(0, i - w + 1)
        hi = max(i, w - 1)
        win_s, win_a = self._block(h, (lo, hi + 1), (lo, hi + 1))
        row_s, row_a = (m[0] for m in self._block(h, (i, i + 1), (0, n)))
        visible = row_s.isfinite()
        keys = torch.arange(n)[visible]
        k = min(k, len(keys))
        top_p, top_at = torch.topk(row_a[visible], k)
        top_keys = keys[top_at]
        top = pd.DataFrame(
            dict(
                rank=range(1, k + 1),
                key=top_keys.tolist(),
                label=[self.labels[j] for j in top_keys.tolist()],
                score=row_s[top_keys].tolist(),
                prob=top_p.tolist(),
            )
        )
        over = None if blocks is None else self._overview(h, b, pool)
        return LongView(
            layer=self.layer,
            head=h,
            query=i,
            n=n,
            labels=self.labels,
            lo=lo,
            hi=hi,
            window_scores=win_s,
            window_pattern=win_a,
            window_mask=win_s.isfinite(),
            top=top,
            block=b,
            pool=pool,
            overview_pattern=None if over is None else over[0],
            overview_scores=None if over is None else over[1],
            row_scores=row_s,
            row_pattern=row_a,
            row_mask=visible,
            meta={"n_tokens": n, "window": w, "k": k},
        )

    def _overview(self, h: int, b: int, pool: str) -> tuple[torch.Tensor, torch.Tensor]:
        whole = (0, self.n)
        A = blocked.pooled(self.qk, h, self.lse(h), whole, whole, b, pool)
        S = blocked.pooled(self.qk, h, None, whole, whole, b, pool)
        return A.float().cpu(), S.float().cpu()


def layer_scores(loaded: LoadedModel, tokens: Sequence[int], layer: int = 0) -> LayerScores:
    """Q and K of every head of ``layer`` on ``tokens`` (``queries_keys.layer_qk``: the forward
    stopped after the layer's ``k``, later layers not computed), for :meth:`LayerScores.view`.
    Refuses, with a message, an input whose forward would pass the memory limit
    (``blocked.check_input``) and alpha-entmax heads."""
    loaded = check_loaded(loaded, "layer_scores")
    model = loaded.model
    check_layer(model, layer)
    ids = blocked.check_input(model, tokens)
    return LayerScores(layer_qk(model, ids, layer), position_labels(loaded, ids))


ROW_METRICS = ("entropy", "normalized_entropy", "topk_mass", "sink_mass")


def rows_table(stats: Sequence[blocked.RowStats], layer: int, k: int = 1) -> pd.DataFrame:
    """The concentration of each head's blocked rows (``blocked.row_stats``, any length): per head
    and metric of :data:`ROW_METRICS` (the row's entropy in nats, over log of its visible keys,
    its top-``k`` mass, its sink mass: token 0's weight plus a learned sink's), the mean, min and
    max over the rows that see at least ``metrics.MIN_KEYS`` keys; the columns of
    ``View.concentration_table``."""
    out = []
    for s in stats:
        k = _check_int("k", k, 1, int(s.top_weights.shape[1]))
        valid = (s.seen >= metrics.MIN_KEYS).cpu()
        seen = s.seen.double().clamp_min(2).cpu()
        sink = s.sink if s.learned is None else s.sink + s.learned
        values = dict(
            entropy=s.entropy.double().cpu(),
            normalized_entropy=s.entropy.double().cpu() / seen.log(),
            topk_mass=s.top_weights[:, :k].sum(-1).double().cpu(),
            sink_mass=sink.double().cpu(),
        )
        for name in ROW_METRICS:
            summary = metrics.summarize(values[name], valid)
            out.append(
                dict(
                    layer=layer, head=s.head, metric=name, view="sequence", **{a: float(b) for a, b in summary.items()}
                )
            )
    return pd.DataFrame(out)
