"""Views of long inputs: a window, the top-k keys and a pooled overview instead of n^2 cells.

A model with a context of 1024 to 8192 tokens has n^2 scores per head; a browser cannot draw
them interactively. For one head and one query position i, :class:`LongView` holds:

- ``window``: the exact S and A of the ``w`` positions lo..hi that end at i (at 0..w-1 for an
  early query), as a w x w square with the causal mask: query i's row there is its scores
  against keys i-w+1..i, the model's own values;
- ``top``: the k keys with the largest attention A_ij anywhere in 0..i (``torch.topk`` of the
  row; with softmax or entmax the order is that of the scores), with position, label, score,
  probability;
- ``overview``: A (and S) of every query and key pooled into at most ``blocks`` x ``blocks``
  cells of b x b positions, b = ceil(n / blocks). Max-pooling (the default) keeps a sharp head
  visible: a head that puts all its weight on one key per query shows 1.0 in every block its
  keys fall in, where a mean over b x b cells would fade it to about 1/b. ``pool="mean"``
  gives the block average of the visible cells instead. Blocks with no visible cell (above
  the causal diagonal) are NaN.

:func:`layer_scores` computes S of every head of one layer once, running the model only up to
that layer (a hook on ``act_name("attn_scores", layer)`` keeps S and stops the forward there);
the pattern is the model's own ``attention_weights`` of it. A head or query change is then a
slice: the dashboard caches the :class:`LayerScores` by (model key, tokens, layer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch

from attn_core import metrics
from attn_core.bilinear.checks import (
    MAX_SCORE_BYTES,
    check_heads,
    check_layer,
    check_loaded,
    check_tokens,
    layer_mask,
)
from attn_core.bilinear.tokens import position_labels
from attn_core.bilinear.views import View
from attn_core.hooks import act_name
from attn_core.model import attention_weights
from attn_core.sources import LoadedModel
from attn_core.validate import is_int

LONG_INPUT = 512  # inputs longer than this are shown as a LongView (window + top-k + overview)
WINDOW = 64  # positions in the exact window
TOP_K = 16  # keys in the top-k list
BLOCKS = 256  # the overview has at most BLOCKS x BLOCKS cells
POOLS = ("max", "mean")


class _Stop(Exception):
    """Raised by the hook after the needed layer's scores: the rest of the forward is skipped."""


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
    overview_pattern: torch.Tensor  # [nb, nb], NaN where a block has no visible cell
    overview_scores: torch.Tensor  # [nb, nb]
    row_scores: torch.Tensor  # [n], the query's full row (kept on the server, for its metrics)
    row_pattern: torch.Tensor  # [n]
    row_mask: torch.Tensor  # [n] bool, the keys the query sees
    meta: dict = field(default_factory=dict)

    @property
    def window_labels(self) -> list[str]:
        return self.labels[self.lo : self.hi + 1]

    @property
    def n_blocks(self) -> int:
        return self.overview_pattern.shape[-1]

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
    """S of every head of one layer on one input (what the dashboard caches per (model key,
    tokens, layer)); ``pattern(head)`` is the model's attention for it, ``view(...)`` a head's
    :class:`LongView`, ``dense(heads)`` a :class:`View` for server-side tables."""

    layer: int
    token_ids: list[int]
    labels: list[str]
    scores: torch.Tensor  # [n_heads, n, n] float32, every head of the layer
    mask: torch.Tensor  # [n, n] bool
    entmax_alpha: float = 1.0

    @property
    def n(self) -> int:
        return len(self.token_ids)

    @property
    def n_heads(self) -> int:
        return self.scores.shape[0]

    def _head(self, head: int) -> int:
        if not is_int(head) or not 0 <= head < self.n_heads:
            raise ValueError(f"head {head!r} is outside 0..{self.n_heads - 1}")
        return int(head)

    def pattern(self, head: int) -> torch.Tensor:
        """A [n, n] of ``head``: the model's attention weights of its S."""
        return attention_weights(self.scores[self._head(head)], self.mask, self.entmax_alpha)

    def dense(self, heads: Sequence[int] | None = None) -> View:
        """A :class:`View` of ``heads`` (default all) for tables computed on the server (its n^2
        cells are not meant for a browser)."""
        heads = list(range(self.n_heads)) if heads is None else [self._head(h) for h in heads]
        S = self.scores[heads]
        A = attention_weights(S, self.mask, self.entmax_alpha)
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
        blocks: int = BLOCKS,
        pool: str = "max",
    ) -> LongView:
        """The :class:`LongView` of ``head`` for query position ``query`` (negative counts from
        the end): a window of ``window`` positions, the ``k`` top keys, an overview of at most
        ``blocks`` x ``blocks`` cells pooled by ``pool``."""
        h, n = self._head(head), self.n
        if not is_int(query) or not -n <= query < n:
            raise ValueError(f"query {query!r} is outside 0..{n - 1} ({n} tokens)")
        i = int(query) % n
        w = min(_check_int("window", window, 1), n)
        k = _check_int("k", k, 1)
        b = math.ceil(n / _check_int("blocks", blocks, 1))
        S = self.scores[h]
        A = self.pattern(h)
        lo = max(0, i - w + 1)
        hi = max(i, w - 1)
        row_s, row_a = S[i], A[i]
        visible = self.mask[i]
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
        return LongView(
            layer=self.layer,
            head=h,
            query=i,
            n=n,
            labels=self.labels,
            lo=lo,
            hi=hi,
            window_scores=S[lo : hi + 1, lo : hi + 1].clone(),
            window_pattern=A[lo : hi + 1, lo : hi + 1].clone(),
            window_mask=self.mask[lo : hi + 1, lo : hi + 1].clone(),
            top=top,
            block=b,
            pool=pool,
            overview_pattern=pool_blocks(A, self.mask, b, pool),
            overview_scores=pool_blocks(S, self.mask, b, pool),
            row_scores=row_s.clone(),
            row_pattern=row_a.clone(),
            row_mask=visible.clone(),
            meta={"n_tokens": n, "window": w, "k": k},
        )


def layer_scores(
    loaded: LoadedModel, tokens: Sequence[int], layer: int = 0, max_bytes: int = MAX_SCORE_BYTES
) -> LayerScores:
    """S of every head of ``layer`` on ``tokens``, read from the model's own hook point with the
    forward stopped right after it (later layers are not computed). Refuses, with a message,
    an input whose scores would take more than ``max_bytes``."""
    loaded = check_loaded(loaded, "layer_scores")
    model = loaded.model
    check_layer(model, layer)
    ids = check_tokens(model, tokens)
    n, H = len(ids), len(check_heads(model, None))
    need = H * n * n * 4
    if need > max_bytes:
        raise ValueError(
            f"{n} tokens x {H} heads need {need / 2**30:.1f} GiB for one layer's scores "
            f"(limit {max_bytes / 2**30:.1f} GiB); use fewer tokens"
        )
    kept: dict[str, torch.Tensor] = {}

    def keep_and_stop(S: torch.Tensor, name: str):
        kept["S"] = S[0].detach().float().cpu()
        raise _Stop

    device = model.embed.W_E.device
    with torch.no_grad():
        try:
            model.run_with_hooks(torch.tensor([ids], device=device), [(act_name("attn_scores", layer), keep_and_stop)])
        except _Stop:
            pass
    labels = position_labels(loaded, ids)
    mask = layer_mask(model, layer, n).cpu()
    return LayerScores(layer, ids, labels, kept["S"], mask, float(model.cfg.entmax_alpha))
