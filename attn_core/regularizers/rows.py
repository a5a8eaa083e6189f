"""Row penalties of attention computed from Q and K in query blocks (docs/maths.md, "Row
penalties in query blocks"), so that no ``[batch, heads, T, T]`` pattern is kept for backward.

For the rows ``A_i = softmax(s_i)`` (or alpha-entmax) of ``s_i = q_i K^T`` masked to the keys
that query position ``i`` sees, :func:`row_values` returns the per-row penalty of a row metric
of the registry (``regularizers.kinds``: normalized entropy, 1 - Hoyer, 1 - top-k mass, sink
mass; an unknown kind refused by name) for every row, computed ``block`` query rows at a time,
with an optional learned sink logit per head (gpt-oss) as one more outcome of every row. A custom autograd function keeps only Q, K (the model holds them
for its own attention backward anyway) and a few numbers per row; its backward, one opaque
operator (``attn_lab::rows_backward``, so that a compiler cannot hoist the recomputed scores into
the forward and keep them), forms each block's scores again and applies the row's gradient in
closed form (softmax, and alpha-entmax through its Jacobian). Memory is
O(batch x heads x block x T) at any moment, never O(T^2) per layer kept from forward to
backward. Under a causal mask a block only forms the keys its queries can see.

:func:`head_means` averages the rows of each head over the informative ones (at least
``metrics.MIN_KEYS`` visible keys), exactly or as the unbiased sampled-rows estimate;
:func:`row_metrics` gives several metrics of every row from one pass, without gradients.

Softmax entropy and sink mass of every row (no padding, no sampled rows) take one fused
attention pass instead where a kernel applies (:mod:`attn_core.regularizers.flash_rows`, the
default ``path="auto"``); ``path="blocked"`` keeps the blocks for them too.

Masks: ``window`` None sees every key; 0 is the causal mask; w > 0 a causal sliding window of w
keys (``i - j < w``); ``key_mask`` [batch, T] (True = a real token) hides padding keys, and a
padding query's row is not counted. Every tensor made here takes the device of ``q``; scores are
formed in q's dtype (bf16 under bf16 autocast, like the model's own attention) and reduced in
float32 (float64 stays float64).
"""

from __future__ import annotations

import torch

from attn_core import metrics
from attn_core.model.attention import attention_weights
from attn_core.regularizers import flash_rows
from attn_core.regularizers.kinds import ROW_METRICS, row_metric
from attn_core.regularizers.kinds.base import reduce_dtype
from attn_core.regularizers.softmax_rows import (
    FLOOR,
    block_inputs,
    fused_backward,
    fused_forward,
    sink_grad,
    with_sink_column,
)
from attn_core.regularizers.softmax_rows import softmax_grad as _softmax_grad
from attn_core.regularizers.softmax_rows import softmax_rows as _softmax_rows

ROW_KINDS = tuple(ROW_METRICS)  # the row penalties behind data and vocab regularizers (the registry, kinds/)
# How softmax entropy rows are computed: "auto" (one fused attention pass where a kernel applies,
# flash_rows; else in query blocks), "flash" (the fused pass, or an error) or "blocked" (the
# query blocks below, the older path, kept for comparison)
PATHS = ("auto", "flash", "blocked")
# Scores formed at once per block (batch x heads x rows x keys): float32 temporaries of 2 MiB
# on the CPU (eager CPU kernels are fastest while a block stays in cache), 128 MiB on an
# accelerator (fewer, larger blocks save kernel launches). Compiled, a block is 4x larger: its
# elementwise work is fused, and fewer blocks make a smaller graph that compiles faster.
BLOCK_SCORES = {"cpu": 2**19, "meta": 2**19}
BLOCK_SCORES_DEFAULT = 2**25
COMPILED_FACTOR = 4


def block_rows(q: torch.Tensor, T: int, block: int | None = None) -> int:
    """Query rows per block: ``block``, or as many as keep batch x heads x rows x T scores under
    the device's budget (:data:`BLOCK_SCORES`), a multiple of 16 and at least 16."""
    if block is not None:
        if block < 1:
            raise ValueError(f"block must be at least 1 row, got {block}")
        return block
    budget = BLOCK_SCORES.get(q.device.type, BLOCK_SCORES_DEFAULT)
    if torch.compiler.is_compiling():
        budget *= COMPILED_FACTOR
    rows = budget // max(1, q.shape[0] * q.shape[1] * T)
    return max(16, rows // 16 * 16)  # a multiple of 16 rows


def visible(
    positions: torch.Tensor, lo: int, hi: int, window: int | None, key_mask: torch.Tensor | None
) -> torch.Tensor | None:
    """Which keys ``lo..hi-1`` each query at ``positions`` [R] sees: [R, K] (or [b, 1, R, K] with
    ``key_mask``); None when every key is visible."""
    if window is None and key_mask is None:
        return None
    j = torch.arange(lo, hi, device=positions.device)
    out = None
    if window is not None:
        i = positions[:, None]
        out = j[None, :] <= i
        if window > 0:
            out = out & (i - j[None, :] < window)
    if key_mask is not None:
        keys = key_mask[:, None, None, lo:hi]
        out = keys if out is None else out & keys
    return out


def visible_counts(positions: torch.Tensor, T: int, window: int | None, key_mask: torch.Tensor | None) -> torch.Tensor:
    """Visible keys of each query row, [1, R] (or [b, R] with ``key_mask``), on positions' device,
    from prefix sums (no T x T mask is formed)."""
    b = 1 if key_mask is None else key_mask.shape[0]
    keys = torch.ones(b, T, device=positions.device) if key_mask is None else key_mask.to(torch.float32)
    if window is None:
        return keys.sum(-1, keepdim=True).expand(b, positions.shape[0])
    prefix = torch.nn.functional.pad(keys.cumsum(-1), (1, 0))  # prefix[:, n] = keys before n
    first = (positions - window + 1).clamp_min(0) if window > 0 else torch.zeros_like(positions)
    return prefix[:, positions + 1] - prefix[:, first]


def _scores(q, k, scale, a, e, lo, hi, positions, window, key_mask, contiguous, sink=None):
    """Scores ``scale q k^T`` of query rows a..e-1 and keys lo..hi-1 in the reduction dtype,
    hidden keys set to a very negative finite number (exp gives exactly 0; a row with no visible
    key stays finite), and each head's ``sink`` logit as a last column when given. Contiguous
    causal rows are masked only where a key can follow a query."""
    rows = q[:, :, a:e] if scale == 1.0 else q[:, :, a:e] * scale
    s = (rows @ k[:, :, lo:hi].transpose(-1, -2)).to(reduce_dtype(q.dtype))
    if window is not None or key_mask is not None:
        c0 = max(a, lo) if (contiguous and window == 0 and key_mask is None) else lo
        vis = visible(positions[a:e], c0, hi, window, key_mask)
        s[..., c0 - lo :].masked_fill_(~vis, torch.finfo(s.dtype).min / 4)
    return with_sink_column(s, sink)


def _sink_visible(vis: torch.Tensor | None, s: torch.Tensor, sink) -> torch.Tensor | None:
    """The visible keys ``vis`` of a block with the sink's column (every query sees it) added."""
    if sink is None or vis is None:
        return vis
    return torch.cat([vis.expand(*s.shape[:-1], s.shape[-1] - 1), vis.new_ones(*s.shape[:-1], 1)], -1)


def _entmax_rows(kind: str, s, vis, topk: int, alpha: float, sink=None):
    """Per-row values of alpha-entmax rows (and of softmax rows for a metric without a closed
    form, alpha 1), through the row metric's definition (``metrics``). Softmax rows read the
    scores as masked (hidden keys very negative and finite): a row that sees no key stays finite.
    With a ``sink`` the last column is the sink logit's."""
    full = torch.ones_like(s, dtype=torch.bool) if vis is None or alpha == 1.0 else vis
    p = attention_weights(s, full, alpha)
    return row_metric(kind).dense(p, _sink_visible(vis, s, sink), topk, sink=sink is not None)


def _entmax_grad(kind: str, s, vis, n, g, topk: int, alpha: float, sink=None) -> torch.Tensor:
    """dS of a block of alpha-entmax rows: the metric's gradient v in p (its ``weights_grad``),
    then the entmax Jacobian J^T v = u v - (<u, v> / sum u) u with u = p^(2 - alpha) on the
    support (docs/maths.md). With a ``sink`` the last column of ``s`` is the sink logit's
    (softmax rows only)."""
    full = torch.ones_like(s, dtype=torch.bool) if vis is None or alpha == 1.0 else vis
    p = attention_weights(s, full, alpha)
    v = row_metric(kind).weights_grad(p, vis, n, topk, sink=sink is not None)
    u = (p > 0).to(p.dtype) if alpha == 2.0 else p.pow(2 - alpha)
    uv = (u * v).sum(-1, keepdim=True) / u.sum(-1, keepdim=True)
    return g[..., None] * u * (v - uv)


def row_penalty(kind: str, p: torch.Tensor, mask: torch.Tensor | None, k: int = 1) -> torch.Tensor:
    """Per-row penalty of attention rows ``p`` [..., n] (lower = more concentrated): the row
    metric's dense definition (``attn_core.metrics``), the one the blocked rows are tested
    against. An unknown ``kind`` is refused by name."""
    return row_metric(kind).dense(p, mask, k)


class _BlockedRows(torch.autograd.Function):
    """values [b, h, R] of the rows of (q, k); see :func:`row_values`."""

    @staticmethod
    def forward(ctx, q, k, positions, key_mask, sink, plan):
        kind, topk, alpha, window, contiguous, block, scale = plan
        T = k.shape[2]
        B = block_rows(q, T, block)
        n_rows = _counts(q, positions, T, window, key_mask, sink)
        softmax = alpha == 1.0 and row_metric(kind).closed_form  # softmax rows in closed form (else as entmax's)
        outs, stats = [], ([], [], [])
        for a in range(0, q.shape[2], B):
            e = min(a + B, q.shape[2])
            lo, hi = _block_keys(kind, a, e, T, window, contiguous)
            if softmax and fused_forward.active(q):  # one fused kernel per block (softmax_rows)
                inputs = block_inputs(q, k, a, e, lo, hi, positions, key_mask)
                value, numbers = fused_forward(*inputs, scale, window, kind, n_rows[..., a:e].clone(), topk, sink)
            elif softmax:
                s = _scores(q, k, scale, a, e, lo, hi, positions, window, key_mask, contiguous, sink)
                value, numbers = _softmax_rows(kind, s, n_rows[..., a:e], topk)
            else:
                s = _scores(q, k, scale, a, e, lo, hi, positions, window, key_mask, contiguous, sink)
                vis = visible(positions[a:e], lo, hi, window, key_mask)
                value = _entmax_rows(kind, s, vis, topk, alpha, sink)
            if softmax:
                for kept, x in zip(stats, numbers):
                    kept.append(x)
            outs.append(value)
        ctx.plan = plan
        ctx.save_for_backward(q, k, positions, key_mask, sink, *(torch.cat(x, dim=-1) for x in stats if x))
        return torch.cat(outs, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        q, k, positions, key_mask, sink, *stats = ctx.saved_tensors
        dq, dk, d_sink = rows_backward(grad, q, k, positions, key_mask, sink, stats, *ctx.plan)
        return dq, dk, None, None, None if sink is None else d_sink.to(sink.dtype), None


@torch.library.custom_op("attn_lab::rows_backward", mutates_args=())
def rows_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    key_mask: torch.Tensor | None,
    sink: torch.Tensor | None,
    stats: list[torch.Tensor],
    kind: str,
    topk: int,
    alpha: float,
    window: int | None,
    contiguous: bool,
    block: int | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, d sink) of :class:`_BlockedRows`: each block's scores formed again and its
    gradient applied, from the forward's row numbers ``stats`` ([b, h, R] each: max, log Z and the
    kind's own; none for entmax); d sink [h] in the reduction dtype (zeros without a sink). One
    opaque operator, so that a compiler cannot move the recomputed scores into the forward and
    keep them (its partitioner would: they depend on the forward's inputs only); it runs eagerly,
    so its blocks are the eager size unless ``block`` is given."""
    T = k.shape[2]
    block = block_rows(q, T, block)
    n_rows = _counts(q, positions, T, window, key_mask, sink)
    dq, dk = torch.zeros_like(q), torch.zeros_like(k)
    d_sink = torch.zeros(q.shape[1], dtype=reduce_dtype(q.dtype), device=q.device)
    softmax = alpha == 1.0 and row_metric(kind).closed_form
    for a in range(0, q.shape[2], block):
        e = min(a + block, q.shape[2])
        lo, hi = _block_keys(kind, a, e, T, window, contiguous)
        if softmax and fused_backward.active(q):  # one fused kernel per block (softmax_rows)
            inputs = block_inputs(q, k, a, e, lo, hi, positions, key_mask)
            rows_ = [t[..., a:e].clone() for t in (n_rows, grad, *stats)]
            P, c, d = fused_backward(*inputs, scale, window, kind, rows_[0], rows_[1], rows_[2:], topk, sink)
            dq[:, :, a:e] = c * (P @ k[:, :, lo:hi])
            dk[:, :, lo:hi] += P.transpose(-1, -2) @ (c * q[:, :, a:e])
            d_sink += d
            continue
        s = _scores(q, k, scale, a, e, lo, hi, positions, window, key_mask, contiguous, sink)
        g, n = grad[:, :, a:e].to(s.dtype), n_rows[..., a:e]
        if softmax:  # dS = c P: c (and the scale) go onto the rows of dq and of q, not onto P
            P, c = _softmax_grad(kind, s, n, g, *(x[:, :, a:e] for x in stats), topk)
            P, d = sink_grad(P, c, sink)
            P, c = P.to(q.dtype), (c * scale).to(q.dtype)[..., None]
            dq[:, :, a:e] = c * (P @ k[:, :, lo:hi])
            dk[:, :, lo:hi] += P.transpose(-1, -2) @ (c * q[:, :, a:e])
        else:
            vis = visible(positions[a:e], lo, hi, window, key_mask)
            dS, d = sink_grad(_entmax_grad(kind, s, vis, n, g, topk, alpha, sink), 1.0, sink)
            dS = (dS * scale).to(q.dtype)
            dq[:, :, a:e] = dS @ k[:, :, lo:hi]
            dk[:, :, lo:hi] += dS.transpose(-1, -2) @ q[:, :, a:e]
        d_sink += d
    return dq, dk, d_sink


@rows_backward.register_fake
def _(grad, q, k, positions, key_mask, sink, stats, kind, topk, alpha, window, contiguous, block, scale):
    return torch.empty_like(q), torch.empty_like(k), q.new_empty(q.shape[1], dtype=reduce_dtype(q.dtype))


def _counts(q, positions, T, window, key_mask, sink=None) -> torch.Tensor:
    """What each row's values normalize by, [1 or b, 1, R] in the reduction dtype (broadcasts on
    [b, h, R]): its visible keys, and the sink logit as one more outcome when given."""
    n = visible_counts(positions, T, window, key_mask)[:, None, :].to(reduce_dtype(q.dtype))
    return n if sink is None else n + 1


def _keys(a: int, e: int, T: int, window: int | None, contiguous: bool) -> tuple[int, int]:
    """The keys a block of query rows a..e-1 can see: with contiguous rows under a causal mask
    only keys up to its last row (and from its first row's window on); else all T."""
    if not contiguous or window is None:
        return 0, T
    return (max(0, a - window + 1) if window > 0 else 0), e


def _block_keys(kind: str, a: int, e: int, T: int, window: int | None, contiguous: bool) -> tuple[int, int]:
    """:func:`_keys`, from key 0 on for a metric that reads key 0's column (the sink mass)."""
    lo, hi = _keys(a, e, T, window, contiguous)
    return (0, hi) if row_metric(kind).from_key0 else (lo, hi)


def row_values(
    q: torch.Tensor,
    k: torch.Tensor,
    kind: str,
    *,
    window: int | None = 0,
    key_mask: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    topk: int = 1,
    alpha: float = 1.0,
    block: int | None = None,
    scale: float = 1.0,
    path: str = "auto",
    sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """The row penalty ``kind`` of every query row, [b, h, R], differentiable in q and k (and
    ``sink``).

    q [b, h, R, w] holds the query rows at ``positions`` [R] (None: R = T, rows 0..T-1), k
    [b, h, T, w] the keys of the same heads; the scores are s = scale q k^T (a per-head scale is
    folded into q by the caller). Equal to ``metrics`` on the dense rows
    ``attention_weights(s, mask, alpha)`` (tests). ``sink`` [h], a learned sink logit per head
    (gpt-oss: p_ij = exp(s_ij) / (exp(sink_h) + sum_j' exp(s_ij'))), is one more outcome of
    every softmax row, seen by every query: entropy, Hoyer and top-k are those of the
    distribution over the keys and the sink (normalized by n + 1 outcomes), the sink mass is the
    sink logit's share plus key 0's. ``path`` is one of :data:`PATHS`: softmax entropy and sink
    mass of every row (no ``positions``, no ``key_mask``) come from one fused attention pass
    where :func:`flash_rows.kernel_for` has a kernel; everything else in query blocks."""
    metric = row_metric(kind)
    check_sink(sink, q.shape[1], alpha)
    kernel = fused_kernel(q, kind, window, key_mask, positions, alpha, path)
    if kernel is not None:
        needs = metric.needs if sink is None else tuple(dict.fromkeys((*metric.needs, "lse")))
        H, lse = flash_rows.entropy_and_lse(q, k, scale=scale, window=window, kernel=kernel, needs=needs)
        H, lse, learned = flash_rows.with_sink(H, lse, sink)
        n = _counts(q, torch.arange(q.shape[2], device=q.device), k.shape[2], window, None, sink)
        return metric.from_pass(H, lse, learned, n, lambda: flash_rows.sink_mass(q, k, lse, scale, window))
    contiguous = positions is None
    if contiguous:
        positions = torch.arange(q.shape[2], device=q.device)
    if block is not None and block < 1:
        raise ValueError(f"block must be at least 1 row, got {block}")
    plan = (kind, int(topk), float(alpha), window, contiguous, block, float(scale))
    return _BlockedRows.apply(q, k, positions, key_mask, sink, plan)


def check_sink(sink, heads: int, alpha: float) -> None:
    """Refuse a ``sink`` that is not one logit per head of softmax rows, in one sentence."""
    if sink is None:
        return
    if not isinstance(sink, torch.Tensor) or sink.shape != (heads,) or not sink.is_floating_point():
        shape = tuple(sink.shape) if isinstance(sink, torch.Tensor) else type(sink).__name__
        raise ValueError(f"sink must be a float tensor of one logit per head, shape ({heads},); got {shape}")
    if alpha != 1.0:
        raise ValueError(f"a sink logit joins softmax rows; these are alpha-entmax rows (alpha {alpha:g})")


@torch.no_grad()
def row_metrics(
    q: torch.Tensor,
    k: torch.Tensor,
    kinds: dict[str, int],
    *,
    window: int | None = 0,
    alpha: float = 1.0,
    scale: float = 1.0,
    block: int | None = None,
    sink: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Several row metrics of every query row of ``scale q k^T`` ([b, h, T, w] each) in one pass
    over blocks of query rows, without gradients: ``kinds`` maps each registered kind to its k
    (top-k; 1 for the others), and each comes back [b, h, T] in the reduction dtype, equal to
    :func:`row_values` of that kind. Each block's scores are formed once; softmax rows are
    shifted and summed once for every metric with a closed form (``kinds``), the others read the
    block's weights (softmax or alpha-entmax) through their dense definition. Masks and ``sink``
    as :func:`row_values`."""
    metrics_ = {kind: row_metric(kind) for kind in kinds}
    check_sink(sink, q.shape[1], alpha)
    T = k.shape[2]
    positions = torch.arange(q.shape[2], device=q.device)
    n_rows = _counts(q, positions, T, window, None, sink)
    B = block_rows(q, T, block)
    key0 = any(m.from_key0 for m in metrics_.values())
    out: dict[str, list[torch.Tensor]] = {kind: [] for kind in kinds}
    for a in range(0, q.shape[2], B):
        e = min(a + B, q.shape[2])
        lo, hi = _keys(a, e, T, window, True)
        lo = 0 if key0 else lo
        s = _scores(q, k, scale, a, e, lo, hi, positions, window, None, True, sink)
        vis = visible(positions[a:e], lo, hi, window, None)
        n = n_rows[..., a:e]
        if alpha == 1.0:
            m = s.amax(-1, keepdim=True)
            t = s.sub_(m).clamp_min_(-FLOOR)
            ex = t.exp()
            Z = ex.sum(-1)
            log_z = Z.log()
            p = None
        else:
            p = attention_weights(s, torch.ones_like(s, dtype=torch.bool) if vis is None else vis, alpha)
        for kind, metric in metrics_.items():
            if p is None and metric.closed_form:
                out[kind].append(metric.softmax(ex, t, Z, log_z, n, kinds[kind])[0])
                continue
            weights = (t - log_z[..., None]).exp() if p is None else p
            out[kind].append(metric.dense(weights, _sink_visible(vis, s, sink), kinds[kind], sink=sink is not None))
    return {kind: torch.cat(values, -1) for kind, values in out.items()}


def row_path(q: torch.Tensor, kind: str, window, alpha: float, rows: int | None, path: str) -> str:
    """How :func:`head_means` computes ``kind`` on every head's rows of ``q`` [b, h, T, w] (what a run
    says it did): "fused attention pass (<kernel>)", or "query blocks" (sampled rows, a kind or an
    alpha without a closed form on the pass, or no kernel for this device, dtype, width and window)."""
    if samples(rows, q.shape[2], window):
        return "query blocks (sampled rows)"
    kernel = fused_kernel(q, kind, window, None, None, alpha, path)
    return "query blocks" if kernel is None else f"fused attention pass ({kernel})"


def fused_kernel(q, kind: str, window, key_mask, positions, alpha: float, path: str) -> str | None:
    """The fused kernel :func:`row_values` computes ``kind`` with (None: query blocks), by ``path``."""
    if path not in PATHS:
        raise ValueError(f"unknown penalty path {path!r}; choose from {', '.join(PATHS)}")
    if path == "blocked":
        return None
    fits = row_metric(kind).flash and alpha == 1.0 and key_mask is None and positions is None
    kernel = flash_rows.kernel_for(q, window) if fits else None
    if kernel is None and path == "flash":
        raise ValueError(
            f"the fused penalty path computes softmax entropy of every row without padding on a kernel's "
            f"device; not {kind!r} (alpha {alpha:g}) on {q.device.type} with window {window}"
        )
    return kernel


@torch.compiler.disable
def sample_positions(T: int, first: int, rows: int, generator: torch.Generator | None) -> torch.Tensor:
    """``rows`` distinct query positions drawn uniformly from first..T-1 (on the host, from
    ``generator``), sorted. Outside compiled graphs: a seeded host draw."""
    return (torch.randperm(T - first, generator=generator)[:rows] + first).sort().values


def first_row(window: int | None, key_mask: torch.Tensor | None = None) -> int:
    """The first query position that can be informative: 1 under a causal mask without padding
    (position 0 sees one key), else 0."""
    return 1 if (window is not None and key_mask is None) else 0


def samples(rows: int | None, T: int, window: int | None = 0, key_mask: torch.Tensor | None = None) -> bool:
    """Whether :func:`head_means` samples ``rows`` query positions of ``T`` (else it computes every
    row, the exact mean): ``rows`` is given and fewer than the positions that can be informative."""
    return rows is not None and rows < T - first_row(window, key_mask)


def head_means(
    q: torch.Tensor,
    k: torch.Tensor,
    kind: str,
    *,
    window: int | None = 0,
    key_mask: torch.Tensor | None = None,
    topk: int = 1,
    alpha: float = 1.0,
    block: int | None = None,
    rows: int | None = None,
    generator: torch.Generator | None = None,
    scale: float = 1.0,
    path: str = "auto",
    sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean of the row penalty over each head's informative rows (every batch element), [h].

    ``rows`` = m samples m query positions uniformly without replacement (the same for every
    batch element and head) and returns the unbiased estimate (|C|/m) sum_sampled / N, where C
    holds the positions that can be informative and N counts every informative row: its
    expectation over the draw is the exact mean, and so is its gradient's (docs/maths.md).
    ``path`` and ``sink`` as :func:`row_values` (sampled rows are computed in query blocks); the
    rows that count are those with at least ``metrics.MIN_KEYS`` visible keys, with a sink too."""
    b, T = q.shape[0], k.shape[2]
    full = torch.arange(T, device=q.device)
    valid = visible_counts(full, T, window, key_mask) >= metrics.MIN_KEYS  # [1 or b, T]
    if key_mask is not None:
        valid = valid & key_mask  # a padding query's row does not count
    count = valid.sum() * (b // valid.shape[0])
    first = first_row(window, key_mask)
    pos = None  # every row
    if samples(rows, T, window, key_mask):
        if rows < 1:
            raise ValueError(f"rows must be at least 1, got {rows}")
        pos = sample_positions(T, first, rows, generator).to(q.device)
    values = row_values(
        q if pos is None else q[:, :, pos],
        k,
        kind,
        window=window,
        key_mask=key_mask,
        positions=pos,
        topk=topk,
        alpha=alpha,
        block=block,
        scale=scale,
        path=path,
        sink=sink,
    )
    weight = (valid if pos is None else valid[:, pos]).to(values.dtype)
    scale = 1.0 if pos is None else (T - first) / rows
    total = (values * weight[:, None, :]).sum((0, 2))
    return total * scale / count.clamp_min(1).to(total.dtype)
