"""The parts of one head's scores on a real input, read from the layer's form
(``Attention.form``): the per-token gains QK-norm puts on each side, S_ij = g_q(i) g_k(j) x_i B~ x_j^T
(docs/maths.md), the scores before and after a soft cap c tanh(S / c), the affine form's terms
with query/key biases (x x, x b, b x, b b: the bias terms' share of the scores) and, with learned
sinks, each query's mass on the head's sink beside token 0's. What the Heatmaps page shows beside
the scores of such a head. An MLA head's (attn_core/model/mla.py) scores are two terms,
S = g_q(i) g_kv(j) x_i B x_j^T (its absorbed B, the latent norms' gains) + g_q(i) x_i B_R(j - i) x_j^T
(the rotary term): ``absorbed`` and ``rotary``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attn_core.bilinear.checks import check_heads, check_layer, check_loaded, check_tokens, layer_mask
from attn_core.bilinear.tokens import position_labels
from attn_core.hooks import act_name
from attn_core.sources import LoadedModel


@dataclass
class ScoreParts:
    """One head's scores on an input, in parts (CPU tensors): ``g_q`` and ``g_k`` [T] the gains
    (ones without QK-norm), ``uncapped`` and ``capped`` [T, T] the scores before and after the cap
    (the same without one), ``mask`` [T, T] the keys each query sees, ``labels`` "pos:token"."""

    layer: int
    head: int
    labels: list[str]
    g_q: torch.Tensor
    g_k: torch.Tensor
    uncapped: torch.Tensor
    capped: torch.Tensor
    mask: torch.Tensor
    norm: str  # "head", "all" (shared by the heads of a token), "latent" (MLA) or "none"
    cap: float | None
    absorbed: torch.Tensor | None = None  # MLA: the absorbed B's term [T, T]
    rotary: torch.Tensor | None = None  # MLA: the rotary term [T, T]
    terms: dict[str, torch.Tensor] | None = None  # the affine form's xx, xb, bx, bb [T, T] (None: no biases)
    sink_share: torch.Tensor | None = None  # [T]: each query's mass on the learned sink (None: no sinks)
    token0_share: torch.Tensor | None = None  # [T]: each query's weight on token 0

    def term_shares(self) -> dict[str, float]:
        """Each term's share of the scores' size over the visible cells: mean |term| / sum of the
        mean |term| of all four (the bias terms' share is everything but ``xx``'s)."""
        if self.terms is None:
            return {"xx": 1.0}
        size = {k: float(t[self.mask].abs().mean()) for k, t in self.terms.items()}
        total = sum(size.values()) or 1.0
        return {k: v / total for k, v in size.items()}

    @property
    def bias_share(self) -> float:
        """The bias terms' share of the scores' size (0 without biases)."""
        return 1.0 - self.term_shares()["xx"]


def score_parts(loaded: LoadedModel, tokens: Sequence[int], layer: int, head: int) -> ScoreParts:
    """The :class:`ScoreParts` of head (layer, head) on ``tokens``: its gains and its scores before
    and after the cap, from the layer's form at the layer's own attention input."""
    loaded = check_loaded(loaded, "score_parts")
    model = loaded.model
    layer = check_layer(model, layer)
    head = check_heads(model, head)[0]
    ids = check_tokens(model, tokens)
    name = act_name("attn_in", layer)
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids], device=model.embed.W_E.device), names_filter=[name])
        X = cache[name][0]  # [T, d_model]
        form = model.blocks[layer].attn.form(head)
        g_q, g_k = form.gains(X)
        uncapped = form.scores(X, capped=False)
        capped = form.scores(X)
        mask = layer_mask(model, layer, len(ids))
        mla = _mla_terms(form, X, g_q, g_k) if model.cfg.mla else (None, None)
        bias, z = getattr(form, "bias_q", None), getattr(form, "sink", None)
        terms = {k: t.float().cpu() for k, t in form.terms(X).items()} if bias is not None else None
        sink, first = None, None
        if z is not None:
            sink = form.sink_share(capped, mask).float().cpu()
            first = form.weights(capped, mask)[:, 0].float().cpu()
    return ScoreParts(
        layer,
        head,
        position_labels(loaded, ids),
        g_q.float().cpu(),
        g_k.float().cpu(),
        uncapped.float().cpu(),
        capped.float().cpu(),
        layer_mask(model, layer, len(ids)).cpu(),
        form.norm,
        form.cap,
        *mla,
        terms=terms,
        sink_share=sink,
        token0_share=first,
    )


def _mla_terms(form, X: torch.Tensor, g_q: torch.Tensor, g_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(absorbed, rotary) [T, T] of one MLA head: g_q g_kv X B X^T and g_q X B_R(j - i) X^T,
    the second from the rotated query and key parts (one offset per pair)."""
    n = form.cfg.d_head
    q, k = form.queries_keys(X)  # [h, T, n + r]
    h, s = form.head, float(form.head_scales())
    absorbed = form.core().bilinear(X) * g_q[:, None] * g_k[None, :]
    rotary = (q[h, :, n:] @ k[h, :, n:].T) * s
    return absorbed.float().cpu(), rotary.float().cpu()
