"""The arithmetic of softmax attention rows in a block of query rows (docs/maths.md, "Row
penalties in query blocks"): each row's penalty and the numbers its gradient needs
(:func:`softmax_rows`), the gradient in closed form (:func:`softmax_grad`), and a whole block from
its Q and K rows (:func:`forward_block`, :func:`backward_block`), which
:mod:`attn_core.regularizers.rows` loops over.

On :data:`FUSED_DEVICES` a block runs through ``torch.compile`` (:class:`Fused`): its matmul and
one fused kernel that reads the block's scores once, where eager kernels make about ten passes
over them in float32 (eagerly, the every-head penalty cost 2.25x the unregularized step
on a GPU, most of it in those passes). Its inputs are the block's own rows (made contiguous), so
that one traced graph serves every block of a step (shapes are dynamic).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attn_core.regularizers.kinds import row_metric
from attn_core.regularizers.kinds.base import reduce_dtype

# Scores more than FLOOR below their row's max (hidden keys among them) count as exactly FLOOR
# below: exp(-64) = 1.6e-28 of the max's weight changes no float32 or float64 result, and exp
# stays out of its underflow range, where CPU kernels are 10x slower.
FLOOR = 64.0
FUSED_DEVICES = ["cuda"]  # where a block's arithmetic runs compiled (Fused.devices: read at each call)


def shifted(s, m):
    """s - m (row max), in place, at least -:data:`FLOOR` (see there)."""
    return s.sub_(m).clamp_min_(-FLOOR)


def softmax_rows(kind: str, s, n, topk: int):
    """Per-row values of the softmax rows of scores ``s`` (overwritten) and the three row numbers
    their gradient needs: the row max, log Z and the row metric's own (its ``softmax``: H,
    |p|_2^2 or the top-k mass; docs/maths.md). An unknown ``kind`` is refused by name."""
    metric = row_metric(kind)
    m = s.amax(-1, keepdim=True)
    t = shifted(s, m)
    e = t.exp()
    Z = e.sum(-1)
    log_z = Z.log()
    value, x = metric.softmax(e, t, Z, log_z, n, topk)
    return value, (m.squeeze(-1), log_z, x)


def softmax_grad(kind: str, s, n, g, m, log_z, x, topk: int):
    """d(value)/d(scores) of a block as (P, c) with dS = c[..., None] * P: c per row (the incoming
    gradient g folded in), P the block (``s`` is overwritten); m, log Z and x are the forward's
    row numbers (the row metric's ``softmax_grad``)."""
    metric = row_metric(kind)
    logp = shifted(s, m[..., None]).sub_(log_z[..., None])
    return metric.softmax_grad(logp, logp.exp(), n, g, x, topk)


def with_sink_column(s: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """Scores ``s`` [b, h, R, K] with each head's sink logit ``sink`` [h] as one more column, the
    last (a key every query sees, whose value is never read); ``s`` itself without a sink."""
    if sink is None:
        return s
    return torch.cat([s, sink.to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1)


def sink_grad(P: torch.Tensor, c: torch.Tensor, sink: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the keys' part of P, d sink [h]) of a block's dS = c[..., None] P whose last column is the
    sink's (:func:`with_sink_column`); P itself and zeros without a sink."""
    if sink is None:
        return P, P.new_zeros(P.shape[1])
    return P[..., :-1], (c * P[..., -1]).sum((0, 2))


def block_scores(qb, kb, scale: float, positions, keys, window: int | None, key_mask, sink=None):
    """Scores ``scale qb kb^T`` of a block of query rows at ``positions`` [R] and keys at ``keys``
    [K] (``key_mask`` [b, K] or None) in the reduction dtype, hidden keys set to a very negative
    finite number (exp gives exactly 0; a row with no visible key stays finite); with ``sink``
    [h], each head's sink logit as one more column (:func:`with_sink_column`)."""
    rows = qb if scale == 1.0 else qb * scale
    s = (rows @ kb.transpose(-1, -2)).to(reduce_dtype(qb.dtype))
    vis = None
    if window is not None:
        vis = keys[None, :] <= positions[:, None]
        if window > 0:
            vis = vis & (positions[:, None] - keys[None, :] < window)
    if key_mask is not None:
        keys_seen = key_mask[:, None, None, :]
        vis = keys_seen if vis is None else vis & keys_seen
    s = s if vis is None else s.masked_fill(~vis, torch.finfo(s.dtype).min / 4)
    return with_sink_column(s, sink)


def forward_block(qb, kb, positions, keys, key_mask, scale, window, kind, n, topk, sink=None):
    """:func:`softmax_rows` of one block, from its query rows ``qb`` and keys ``kb``."""
    return softmax_rows(kind, block_scores(qb, kb, scale, positions, keys, window, key_mask, sink), n, topk)


def backward_block(qb, kb, positions, keys, key_mask, scale, window, kind, n, g, stats, topk, sink=None):
    """:func:`softmax_grad` of one block as (P, c, d sink) with dS = c P over the keys in qb's
    dtype (the scale in c) and the sink logits' gradient [h] (:func:`sink_grad`)."""
    s = block_scores(qb, kb, scale, positions, keys, window, key_mask, sink)
    P, c = softmax_grad(kind, s, n, g.to(s.dtype), *stats, topk)
    P, d_sink = sink_grad(P, c, sink)
    return P.to(qb.dtype), (c * scale).to(qb.dtype)[..., None], d_sink


def block_inputs(q, k, a: int, e: int, lo: int, hi: int, positions, key_mask) -> tuple:
    """A block's own rows (contiguous copies: the same traced graph for every block): its query
    rows a..e-1, its keys lo..hi-1, their positions and the key mask."""
    keys = torch.arange(lo, hi, device=q.device)
    km = None if key_mask is None else key_mask[:, lo:hi].contiguous()
    return q[:, :, a:e].contiguous(), k[:, :, lo:hi].contiguous(), positions[a:e].clone(), keys, km


class Fused:
    """``fn(x, *args)`` compiled (dynamic shapes) when ``x`` is on one of ``devices``; eagerly
    elsewhere, inside a graph being compiled (which fuses it anyway) and from the first failure
    to compile on (the same maths). Compiled as one graph: nothing has run when compiling fails."""

    def __init__(self, fn: Callable, devices: list[str], backend: str = "inductor"):
        self.fn, self.devices, self.backend = fn, devices, backend
        self.compiled: Callable | None = None
        self.failed = False

    def active(self, x: torch.Tensor) -> bool:
        return not self.failed and x.device.type in self.devices and not torch.compiler.is_compiling()

    def __call__(self, x: torch.Tensor, *args):
        if not self.active(x):
            return self.fn(x, *args)
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, dynamic=True, fullgraph=True, backend=self.backend)
        try:
            return self.compiled(x, *args)
        except Exception:
            self.failed = True
            return self.fn(x, *args)


fused_forward = Fused(forward_block, FUSED_DEVICES)
fused_backward = Fused(backward_block, FUSED_DEVICES)
