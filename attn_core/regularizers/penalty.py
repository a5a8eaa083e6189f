"""The penalties themselves: each regularizer's differentiable value, :class:`ConcentrationPenalty`
(the Trainer's extra loss terms) and :func:`build_penalty`, and alpha-entmax attention (see
``attn_core.regularizers``; the per-head summaries a run measures are ``summaries``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from attn_core.bilinear import QKForm, layer_form, vocab_scores
from attn_core.hooks import Cache, act_name
from attn_core.model import ModelConfig, Transformer, attention_weights
from attn_core.regularizers.heads import Heads, all_heads, by_layer, head_label, parse_heads
from attn_core.regularizers.kinds import spectrum_term
from attn_core.regularizers.rows import PATHS, head_means, row_path, row_penalty, samples
from attn_core.regularizers.specs import RegSpec, SpecsLike, parse_specs
from attn_core.regularizers.summaries import data_rows, mean_rows, uncapped_qk
from attn_core.validate import is_int


def data_values(
    model: Transformer, cache: dict, layer: int, heads: Sequence[int], kind: str, k: int = 1, **options
) -> torch.Tensor:
    """The row penalty ``kind`` of the training batch's attention, mean over each head's
    informative rows, [len(heads)] (differentiable). From the cached Q and K in query blocks or
    one fused attention pass (``rows.head_means``; ``options`` are its ``rows``, ``generator``,
    ``block`` and ``path``), so only Q and K need be cached and the layer keeps its fused
    attention; a cache that holds only the pattern is read densely."""
    cfg = model.cfg
    taken = options.pop("taken", None)
    qk = uncapped_qk(model, cache, layer, heads)
    if qk is not None:
        q, scale = qk.folded()
        if taken is not None:
            taken.add(row_path(q, kind, qk.window, cfg.entmax_alpha, options.get("rows"), options.get("path", "auto")))
        return head_means(
            q, qk.k, kind, window=qk.window, topk=k, alpha=cfg.entmax_alpha, scale=scale, sink=qk.sink, **options
        )
    if act_name("pattern", layer) not in cache:
        raise ValueError(
            f"the forward cache has no {act_name('q', layer)} and {act_name('k', layer)}; "
            "run the model with cache=penalty.cache() first"
        )
    if taken is not None:
        taken.add("the pattern's rows (after the soft cap)")
    A, mask = data_rows(model, cache, layer)
    A = A[:, list(heads)]
    return mean_rows(row_penalty(kind, A, mask, k), A.shape, mask)


def vocab_rows(model: Transformer, layer: int, heads: Sequence[int] | None = None) -> torch.Tensor:
    """Rows of the vocabulary view, [h, V, V]: attention of every token over every token, with
    the model's own row normalisation (softmax, or alpha-entmax) of its own scores (QK-norm's
    gains and a soft cap as the layer applies them: ``vocab_scores``). Differentiable."""
    S = vocab_scores(model, layer, list(heads) if heads is not None else None)
    full = torch.ones(S.shape[-2:], dtype=torch.bool, device=S.device)
    return attention_weights(S, full, model.cfg.entmax_alpha)


def layer_singular_values(model: Transformer, layer: int) -> torch.Tensor:
    """Singular values of B of every head of a layer, [n_heads, r], differentiable. Heads grown
    narrower than the layer's stored width (``cfg.d_qk``) are cut to their own width first: the
    zero padding columns would make the QR's gradient NaN."""
    cfg = model.cfg
    if cfg.qk == "merged" or cfg.d_qk is None:
        return layer_form(model, layer).singular_values
    form = model.blocks[layer].attn.form()
    widths = [cfg.head_d_qk(layer, h) for h in range(cfg.n_heads)]
    rows = []
    for h in range(cfg.n_heads):
        L, R = form[h].factors(own=True)
        rows.append(QKForm(left=L * form[h].head_scales(), right=R).singular_values)
    r = max(widths)
    return torch.stack([torch.nn.functional.pad(s, (0, r - s.shape[-1])) for s in rows])


def regularizer_value(
    spec: RegSpec,
    model: Transformer,
    heads: Heads,
    cache: dict | None = None,
    memo: dict | None = None,
    **options,
) -> torch.Tensor:
    """The unweighted regularizer R (a scalar, mean over ``heads``); ``cache`` holds the
    forward's Q and K (or patterns) for the data view, read by :func:`data_values` with
    ``options``. ``memo`` shares vocabulary rows and spectra between specs within one step."""
    memo = {} if memo is None else memo
    kind = spec.name.removeprefix("vocab_")
    per_head = []
    for layer, hs in by_layer(heads).items():
        if spec.view == "data":
            if cache is None:
                raise ValueError(f"{spec.name!r} reads the training batch's attention; pass the forward cache")
            per_head.append(data_values(model, cache, layer, hs, kind, spec.k, **options))
        elif spec.view == "vocab":
            key = ("vocab", layer)
            if key not in memo:
                memo[key] = vocab_rows(model, layer)
            P = memo[key][hs]
            per_head.append(mean_rows(row_penalty(kind, P, None, spec.k), P.shape, None))
        else:
            key = ("sigma", layer)
            if key not in memo:
                memo[key] = layer_singular_values(model, layer)
            sigma = memo[key][hs]
            per_head.append(spectrum_term(kind).value(sigma))
    return torch.cat(per_head).mean()


# how a spec that reads no attention rows of the batch is computed
VIEW_PATHS = {"vocab": "the vocabulary's rows (V x V)", "spectrum": "the singular values of B"}


class ConcentrationPenalty:
    """A Trainer ``Penalty``: ``penalty(model, batch, cache) -> {label: lambda * R}``.

    Built by :func:`build_penalty`; ``specs`` are those with lambda > 0 (a zero strength turns
    a regularizer off), ``heads[label]`` the resolved heads of each, ``regularized_heads`` their
    union (every head when no spec is active). ``reads`` names the activations the data-view
    specs read (Q and K of their layers) and :meth:`cache` makes the forward cache that keeps
    only those, so every layer keeps its fused attention. ``rows`` = m estimates each data-view
    row mean from m sampled query positions per step (unbiased, docs/maths.md; drawn from a
    generator seeded with ``seed``), ``block`` sets the query rows per block, ``path`` how the
    softmax entropy and sink rows are computed (``rows.PATHS``: "auto" = one fused attention pass where a
    kernel applies, "blocked" = query blocks, the older path)."""

    def __init__(
        self,
        specs: list[RegSpec],
        heads: dict[str, Heads],
        cfg: ModelConfig,
        rows: int | None = None,
        seed: int = 0,
        block: int | None = None,
        path: str = "auto",
    ):
        if path not in PATHS:
            raise ValueError(f"unknown penalty path {path!r}; choose from {', '.join(PATHS)}")
        for name, v in (("rows", rows), ("block", block)):
            if v is not None and not (is_int(v) and v >= 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
        self.specs = [s for s in specs if s.strength > 0]
        self.all_specs = specs
        self.heads = heads
        union = sorted({lh for s in self.specs for lh in heads[s.label]})
        self.regularized_heads: Heads = tuple(union) if union else all_heads(cfg)
        layers = sorted({l for s in self.specs if s.view == "data" for l, _ in heads[s.label]})
        # a capped model's rows come from its pattern (the cap is not in Q K^T; it runs the explicit path anyway)
        kinds = ("pattern",) if cfg.attn_softcap is not None else ("q", "k")
        self.reads = tuple(act_name(kind, l) for l in layers for kind in kinds)
        self.windows = tuple(cfg.window(l) for l in layers)  # the masks of the data-view layers
        self.rows, self.block, self.path = rows, block, path
        self.paths: dict[str, str] = {}  # how each active spec was computed at its last step (``__call__``)
        self.generator = torch.Generator().manual_seed(seed)

    def cache(self) -> Cache | None:
        """A forward cache keeping only what this penalty reads (None when it reads nothing):
        ``model(tokens, cache=penalty.cache())``."""
        return Cache(self.reads) if self.reads else None

    def __call__(self, model: Transformer, batch=None, cache: dict | None = None) -> dict[str, torch.Tensor]:
        memo: dict = {}
        options = dict(rows=self.rows, generator=self.generator, block=self.block, path=self.path)
        out = {}
        say = not torch.compiler.is_compiling()  # a compiled step is traced once: recording there adds a graph
        for s in self.specs:
            taken: set[str] | None = set() if say else None
            out[s.label] = s.strength * regularizer_value(
                s, model, self.heads[s.label], cache, memo, taken=taken, **options
            )
            if say:
                self.paths[s.label] = ", ".join(sorted(taken)) if taken else VIEW_PATHS[s.view]
        return out

    def values(self, model: Transformer, cache: dict | None = None) -> dict[str, float]:
        """Unweighted R of every spec (also those with lambda = 0), without gradients; every row
        counted (no sampling)."""
        memo: dict = {}
        with torch.no_grad():
            return {
                s.label: float(
                    regularizer_value(s, model, self.heads[s.label], cache, memo, block=self.block, path=self.path)
                )
                for s in self.all_specs
            }

    def estimate(self, T: int) -> dict:
        """How the data-view row penalties are computed on sequences of ``T`` positions (a run's
        card records it): ``{"rows": M or None, "positions": T, "estimate": E}``, E "sampled" when
        a layer they read has more informative positions than M, "exact" when every row counts,
        "none" when no active spec is a data-view row penalty."""
        if not self.windows:
            estimate = "none"
        else:
            estimate = "sampled" if any(samples(self.rows, T, w) for w in self.windows) else "exact"
        return {"rows": self.rows, "positions": T, "estimate": estimate}

    def __bool__(self) -> bool:
        return bool(self.specs)

    def describe(self) -> list[dict]:
        return [
            {**s.to_dict(), "label": s.label, "resolved_heads": [head_label(*lh) for lh in self.heads[s.label]]}
            for s in self.all_specs
        ]


def build_penalty(
    specs: SpecsLike,
    cfg: ModelConfig | Transformer,
    heads=None,
    rows: int | None = None,
    seed: int = 0,
    block=None,
    path: str = "auto",
) -> ConcentrationPenalty:
    """Validate specs against a model and build its penalty. ``heads`` is the default selection
    (see :func:`parse_heads`) for specs that name none; ``rows``, ``seed``, ``block`` and ``path`` as in
    :class:`ConcentrationPenalty`. Raises ValueError on a negative lambda, an unknown name or a
    layer/head out of range."""
    cfg = cfg.cfg if isinstance(cfg, Transformer) else cfg
    specs = parse_specs(specs)
    default = parse_heads(heads, cfg)
    resolved = {s.label: parse_heads(s.heads, cfg) if s.heads else default for s in specs}
    for s in specs:
        if s.view == "vocab" and cfg.attn_sinks:
            raise ValueError(
                f"{s.name!r} penalises the vocabulary view's rows, which leave out this model's learned sink logits "
                "(attn_sinks); penalise the data view (entropy, hoyer, topk, sink), whose rows include them"
            )
        if s.view == "vocab" and cfg.d_vocab > 4096:
            raise ValueError(f"{s.name!r} forms a d_vocab x d_vocab view per head; {cfg.d_vocab} tokens is too many")
    return ConcentrationPenalty(specs, resolved, cfg, rows=rows, seed=seed, block=block, path=path)


def with_entmax(model: Transformer, alpha: float | None) -> Transformer:
    """The model with alpha-entmax attention (1 = softmax, 1.5 = entmax15, 2 = sparsemax): a new
    model with the same weights, or the model itself when alpha is None or unchanged."""
    if alpha is None or float(alpha) == model.cfg.entmax_alpha:
        return model
    cfg = replace(model.cfg, entmax_alpha=float(alpha))  # validates 1 <= alpha <= 2
    out = Transformer(cfg).to(next(model.parameters()).device)
    out.load_state_dict(model.state_dict())
    return out
