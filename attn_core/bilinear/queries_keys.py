"""A layer's Q and K as the model applies them: the one function every engine over attention
rows starts from (the blocked long-input rows and maps, the row penalties, the telemetry
summaries).

For layer l, :func:`layer_qk` gives Q of every query head and K, with everything else the model
does with them, read from the layer's form (``Attention.form``, :mod:`attn_core.model.form`):

    S_ij = scale_h Q_i . K_j     (then c tanh(S_ij / c) with a soft cap ``cap``)
    visible when j <= i (and i - j < ``window`` with a sliding window)
    A_ij = exp(S_ij) / (exp(sink_h) + sum_j' exp(S_ij'))   (``sink``: a learned logit per head, gpt-oss)

Query head h reads key head ``kv_head[h]`` (grouped-query attention); merged heads have K = X
for every head and scale 1. Two sources:

- token ids (one input, softmax heads: the blocked rows'): one forward stopped right after the
  layer's ``k`` hook (later layers are not run), no gradient; Q [H, T, w] of every query head, K [G, T, w] of every key head, and
  the attention input X [T, d_model] (without rotary: the mode split reads it);
- a forward's cache holding the layer's ``q`` and ``k`` (``regularizers.summaries.qk_cache``,
  a penalty's ``cache()``): the Q and K the model computed, differentiable, [b, h, T, w] each
  (K per query head) for ``heads``; None when the cache does not hold them.

Either way the numbers are the model's own (its hooks), not computed again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from attn_core.bilinear.checks import check_ids, check_layer, check_model
from attn_core.hooks import act_name
from attn_core.model import Transformer
from attn_core.validate import is_int


class _Stop(Exception):
    """Raised by the hook on ``k``: the rest of the forward is skipped."""


@dataclass
class LayerQK:
    """Q and K of one layer with how the model applies them (module doc); what a page caches per
    model, tokens and layer. :meth:`scores` and the mask helpers read one input's Q and K."""

    layer: int
    token_ids: list[int] | None
    q: torch.Tensor  # [H, T, w] one input, every query head (rotated, with its bias); [b, h, T, w] from a cache
    k: torch.Tensor  # [G, T, w] one input, every key/value head; [b, h, T, w] from a cache (per query head)
    kv_head: tuple[int, ...]  # query head -> row of k
    scale: tuple[float, ...]  # per query head: S = Q K^T * scale
    window: int  # the layer's sliding window (0: none)
    x: torch.Tensor | None = None  # [T, d_model] the attention input (the mode split without rotary)
    cap: float | None = None  # the soft cap c of the scores: S -> c tanh(S / c) (Gemma 2)
    sink: torch.Tensor | None = None  # [H]: a learned sink logit per query head (gpt-oss), one more outcome of a row

    @property
    def n(self) -> int:
        return self.q.shape[-2]

    @property
    def n_heads(self) -> int:
        return self.q.shape[-3]

    def folded(self) -> tuple[torch.Tensor, float]:
        """(q, scale) with scores ``scale q k^T``: the one scale of every head, or each head's own
        folded into a copy of q (scale 1) when they differ (grown heads)."""
        if len(set(self.scale)) <= 1:
            return self.q, self.scale[0] if self.scale else 1.0
        s = torch.tensor(self.scale, dtype=self.q.dtype, device=self.q.device)
        return self.q * s.view(-1, 1, 1), 1.0

    def check_head(self, head: int) -> int:
        if not is_int(head) or not 0 <= head < self.n_heads:
            raise ValueError(f"head {head!r} is outside 0..{self.n_heads - 1} (this layer has {self.n_heads} heads)")
        return int(head)

    def key_span(self, q0: int, q1: int) -> tuple[int, int]:
        """The keys [lo, hi) that some query of q0..q1-1 sees."""
        return (max(0, q0 - self.window + 1) if self.window else 0), q1

    def visible(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """[len(rows), len(cols)] bool, the model's mask (``Transformer.mask``) at these positions."""
        vis = cols[None, :] <= rows[:, None]
        if self.window:
            vis &= rows[:, None] - cols[None, :] < self.window
        return vis

    def full(self, q0: int, q1: int, k0: int, k1: int) -> bool:
        """Whether every query of q0..q1-1 sees every key of k0..k1-1 (no mask needed)."""
        return k1 - 1 <= q0 and (not self.window or q1 - 1 - k0 < self.window)

    def scores(self, head: int, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        """S of queries q0..q1-1 against keys k0..k1-1 (one input), -inf where the key is not visible."""
        h = self.check_head(head)
        S = (self.q[h, q0:q1] @ self.k[self.kv_head[h], k0:k1].T).mul_(self.scale[h])
        if self.cap is not None:  # the soft cap, as the model applies it
            S = torch.tanh(S / self.cap) * self.cap
        if self.full(q0, q1, k0, k1):
            return S
        dev = S.device
        vis = self.visible(torch.arange(q0, q1, device=dev), torch.arange(k0, k1, device=dev))
        return S.masked_fill_(~vis, -math.inf)


def layer_qk(
    model: Transformer,
    source: Sequence[int] | Mapping[str, torch.Tensor],
    layer: int,
    heads: Sequence[int] | None = None,
) -> LayerQK | None:
    """Q and K of ``layer`` as the model applies them (module doc), from ``source``: token ids
    (one forward stopped after the layer's ``k`` hook, on the model's device; every head) or a
    forward's cache (the heads ``heads``, default all; None when it lacks the layer's Q and K)."""
    if isinstance(source, Mapping):
        return _from_cache(model, source, layer, heads)
    return _from_tokens(check_model(model, "layer_qk"), source, layer)


def _applied(model: Transformer, layer: int, heads: Sequence[int]) -> dict:
    """What the model does with the layer's Q and K besides forming them, from its form: the
    scale of each of ``heads``, the window, the cap and the learned sink logits."""
    cfg = model.cfg
    form = model.blocks[layer].attn.form()
    merged = cfg.qk == "merged"
    scale = tuple(1.0 if merged else cfg.attn_scale or cfg.head_d_qk(layer, h) ** -0.5 for h in heads)
    sink = getattr(form, "sink", None)
    return dict(scale=scale, window=form.window, cap=form.cap, sink=None if sink is None else sink[list(heads)])


def _from_cache(model: Transformer, cache: Mapping, layer: int, heads: Sequence[int] | None) -> LayerQK | None:
    q_name, k_name = act_name("q", layer), act_name("k", layer)
    if q_name not in cache or k_name not in cache:
        return None
    all_heads = list(range(model.cfg.n_heads))
    heads = all_heads if heads is None else list(heads)
    q, k = cache[q_name], cache[k_name]
    if heads != all_heads:
        q, k = q[:, heads], k[:, heads]
    return LayerQK(layer, None, q, k, tuple(range(len(heads))), **_applied(model, layer, heads))


@torch.no_grad()
def _from_tokens(model: Transformer, tokens: Sequence[int], layer: int) -> LayerQK:
    cfg = model.cfg
    if cfg.entmax_alpha != 1.0:  # one input's rows are the blocked rows', softmax rows
        raise ValueError(
            f"blocked scores need softmax heads; this model uses alpha-entmax ({cfg.entmax_alpha:g}), whose rows "
            "have no log-normaliser to merge a block of keys at a time: use a dense view (at most 512 tokens)"
        )
    layer = check_layer(model, layer)
    ids = check_ids(model, tokens)
    kept: dict[str, torch.Tensor] = {}

    def keep(name: str, stop: bool = False):
        def hook(t: torch.Tensor, _name: str) -> None:
            kept[name] = t[0].detach()
            if stop:
                raise _Stop

        return hook

    hooks = [(act_name("attn_in", layer), keep("x")), (act_name("q", layer), keep("q"))]
    hooks.append((act_name("k", layer), keep("k", stop=True)))
    try:
        model.run_with_hooks(torch.tensor([ids], device=model.embed.W_E.device), hooks)
    except _Stop:
        pass
    H = cfg.n_heads
    if cfg.qk == "merged":  # K = X for every head
        k, kv = kept["k"][:1], (0,) * H
    else:
        group = H // cfg.kv_heads
        k, kv = kept["k"][::group], tuple(cfg.kv_head(h) for h in range(H))
    x = kept["x"] if cfg.positional != "rotary" else None
    q = kept["q"]
    if q.dtype in (torch.float16, torch.bfloat16):  # the running sums and the entropy need float32
        q, k = q.float(), k.float()
    applied = _applied(model, layer, range(H))
    if applied["sink"] is not None:
        applied["sink"] = applied["sink"].detach().to(q.dtype)
    return LayerQK(layer, ids, q, k.contiguous(), kv, x=x, **applied)
