"""Scores of one head at any length, in blocks of queries x keys: never a T x T matrix.

For layer l of a model and an input of T tokens, :func:`layer_qk` (``bilinear.queries_keys``,
the one function that gives a layer's Q and K as the model applies them) runs the forward once up to
that layer (hooks on ``attn_in``, ``q`` and ``k``; the forward stops after ``k``) and keeps Q of
every query head [H, T, w] (after rotary, with its bias) and K of every key/value head [G, T, w]
(grouped-query attention: query head h reads key head ``cfg.kv_head(h)``), on the model's device.
A head change then recomputes only that head's blocks from them:

    S_ij = Q_i . K_j * scale_h (then c tanh(S_ij / c) with a soft cap),  visible when j <= i (and i - j < window for a sliding window,
    as ``Transformer.mask`` has it), A_ij = exp(S_ij - lse_i), lse_i = log sum_j visible exp S_ij
    (and exp(sink_h) in the sum with a learned sink logit per head, ``LayerQK.sink``)

:func:`row_stats` walks the query rows a block of ``block`` queries at a time and, inside, the
keys they see a block at a time, merging online (Milakov & Gimelshein 2018; FlashAttention):
the running max m and sum l of exp(S - m) give lse = m + log l; the running
t = sum exp(S - m)(S - m) gives the entropy H = -sum A log A = log l - t / l (rescaled by
exp(m - m') with t' = e (t + (m - m') l) when the max moves); the top-k of each key block is
merged with the row's top-k so far. Memory is O(T (k + P) + block^2) for k top keys and P
offsets. Per row: the top-k keys (score, weight), the entropy, the sink mass (the weight on the
first token, Gu et al.'s alpha_1, ``bilinear.sinks``), and the offset profile (the weight on keys
i, i-1, .., i-P+1). :func:`pooled` draws any region of A (or S) in tiles (max or mean), a block
at a time, with the rows' lse from :func:`row_stats`. Softmax heads only (not alpha-entmax).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from attn_core import limits
from attn_core.bilinear.checks import check_ids, check_model, check_tokens, longest_dense_view
from attn_core.bilinear.queries_keys import LayerQK
from attn_core.bilinear.queries_keys import layer_qk as layer_qk  # the one Q and K of a layer, here for its callers
from attn_core.model import Transformer
from attn_core.model.attention import WINDOW_BLOCK
from attn_core.validate import check_int

LONG_INPUT = 512  # inputs longer than this are long: the page, the CLI and bilinear.long read them by blocks
BLOCK = 512  # queries (and keys) per block: a block of scores is BLOCK^2 floats
TOP_K = 8  # the top keys per query row a long view lists by default (page, CLI, LongView)
OFFSETS = 32  # the offset profile: keys i, i-1, .., i-OFFSETS+1
POOLS = ("max", "mean")

Progress = Callable[[int, int], None]


def forward_bytes(model: Transformer, n: int) -> int:
    """About what :func:`layer_qk` and :func:`row_stats` allocate for ``n`` tokens, in bytes: per
    token, float32 activations of the forward (the residual stream and its norms, Q, K and V with
    the grouped keys repeated per query head, Z, the rotary angles, the MLP's hidden layers), what
    is kept (X, Q, K) and the rows' statistics; plus the blocks (queries x keys, never n x n: the
    fused kernel takes the causal mask as such and a sliding window a block at a time). A model
    whose attention forms S (alpha-entmax, heads of unequal widths) also holds a layer's n x n
    scores, weights and mask."""
    cfg = check_model(model, "forward_bytes").cfg
    H, G, d, dh = cfg.n_heads, cfg.kv_heads, cfg.d_model, cfg.d_head
    w = max(cfg.qk_width(l) for l in range(cfg.n_layers)) if cfg.qk == "factored" else d
    forward = 4 * d + 2 * H * w + G * w + (G + H) * dh + H * dh + 2 * w + 3 * cfg.d_mlp
    kept = d + H * w + G * w
    rows = 4 + 2 * TOP_K + OFFSETS + 2 * TOP_K  # lse, entropy, sink, seen; top scores, weights; offsets; keys (int64)
    per_token = limits.FLOAT_BYTES * (forward + kept + rows)
    window = max((cfg.window(l) for l in range(cfg.n_layers)), default=0)
    blocks = limits.FLOAT_BYTES * (6 * BLOCK * BLOCK + 2 * H * WINDOW_BLOCK * (WINDOW_BLOCK + window))
    dense = 0 if cfg.entmax_alpha == 1.0 and cfg.d_qk is None else (3 * H * limits.FLOAT_BYTES + 1) * n * n
    return n * per_token + blocks + dense


def check_input(model: Transformer, tokens: Sequence[int]) -> list[int]:
    """An input of a page: over :data:`LONG_INPUT` tokens checked as blocked scores need (the
    vocabulary, the context and the forward's memory, :func:`forward_bytes`, within the limit),
    else as a dense view needs (its n x n views too)."""
    model = check_model(model, "check_input")
    if len(tokens) > LONG_INPUT:
        ids = check_ids(model, tokens)
        limits.check_memory(f"the forward on {len(ids)} tokens", forward_bytes(model, len(ids)))
        return ids
    return check_tokens(model, tokens)


def longest_input(model: Transformer) -> int:
    """The most tokens a page's input may have: the context when it is longer than
    :data:`LONG_INPUT` (blocked scores hold no n x n scores), cut to what the forward's
    memory (:func:`forward_bytes`) leaves within the limit; else what a dense view allows.
    Alpha-entmax heads have no blocked rows: at most :data:`LONG_INPUT` tokens (a dense view)."""
    model = check_model(model, "longest_input")
    n_ctx = model.cfg.n_ctx
    if model.cfg.entmax_alpha != 1.0:
        return min(LONG_INPUT, longest_dense_view(model))
    if n_ctx <= LONG_INPUT:
        return longest_dense_view(model)
    budget, lo, hi = limits.memory_limit(), 0, n_ctx  # forward_bytes grows with n: the largest n within budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if forward_bytes(model, mid) <= budget else (lo, mid - 1)
    return max(lo, min(n_ctx, longest_dense_view(model)))


@dataclass
class RowStats:
    """Per query row of one head: lse [T], top keys [T, k] (-1 past the keys a row sees), their
    scores and weights, entropy [T], sink mass [T] (weight on key 0), offsets [T, P] (weight on
    key i - d, NaN where not visible), seen [T] (keys the row sees); with a sink logit
    (``LayerQK.sink``) ``learned`` [T], the weight on it (else None): the row's sink mass is
    ``learned`` + ``sink``, and its entropy is that of the keys and the sink."""

    head: int
    lse: torch.Tensor
    top_keys: torch.Tensor
    top_scores: torch.Tensor
    top_weights: torch.Tensor
    entropy: torch.Tensor
    sink: torch.Tensor
    offsets: torch.Tensor
    seen: torch.Tensor
    learned: torch.Tensor | None = None

    @property
    def n(self) -> int:
        return self.lse.shape[0]

    def queries(self) -> list[dict]:
        """Every row as ``attn-lab scores --topk --json`` prints it: query, top [{key, score, weight}], entropy, sink
        (and learned_sink with a sink logit)."""
        keys, s, w = self.top_keys.tolist(), self.top_scores.tolist(), self.top_weights.tolist()
        ent, sink = self.entropy.tolist(), self.sink.tolist()
        out = [
            dict(
                query=i,
                top=[dict(key=k, score=a, weight=b) for k, a, b in zip(keys[i], s[i], w[i]) if k >= 0],
                entropy=ent[i],
                sink=sink[i],
            )
            for i in range(len(ent))
        ]
        if self.learned is not None:
            for row, x in zip(out, self.learned.tolist()):
                row["learned_sink"] = x
        return out


def _block(block: int) -> int:
    return check_int("block", block, 1, 1 << 16)


@contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """torch's CPU ops run on one thread inside (the previous count comes back after). A block
    of 512 x 512 is too small to share: each of the many ops of a block loop waits for every
    thread, and on a busy machine (more runnable processes than CPUs) each wait can cost a
    scheduler time slice. ``row_stats`` of one head at 8192 tokens took 45-61 s on 2 threads and
    2.7-3.6 s on one, load average 13 on 2 CPUs (README, "Long contexts without T x T")."""
    before = torch.get_num_threads()
    if device.type != "cpu" or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@torch.no_grad()
def row_stats(
    qk: LayerQK,
    head: int,
    k: int = TOP_K,
    offsets: int = OFFSETS,
    block: int = BLOCK,
    progress: Progress | None = None,
) -> RowStats:
    """The per-row statistics of ``head`` (see the module doc), one query block at a time;
    ``progress(done, total)`` after each block of queries."""
    with one_thread(qk.q.device):
        return _row_stats(qk, head, k, offsets, block, progress)


def _row_stats(qk: LayerQK, head: int, k: int, offsets: int, block: int, progress: Progress | None) -> RowStats:
    h, T = qk.check_head(head), qk.n
    k = check_int("k (top keys)", k, 1, T)
    P = min(T, check_int("offsets", offsets, 1, 1 << 16))
    b = _block(block)
    dev, dt = qk.q.device, qk.q.dtype
    lse = torch.empty(T, dtype=dt, device=dev)
    ent = torch.empty(T, dtype=dt, device=dev)
    top_s = torch.empty(T, k, dtype=dt, device=dev)
    top_i = torch.empty(T, k, dtype=torch.long, device=dev)
    for q0 in range(0, T, b):
        q1 = min(T, q0 + b)
        vals = torch.full((q1 - q0, k), -math.inf, dtype=dt, device=dev)
        idx = torch.full((q1 - q0, k), -1, dtype=torch.long, device=dev)
        lo, hi = qk.key_span(q0, q1)
        m = l = t = None
        if qk.sink is not None:  # the sink logit first: exp(sink - m) = 1 and its (S - m) = 0
            m = qk.sink[h].to(dt).expand(q1 - q0).clone()
            l, t = torch.ones_like(m), torch.zeros_like(m)
        for k1 in range(hi, lo, -b):  # the diagonal block first: every row sees its own key there
            k0 = max(lo, k1 - b)
            S = qk.scores(h, q0, q1, k0, k1)
            top = S.amax(-1)
            m_new = top if m is None else torch.maximum(m, top)
            D = S - m_new[:, None]
            E = D.exp()  # 0 where invisible
            ED = E * D if qk.full(q0, q1, k0, k1) else torch.where(E > 0, E * D, torch.zeros_like(E))
            if m is None:
                l, t = E.sum(-1), ED.sum(-1)
            else:
                shift = m - m_new
                decay = shift.exp()
                t = decay * (t + shift * l) + ED.sum(-1)
                l = decay * l + E.sum(-1)
            m = m_new
            if dev.type != "cpu":  # one merge per block, no host read (CUDA, meta)
                vals, idx = _merge(vals, idx, S, k, k0)
                continue
            rows = (top > vals[:, -1]).nonzero()[:, 0]  # on the CPU, only rows whose k-th best this block beats
            if len(rows) == q1 - q0:
                vals, idx = _merge(vals, idx, S, k, k0)
            elif len(rows):
                vals[rows], idx[rows] = _merge(vals[rows], idx[rows], S[rows], k, k0)
        lse[q0:q1] = m + l.log()
        ent[q0:q1] = l.log() - t / l
        top_s[q0:q1], top_i[q0:q1] = vals, torch.where(vals.isfinite(), idx, torch.full_like(idx, -1))
        if progress is not None:
            progress(q1, T)
    rows = torch.arange(T, device=dev)
    sink = (qk.scores(h, 0, T, 0, 1)[:, 0] - lse).exp() if T else lse
    top_w = (top_s - lse[:, None]).exp()
    seen = rows + 1 if not qk.window else torch.clamp(rows + 1, max=qk.window)
    learned = None if qk.sink is None else (qk.sink[h].to(dt) - lse).exp()
    return RowStats(h, lse, top_i, top_s, top_w, ent, sink, offset_profile(qk, h, lse, P), seen, learned)


def _merge(
    vals: torch.Tensor, idx: torch.Tensor, S: torch.Tensor, k: int, k0: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k (values, key positions) of rows so far merged with a block of their scores."""
    v, i = S.topk(min(k, S.shape[-1]), dim=-1)
    vals, at = torch.cat([vals, v], -1).topk(k, dim=-1)
    return vals, torch.cat([idx, i + k0], -1).gather(-1, at)


def offset_profile(qk: LayerQK, head: int, lse: torch.Tensor, offsets: int) -> torch.Tensor:
    """[T, P]: the weight of key i - d for d = 0..P-1 (NaN where the key is not visible)."""
    h, T = qk.check_head(head), qk.n
    Q, K = qk.q[h], qk.k[qk.kv_head[h]]
    out = torch.full((T, offsets), math.nan, dtype=Q.dtype, device=Q.device)
    for d in range(min(offsets, T, qk.window or T)):
        s = (Q[d:] * K[: T - d]).sum(-1) * qk.scale[h]
        out[d:, d] = (s - lse[d:]).exp()
    return out


@torch.no_grad()
def pooled(
    qk: LayerQK,
    head: int,
    lse: torch.Tensor | None,
    rows: tuple[int, int],
    cols: tuple[int, int],
    tile: int,
    pool: str = "max",
    progress: Progress | None = None,
) -> torch.Tensor:
    """A (or S when ``lse`` is None) of queries rows[0]..rows[1]-1 and keys cols[0]..cols[1]-1
    pooled in ``tile`` x ``tile`` cells (the max or mean of the visible cells; NaN for a cell
    with none), [ceil(nq / tile), ceil(nk / tile)], computed a block of tiles at a time."""
    h, T = qk.check_head(head), qk.n
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {', '.join(POOLS)}, got {pool!r}")
    r0, r1 = rows
    c0, c1 = cols
    if not (0 <= r0 < r1 <= T and 0 <= c0 < c1 <= T):
        raise ValueError(f"the region {rows} x {cols} is outside 0..{T} x 0..{T}")
    tile = check_int("tile", tile, 1, T)
    step = tile * max(1, BLOCK // tile)  # a whole number of tiles per block
    nr, nc = math.ceil((r1 - r0) / tile), math.ceil((c1 - c0) / tile)
    with one_thread(qk.q.device):
        return _pooled(qk, h, lse, rows, cols, tile, pool, progress, step, (nr, nc))


def _pooled(qk, h, lse, rows, cols, tile, pool, progress, step, shape) -> torch.Tensor:
    """:func:`pooled` once its arguments are checked."""
    (r0, r1), (c0, c1), (nr, nc) = rows, cols, shape
    dev, dt = qk.q.device, qk.q.dtype
    out = torch.full((nr, nc), math.nan, dtype=dt, device=dev)
    for q0 in range(r0, r1, step):
        q1 = min(r1, q0 + step)
        lo, hi = qk.key_span(q0, q1)
        lo, hi = max(c0, c0 + (lo - c0) // tile * tile), min(c1, hi)  # from a tile's edge
        for k0 in range(lo, hi, step):
            k1 = min(hi, k0 + step)
            S = qk.scores(h, q0, q1, k0, k1)
            cell = _pool(S, None if lse is None else lse[q0:q1], tile, pool)
            a, c = (q0 - r0) // tile, (k0 - c0) // tile
            out[a : a + cell.shape[0], c : c + cell.shape[1]] = cell
        if progress is not None:
            progress(q1 - r0, r1 - r0)
    return out


def _pool(S: torch.Tensor, lse: torch.Tensor | None, tile: int, pool: str) -> torch.Tensor:
    """S [nq, nk] (-inf where not visible), or A = exp(S - lse) with ``lse``, pooled in tiles.
    The max of A over a tile is exp(max_i (max_j S_ij - lse_i)): the exp runs on row maxima only."""
    nq, nk = S.shape
    a, b = math.ceil(nq / tile), math.ceil(nk / tile)
    if a * tile != nq or b * tile != nk:
        S = torch.nn.functional.pad(S, (0, b * tile - nk, 0, a * tile - nq), value=-math.inf)
    if pool == "max":
        R = S.reshape(a * tile, b, tile).amax(-1)  # [rows, b]
        if lse is not None:
            R = R - torch.nn.functional.pad(lse, (0, a * tile - nq), value=0.0)[:, None]
        out = R.reshape(a, tile, b).amax(1)
        out = out.masked_fill(out == -math.inf, math.nan)
        return out if lse is None else out.exp()
    vis = S.isfinite()
    M = S if lse is None else S - torch.nn.functional.pad(lse, (0, a * tile - nq), value=0.0)[:, None]
    M = M.exp() if lse is not None else M
    M = M.masked_fill(~vis, 0.0).reshape(a, tile, b, tile)
    count = vis.reshape(a, tile, b, tile).sum((1, 3))
    return (M.sum((1, 3)) / count.clamp_min(1)).masked_fill(count == 0, math.nan)


def tile_for(n: int, pixels: int) -> int:
    """The tile (positions per cell side) that draws ``n`` positions in at most ``pixels`` cells."""
    return max(1, math.ceil(n / check_int("pixels", pixels, 1, 1 << 16)))
