"""Attention sinks (Gu et al. 2024, "When attention sink emerges in language models",
arXiv 2410.10781; docs/maths.md, "Attention sinks").

For a head's pattern A on an input of T tokens, the importance of key k is the mean attention it
receives over the queries that can see it (the model's own mask, ``checks.layer_mask``: causal,
and the sliding window where the layer has one):

    importance_k = sum_{q sees k} A[q, k] / #{q : q sees k}

averaged over the probes (every probe has the same length, so this is the sum over probes and
queries divided by the count). Gu et al. take k = the first token (``first``) and call a head a
sink head when its importance exceeds eps = 0.3 on 64-token probes; the sink rate is the share of
such heads. Here a head is a sink head when *some* key's importance exceeds eps, among the keys
that at least :func:`min_queries` queries see (a quarter of the probe, at least 2): the last key
of a causal probe is seen by one query only, so its "importance" is one attention weight, and a
previous-token head would call every late key a sink (importance 1/m for a key m queries see).
The first-token rate of Gu et al. is reported beside it (``rate_first``).

A model with learned sinks (gpt-oss: a sink logit z_h in each row's denominator) gives each row a
second place to put its mass: the learned share 1 - sum_k A[q, k] = sigmoid(z_h - logsumexp_k S_qk),
which no key receives. Both are reported per head: the learned share (``learned``, the mean over
probes and queries) and the token-0 share (``first``, token 0's importance).

The tensor part (:func:`importance_sums`) takes the device of the model; :func:`sinks` reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attn_core.bilinear.checks import check_model, layer_mask
from attn_core.hooks import act_name
from attn_core.limits import LimitError, size_text
from attn_core.model import Transformer
from attn_core.validate import shown

EPS = 0.3  # Gu et al.'s threshold
PROBE_LENGTH = 64  # tokens per probe (Gu et al.), cut to the model's context
WORK_BYTES = 256 * 2**20  # one chunk of probes: the patterns of one layer at a time


def min_queries(n: int) -> int:
    """The fewest queries that must see a key for it to count as a sink: a quarter of the probe's
    ``n`` tokens, at least 2 (a head attending to its last w keys gives a key at most w/m)."""
    return max(2, math.ceil(n / 4))


def key_importance(pattern: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean attention each key receives over the queries that see it: ``pattern`` [..., nq, nk],
    ``mask`` [nq, nk] (True where query q sees key k) -> [..., nk]; NaN for a key no query sees."""
    m = mask.to(pattern.dtype)
    total = (pattern * m).sum(-2)
    count = m.sum(-2)
    return torch.where(count > 0, total / count.clamp_min(1), torch.full_like(total, math.nan))


def eligible_keys(mask: torch.Tensor, least: int | None = None) -> torch.Tensor:
    """[nk] bool: the keys seen by at least ``least`` (default :func:`min_queries`) queries."""
    least = min_queries(mask.shape[-1]) if least is None else least
    return mask.sum(-2) >= least


def sink_keys(importance: torch.Tensor, eligible: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """[..., nk] bool: eligible keys whose importance exceeds ``eps``."""
    return (importance > eps) & eligible


def check_eps(eps: float) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ValueError(f"--eps must be a number between 0 and 1 (Gu et al. take 0.3), got {shown(eps)}")
    return float(eps)


@torch.no_grad()
def importance_sums(model: Transformer, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum over probes and visible queries of A[q, k] [L, H, T], the count of such (probe, query)
    pairs per key [L, T], the sum over probes and queries of each row's mass on the learned sink
    [L, H]), float64 on the model's device; ``tokens`` [n, T]. The patterns are read by a hook on
    each layer's ``hook_pattern``, a chunk of probes at a time, never all layers kept."""
    model = check_model(model, "importance_sums")
    cfg = model.cfg
    n, T = tokens.shape
    device = model.embed.W_E.device
    per_probe = cfg.n_heads * T * T * 8
    chunk = max(1, min(n, WORK_BYTES // per_probe))
    if per_probe > 4 * WORK_BYTES:
        raise LimitError(
            f"one probe of {T} tokens needs {size_text(per_probe)} for a layer's patterns; use fewer tokens"
        )
    masks = [layer_mask(model, l, T) for l in range(cfg.n_layers)]
    sums = torch.zeros(cfg.n_layers, cfg.n_heads, T, dtype=torch.float64, device=device)
    counts = torch.stack([m.sum(0) for m in masks]).to(torch.float64) * n  # [L, T]
    learned = torch.zeros(cfg.n_layers, cfg.n_heads, dtype=torch.float64, device=device)

    def hook(layer: int):
        def add(A: torch.Tensor, name: str) -> None:
            sums[layer] += (A.double() * masks[layer]).sum((0, 2))
            if cfg.attn_sinks:  # a row's mass short of 1 is on the learned sink
                learned[layer] += (1.0 - A.double().sum(-1)).sum((0, 2))

        return add

    hooks = [(act_name("pattern", l), hook(l)) for l in range(cfg.n_layers)]
    for i in range(0, n, chunk):
        model.run_with_hooks(tokens[i : i + chunk].to(device), fwd_hooks=hooks)
    return sums, counts, learned


@dataclass(frozen=True)
class Sinks:
    """Per (layer, head) the importance of every key position on the probes, [L, H, T] float64
    (CPU), and which keys are eligible [L, T]; ``eps``, the probes' count, length and source."""

    importance: torch.Tensor
    eligible: torch.Tensor
    eps: float
    n_probes: int
    what: str
    learned: torch.Tensor | None = None  # [L, H]: the mean mass on the learned sink (None: no sinks)

    @property
    def length(self) -> int:
        return self.importance.shape[-1]

    @property
    def sinks(self) -> torch.Tensor:
        """[L, H, T] bool: the sink keys of every head."""
        return sink_keys(self.importance, self.eligible[:, None, :], self.eps)

    @property
    def is_sink(self) -> torch.Tensor:
        """[L, H] bool: heads with a sink key."""
        return self.sinks.any(-1)

    @property
    def rate(self) -> float:
        """The share of sink heads."""
        return float(self.is_sink.double().mean())

    @property
    def strongest(self) -> torch.Tensor:
        """[L, H]: the largest importance over eligible keys."""
        return self.importance.masked_fill(~self.eligible[:, None, :], -math.inf).amax(-1)

    @property
    def first(self) -> torch.Tensor:
        """[L, H]: the importance of the first token (Gu et al.'s alpha_1)."""
        return self.importance[..., 0]

    @property
    def rate_first(self) -> float:
        """Gu et al.'s sink rate: the share of heads whose first token's importance exceeds eps."""
        return float((self.first > self.eps).double().mean())

    @property
    def learned_mean(self) -> float | None:
        """The mean mass on the learned sink over every head (None without learned sinks)."""
        return None if self.learned is None else float(self.learned.mean())

    def heads(self) -> list[dict]:
        """One record per head: layer, head, sink (bool), sink keys, strongest importance and its
        key, the first token's importance, the learned sink's share (None without), and every
        key's importance."""
        rows = []
        L, H, _ = self.importance.shape
        sinks = self.sinks
        strongest = self.strongest
        masked = self.importance.masked_fill(~self.eligible[:, None, :], -math.inf)
        for l in range(L):
            for h in range(H):
                keys = torch.nonzero(sinks[l, h]).flatten().tolist()
                rows.append(
                    dict(
                        layer=l,
                        head=h,
                        sink=bool(keys),
                        sink_keys=keys,
                        strongest=float(strongest[l, h]),
                        strongest_key=int(masked[l, h].argmax()),
                        first=float(self.first[l, h]),
                        learned=None if self.learned is None else float(self.learned[l, h]),
                        importance=self.importance[l, h].tolist(),
                    )
                )
        return rows

    def to_json(self) -> dict:
        """What ``attn-lab sinks --json`` prints."""
        return dict(
            eps=self.eps,
            rate=self.rate,
            rate_first=self.rate_first,
            learned_mean=self.learned_mean,
            sink_heads=int(self.is_sink.sum()),
            n_heads=int(self.is_sink.numel()),
            probes=self.n_probes,
            length=self.length,
            min_queries=min_queries(self.length),
            eligible_keys=int(self.eligible[0].sum()),
            inputs=self.what,
            heads=self.heads(),
        )


def sinks(model: Transformer, tokens: torch.Tensor, eps: float = EPS, what: str = "") -> Sinks:
    """Importance of every key position of every head on the probes ``tokens`` [n, T] (the
    module doc), and the sink heads at ``eps``."""
    model = check_model(model, "sinks")
    eps = check_eps(eps)
    tokens = torch.as_tensor(tokens, dtype=torch.long, device=model.embed.W_E.device)
    if tokens.dim() != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1:
        raise ValueError(f"probes are token ids [n, T] with n, T >= 1, got shape {list(tokens.shape)}")
    if tokens.shape[1] > model.cfg.n_ctx:
        raise ValueError(f"probes of {tokens.shape[1]} tokens exceed the model context of {model.cfg.n_ctx}")
    sums, counts, learned = importance_sums(model, tokens)
    sums, counts = sums.cpu(), counts.cpu()
    learned = (learned.cpu() / (tokens.shape[0] * tokens.shape[1])) if model.cfg.attn_sinks else None
    importance = torch.where(counts[:, None, :] > 0, sums / counts.clamp_min(1)[:, None, :], math.nan)
    T = tokens.shape[1]
    eligible = torch.stack([eligible_keys(layer_mask(model, l, T).cpu()) for l in range(model.cfg.n_layers)])
    what = what or f"{tokens.shape[0]} probes of {T} tokens"
    return Sinks(importance, eligible, eps, int(tokens.shape[0]), what, learned)
