"""Softmax row penalties from one fused attention pass, no score matrix formed (docs/maths.md,
"Row penalties from a fused attention pass").

For the rows p_i = softmax(s_i) of s_ij = c q_i . k_j (masked), with lse_i = log sum_j exp s_ij:

    E_p[s_i] = c q_i . (P K)_i        one attention pass with V := K gives P K, and lse with it
    H_i      = lse_i - E_p[s_i]       the entropy of the row
    P_i0     = exp(s_i0 - lse_i)      the mass on the first key (an attention sink's)

:class:`_FlashRows` returns (H, lse) [b, h, R] and saves Q, K, the pass's output P K and lse:
O(b h T d), never O(T^2). Its backward is attention again: the gradient of H is the *key* part of
the same pass's backward with dO_i = -g_i c q_i (dP_ij = -g_i s_ij, D_i = -g_i E_i, so the
kernel's dS = p (dP - D) = -g p (s - E) = dH/ds); the gradient of lse is dq_i = c g_i (P K)_i and
dk = c P^T (g Q), the *value* gradient of a pass with dO = c g Q.

Kernels (:func:`kernel_for`; None: the caller keeps the blocked path of ``rows``):

- ``cpu`` (CPU and ``meta``): ``aten._scaled_dot_product_flash_attention_for_cpu`` and its
  backward; causal by ``is_causal``, a sliding window as one additive [T, T] mask shared by every
  batch element and head;
- ``flash`` (CUDA, float16/bfloat16, no window): ``aten._scaled_dot_product_flash_attention``;
- ``efficient`` (CUDA, float32, no window): ``aten._scaled_dot_product_efficient_attention``
  (its lse is padded to a multiple of 32 rows: cut to R);
- a sliding window on CUDA, or a head width that is not a multiple of 8 or over 256: None (the
  blocked path).

Nothing here is compiled at run time: each is one ATen kernel per pass, eagerly or inside the
caller's own compiled graph. Every tensor made here takes the device and dtype of ``q``.
"""

from __future__ import annotations

import torch

from attn_core.regularizers.kinds.base import reduce_dtype

A = torch.ops.aten
HALF = (torch.float16, torch.bfloat16)
CUDA_MAX_WIDTH = 256  # the flash kernel's largest head width


def kernel_for(q: torch.Tensor, window: int | None) -> str | None:
    """The fused kernel for rows of ``q`` [b, h, R, w] under the mask ``window`` (None: every
    key; 0: causal; w > 0: a causal window of w keys), or None where none applies (see the
    module doc): :func:`choose_kernel` of q's device type, dtype, T and width."""
    return choose_kernel(q.device.type, q.dtype, q.shape[2], window, q.shape[-1])


def choose_kernel(device_type: str, dtype: torch.dtype, T: int, window: int | None, width: int) -> str | None:
    """The kernel of :func:`kernel_for`, a pure function of where and what the rows are. On CUDA
    only widths both kernels take (a multiple of 8, at most 256; wider rows, e.g. merged heads'
    d_model, keep the blocks) and no sliding window."""
    if device_type in ("cpu", "meta"):
        return "cpu"
    windowed = window is not None and 0 < window < T
    if device_type == "cuda" and not windowed and width % 8 == 0 and width <= CUDA_MAX_WIDTH:
        return "flash" if dtype in HALF else "efficient"
    return None


def _window_mask(q: torch.Tensor, T: int, window: int) -> torch.Tensor:
    """The additive mask of a causal window of ``window`` keys, [T, T] in q's dtype."""
    i = torch.arange(T, device=q.device)
    hidden = (i[None, :] > i[:, None]) | (i[:, None] - i[None, :] >= window)
    return torch.zeros(T, T, dtype=q.dtype, device=q.device).masked_fill_(hidden, float("-inf"))


def _causal(window: int | None, T: int) -> tuple[bool, int | None]:
    """(is_causal, the window still to mask): a window of T keys or more is the causal mask."""
    if window is None:
        return False, None
    if window == 0 or window >= T:
        return True, None
    return False, window


def _last_dim_dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` with unit stride along its last dimension (a copy only where it has not)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def attention_forward(kernel: str, q, k, scale: float, window: int | None) -> tuple:
    """(P K [b, h, R, w], lse [b, h, R] (float32; float64 stays), what the backward needs) of one pass, V := K."""
    T = k.shape[2]
    causal, win = _causal(window, T)
    if kernel == "cpu":
        mask = None if win is None else _window_mask(q, T, win)
        out, lse = A._scaled_dot_product_flash_attention_for_cpu(q, k, k, 0.0, causal, attn_mask=mask, scale=scale)
        return out, lse, (mask,)
    q, k = _last_dim_dense(q), _last_dim_dense(k)  # what the CUDA kernels read
    if kernel == "flash":
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = A._scaled_dot_product_flash_attention(
            q, k, k, 0.0, causal, False, scale=scale
        )
        return out, lse, (cum_q, cum_k, max_q, max_k, seed, offset)
    out, lse, seed, offset = A._scaled_dot_product_efficient_attention(q, k, k, None, True, 0.0, causal, scale=scale)
    return out, lse, (seed, offset)


def attention_backward(kernel: str, d_out, q, k, out, lse, extra: tuple, scale: float, window: int | None):
    """(dq, dk as a key, dk as the value) of the pass of :func:`attention_forward` for ``d_out``."""
    causal, _ = _causal(window, k.shape[2])
    if kernel == "cpu":
        (mask,) = extra
        return A._scaled_dot_product_flash_attention_for_cpu_backward(
            d_out, q, k, k, out, lse, 0.0, causal, attn_mask=mask, scale=scale
        )
    d_out, q, k = _last_dim_dense(d_out), _last_dim_dense(q), _last_dim_dense(k)
    if kernel == "flash":
        cum_q, cum_k, max_q, max_k, seed, offset = extra
        return A._scaled_dot_product_flash_attention_backward(
            d_out, q, k, k, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset, scale=scale
        )
    seed, offset = extra
    dq, dk, dv, _ = A._scaled_dot_product_efficient_attention_backward(
        d_out, q, k, k, None, out, lse, seed, offset, 0.0, [True, True, True, False], causal, scale=scale
    )
    return dq, dk, dv


class _FlashRows(torch.autograd.Function):
    """(H, lse) [b, h, R] in the reduction dtype of the softmax rows of ``scale q k^T``; see the
    module doc. Only the outputs named in ``needs`` are differentiable: each costs one backward
    pass, and a compiled graph hands an unused output a zero gradient rather than none."""

    @staticmethod
    def forward(ctx, q, k, scale: float, window: int | None, kernel: str, needs: tuple[str, ...]):
        out, lse, extra = attention_forward(kernel, q, k, scale, window)
        lse_rows = lse[..., : q.shape[2]]  # the efficient kernel pads its rows
        dtype = reduce_dtype(q.dtype)
        # two numbers of the size of the largest score cancel: a peaked row's rounding can go
        # below 0, which no entropy is (the gradient's formula does not read H)
        H = (lse_rows.to(dtype) - scale * (q.to(dtype) * out.to(dtype)).sum(-1)).clamp_min_(0)
        ctx.plan = (scale, window, kernel, needs)
        ctx.save_for_backward(q, k, out, lse, *(x for x in extra if isinstance(x, torch.Tensor) or x is None))
        ctx.ints = tuple(x for x in extra if not (isinstance(x, torch.Tensor) or x is None))
        ctx.set_materialize_grads(False)
        for name, x in (("entropy", H), ("lse", lse_rows)):
            if name not in needs:
                ctx.mark_non_differentiable(x)
        return H, lse_rows

    @staticmethod
    def backward(ctx, g_entropy, g_lse):
        scale, window, kernel, needs = ctx.plan
        q, k, out, lse, *tensors = ctx.saved_tensors
        extra = _extra(kernel, tensors, ctx.ints)
        g_entropy = g_entropy if "entropy" in needs else None
        g_lse = g_lse if "lse" in needs else None
        dq = dk = None
        if g_entropy is not None:  # the key part of a pass with dO = -g c q
            d_out = (-scale * g_entropy)[..., None].to(q.dtype) * q
            dq, dk, _ = attention_backward(kernel, d_out, q, k, out, lse, extra, scale, window)
        if g_lse is not None:  # dq = c g (P K), dk = the value part of a pass with dO = c g q
            w = (scale * g_lse)[..., None]
            _, _, dv = attention_backward(kernel, w.to(q.dtype) * q, q, k, out, lse, extra, scale, window)
            dq_lse = (w * out.to(w.dtype)).to(q.dtype)
            dq = dq_lse if dq is None else dq + dq_lse
            dk = dv if dk is None else dk + dv
        return dq, dk, None, None, None, None


def _extra(kernel: str, tensors: list, ints: tuple) -> tuple:
    """The pass's saved extras back in :func:`attention_forward`'s order."""
    if kernel == "flash":  # cum_q, cum_k, max_q, max_k, seed, offset
        return (tensors[0], tensors[1], *ints, tensors[2], tensors[3])
    return tuple(tensors)


def entropy_and_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: float = 1.0,
    window: int | None = 0,
    kernel: str | None = None,
    needs: tuple[str, ...] = ("entropy", "lse"),
) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, lse) of every query row of ``scale q k^T`` under the mask ``window``, [b, h, R] each in
    the reduction dtype (float32; float64 stays), differentiable in q [b, h, R, w] and k
    [b, g, T, w] (g divides h: grouped-query keys are repeated per query head). ``kernel`` as
    :func:`kernel_for` (None: its choice); ``needs`` names the outputs that carry a gradient
    ("entropy", "lse"; the others come back non-differentiable): each costs a backward pass."""
    if k.shape[1] != q.shape[1]:
        if q.shape[1] % k.shape[1]:
            raise ValueError(f"{q.shape[1]} query heads cannot share {k.shape[1]} key heads")
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"the fused path needs every query row: {q.shape[2]} rows for {k.shape[2]} keys")
    kernel = kernel or kernel_for(q, window)
    if kernel is None:
        raise ValueError(f"no fused kernel for {q.device.type} rows under the window {window}")
    if not set(needs) <= {"entropy", "lse"}:
        raise ValueError(f"needs names 'entropy' and 'lse' only, got {needs!r}")
    return _FlashRows.apply(q, k, float(scale), window, kernel, tuple(needs))


def with_sink(
    H: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | float]:
    """(H, lse, p_sink) of the rows with each head's sink logit ``sink`` [h] as one more outcome,
    from the keys' H and lse [b, h, R]: lse' = log(exp lse + exp sink), p_sink = exp(sink - lse'),
    and with r = 1 - p_sink = exp(lse - lse') (every key's weight scaled by r)
    H' = r (H - log r) - p_sink log p_sink. Without a sink: H, lse and 0."""
    if sink is None:
        return H, lse, 0.0
    sigma = sink.to(lse.dtype).view(1, -1, 1)
    total = torch.logaddexp(lse, sigma)
    log_r, log_sink = lse - total, sigma - total
    learned = log_sink.exp()
    return log_r.exp() * (H - log_r) - learned * log_sink, total, learned


def sink_mass(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, scale: float, window: int | None) -> torch.Tensor:
    """P_i0 = exp(s_i0 - lse_i) [b, h, R] in the reduction dtype: each row's weight on the first
    key (0 for a row whose window has left it behind); ``lse`` from :func:`entropy_and_lse`."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    dtype = reduce_dtype(q.dtype)
    s0 = scale * (q.to(dtype) * k[:, :, :1].to(dtype)).sum(-1)
    mass = (s0 - lse.to(dtype)).exp()
    if window is not None and 0 < window < q.shape[2]:
        sees = torch.arange(q.shape[2], device=q.device) < window
        mass = mass * sees.to(mass.dtype)
    return mass
