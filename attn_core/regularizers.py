"""Differentiable concentration and spectral penalties on the QK bilinear form (issue 4).

A regularizer R with strength lambda >= 0 adds ``lambda * R`` to the task loss. Each R is a mean
over its selected heads (so lambda does not depend on how many heads are chosen) and, for the
row penalties, over the rows that see at least two keys (``metrics.MIN_KEYS``):

    entropy        H(A_i) / log n_i                 A_i an attention row of the training batch,
                                                    n_i its visible keys (causal rows compare)
    hoyer          1 - Hoyer(A_i)                   negative Hoyer sparsity, shifted by 1 so the
                                                    term is >= 0; Hoyer = (sqrt n - |p|_1/|p|_2)/(sqrt n - 1)
    topk           1 - sum of the k largest A_ij    top-k mass deficit (k = 1 unless ``topk:K``)
    vocab_entropy  the same three on the vocabulary view: row x is the attention of token x
    vocab_hoyer    over every token y, A_x = attn(f_x(.)) with f_x(y) = x^T B y and x, y every
    vocab_topk     token as the layer sees it (bilinear.vocab_scores) -- "for every x" (seed 000)
    spectral       ||B||_2 = sigma_1(B)             sigma-Reparam's view: a small ||B||_2 bounds
                                                    how far attention entropy can collapse, so this
                                                    one works *against* concentration
    nuclear        ||B||_* = sum_i sigma_i(B)       convex surrogate of rank; from the factors
                                                    (QR of W_Q, W_K and the small core's SVD)

The row metrics are ``attn_core.metrics`` (one definition for measuring and penalising); B and
its spectrum are ``attn_core.bilinear``. Alpha-entmax attention, the architectural alternative
to a penalty, is a model setting (``ModelConfig.entmax_alpha``), chosen at retrain time.

A spec names a regularizer, its strength and optionally its heads and k::

    NAME[:K][@HEADS]=LAMBDA      entropy=0.1   topk:2=0.5   vocab_entropy@L1H2,L0=0.05

HEADS is a comma-separated list of ``L<l>`` (every head of layer l) and ``L<l>H<h>`` items.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from attn_core import metrics
from attn_core.bilinear import QKForm, layer_form, model_form, vocab_scores
from attn_core.hooks import act_name
from attn_core.model import ModelConfig, Transformer, attention_weights
from attn_core.validate import is_int, is_number

# name -> (view, what it penalises); the view decides what the penalty reads.
REGULARIZERS: dict[str, tuple[str, str]] = {
    "entropy": ("data", "normalized entropy of attention rows on the training batch"),
    "hoyer": ("data", "1 - Hoyer sparsity of attention rows on the training batch"),
    "topk": ("data", "1 - mass of the k largest weights of attention rows on the training batch"),
    "vocab_entropy": ("vocab", "normalized entropy of the vocabulary view's rows (every token as query and key)"),
    "vocab_hoyer": ("vocab", "1 - Hoyer sparsity of the vocabulary view's rows"),
    "vocab_topk": ("vocab", "1 - top-k mass of the vocabulary view's rows"),
    "spectral": ("spectrum", "spectral norm sigma_1 of B (works against concentration)"),
    "nuclear": ("spectrum", "nuclear norm sum sigma_i of B (low rank)"),
}
ROW_KINDS = ("entropy", "hoyer", "topk")  # the row penalty behind data and vocab regularizers
Heads = tuple[tuple[int, int], ...]


# --- head selection ------------------------------------------------------------------------------

_ITEM = re.compile(r"^L(\d+)(?:H(\d+))?$", re.IGNORECASE)


def all_heads(cfg: ModelConfig) -> Heads:
    return tuple((l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads))


def parse_heads(text: None | str | Iterable, cfg: ModelConfig) -> Heads:
    """Resolve a head selection against a model: None/"" = every head; a string of ``L<l>`` and
    ``L<l>H<h>`` items separated by commas; or an iterable of ``(layer, head)`` pairs / layer ints.
    Raises ValueError naming the item that is malformed or out of range."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return all_heads(cfg)
    items: list = []
    if isinstance(text, str):
        for part in text.split(","):
            part = part.strip()
            m = _ITEM.match(part)
            if not m:
                raise ValueError(f"head selection item {part!r} is not L<layer> or L<layer>H<head> (e.g. L0, L1H2)")
            items.append(int(m.group(1)) if m.group(2) is None else (int(m.group(1)), int(m.group(2))))
    else:
        items = list(text)
    out: list[tuple[int, int]] = []
    for item in items:
        if is_int(item):
            _check_layer(cfg, item)
            out += [(item, h) for h in range(cfg.n_heads)]
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            l, h = int(item[0]), int(item[1])
            _check_layer(cfg, l)
            if not 0 <= h < cfg.n_heads:
                raise ValueError(
                    f"head L{l}H{h} is out of range: this model has {cfg.n_heads} heads per layer "
                    f"(H0..H{cfg.n_heads - 1})"
                )
            out.append((l, h))
        else:
            raise ValueError(f"head selection item {item!r} is not a layer or a (layer, head) pair")
    if not out:
        raise ValueError("the head selection is empty")
    return tuple(sorted(set(out)))


def _check_layer(cfg: ModelConfig, l: int) -> None:
    if not 0 <= l < cfg.n_layers:
        raise ValueError(
            f"layer L{l} is out of range: this model has {cfg.n_layers} layer"
            f"{'s' * (cfg.n_layers != 1)} (L0..L{cfg.n_layers - 1})"
        )


def format_heads(heads: Heads, cfg: ModelConfig | None = None) -> str:
    """The selection as a spec string, whole layers collapsed to ``L<l>``."""
    if cfg is not None and tuple(heads) == all_heads(cfg):
        return "all"
    parts = []
    layers = sorted({l for l, _ in heads})
    for l in layers:
        hs = [h for ll, h in heads if ll == l]
        if cfg is not None and len(hs) == cfg.n_heads:
            parts.append(f"L{l}")
        else:
            parts += [f"L{l}H{h}" for h in hs]
    return ",".join(parts)


def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


# --- specs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegSpec:
    """One regularizer: its name, strength lambda >= 0, k (top-k only) and heads (None = the
    job's default selection). ``str(spec)`` gives the spec back in the CLI's syntax."""

    name: str
    strength: float
    k: int = 1
    heads: str | None = None  # a selection string; resolved against a model by `resolve`

    def __post_init__(self) -> None:
        if self.name not in REGULARIZERS:
            raise ValueError(f"unknown regularizer {self.name!r}; choose from {', '.join(REGULARIZERS)}")
        try:
            strength = float(self.strength)
        except (TypeError, ValueError):
            raise ValueError(f"strength of {self.name!r} must be a number, got {self.strength!r}") from None
        if not math.isfinite(strength) or strength < 0:
            raise ValueError(f"strength (lambda) of {self.name!r} must be a finite number >= 0, got {self.strength!r}")
        object.__setattr__(self, "strength", strength)
        if not (is_int(self.k) and self.k >= 1):
            raise ValueError(f"k of {self.name!r} must be an integer >= 1, got {self.k!r}")
        if self.k != 1 and not self.name.endswith("topk"):
            raise ValueError(f"k only applies to topk and vocab_topk, not to {self.name!r}")

    @property
    def view(self) -> str:
        return REGULARIZERS[self.name][0]

    @property
    def label(self) -> str:
        """The term's name in losses and logs: ``topk:2``, ``entropy@L1H2``."""
        out = self.name + (f":{self.k}" if self.k != 1 else "")
        return out + (f"@{self.heads}" if self.heads else "")

    def __str__(self) -> str:
        return f"{self.label}={self.strength:g}"

    def to_dict(self) -> dict:
        return {"name": self.name, "strength": self.strength, "k": self.k, "heads": self.heads}


_SPEC = re.compile(r"^(?P<name>[a-z_]+)(?::(?P<k>[^@=]+))?(?:@(?P<heads>[^=]+))?=(?P<strength>.+)$")


def parse_spec(text: str) -> RegSpec:
    """``NAME[:K][@HEADS]=LAMBDA`` (see the module doc)."""
    m = _SPEC.match(text.strip().lower().replace(" ", ""))
    if not m:
        raise ValueError(
            f"regularizer spec {text!r} is not NAME[:K][@HEADS]=LAMBDA, e.g. entropy=0.1, "
            f"topk:2=0.5, vocab_entropy@L1H2=0.05; names: {', '.join(REGULARIZERS)}"
        )
    k = 1
    if m.group("k") is not None:
        if not m.group("k").isdigit():
            raise ValueError(f"k in {text!r} must be a positive integer")
        k = int(m.group("k"))
    try:
        strength = float(m.group("strength"))
    except ValueError:
        raise ValueError(f"lambda in {text!r} must be a number, got {m.group('strength')!r}") from None
    return RegSpec(m.group("name"), strength, k=k, heads=m.group("heads").upper() if m.group("heads") else None)


SpecsLike = Mapping[str, float] | Iterable[str | RegSpec | Mapping] | None


def parse_specs(specs: SpecsLike) -> list[RegSpec]:
    """Specs from a ``{name or spec-without-lambda: lambda}`` mapping (``{"topk:2": 0.1}``), or a
    list of spec strings, :class:`RegSpec` or their dicts. Two specs with one label are refused."""
    if specs is None:
        return []
    if isinstance(specs, Mapping):
        # a float that is not finite is a number too: RegSpec says it must be finite
        out = [
            parse_spec(f"{name}={lam}") if is_number(lam) or isinstance(lam, float) else _bad_strength(name, lam)
            for name, lam in specs.items()
        ]
    else:
        out = []
        for s in specs:
            if isinstance(s, RegSpec):
                out.append(s)
            elif isinstance(s, str):
                out.append(parse_spec(s))
            elif isinstance(s, Mapping):
                out.append(RegSpec(**s))
            else:
                raise ValueError(f"cannot read a regularizer spec from {s!r}")
    labels = [s.label for s in out]
    dup = sorted({l for l in labels if labels.count(l) > 1})
    if dup:
        raise ValueError(f"regularizer {dup[0]!r} is given twice")
    return out


def _bad_strength(name, lam):
    raise ValueError(f"strength (lambda) of {name!r} must be a number, got {lam!r}")


# --- the penalties themselves ----------------------------------------------------------------------


def row_penalty(kind: str, p: torch.Tensor, mask: torch.Tensor | None, k: int = 1) -> torch.Tensor:
    """Per-row penalty of attention rows ``p`` [..., n] (lower = more concentrated)."""
    if kind == "entropy":
        return metrics.normalized_entropy(p, mask)
    if kind == "hoyer":
        return 1 - metrics.hoyer(p, mask)
    if kind == "topk":
        return 1 - metrics.topk_mass(p, k, mask)
    raise ValueError(f"unknown row penalty {kind!r}; choose from {', '.join(ROW_KINDS)}")


def mean_rows(values: torch.Tensor, p_shape: torch.Size, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over the informative rows (>= 2 visible keys) of ``values`` [b, h, q] or [h, q],
    one value per head [h] (differentiable)."""
    valid = metrics.informative_rows(mask, p_shape).expand_as(values).to(values.dtype)
    if values.dim() == 3:
        return (values * valid).sum((0, 2)) / valid.sum((0, 2)).clamp_min(1)
    return (values * valid).sum(-1) / valid.sum(-1).clamp_min(1)


def data_rows(model: Transformer, cache: dict, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached attention pattern of a layer [b, h, T, T] and its causal mask [T, T]."""
    key = act_name("pattern", layer)
    if key not in cache:
        raise ValueError(f"the forward cache has no {key}; run the model with cache={{}} first")
    A = cache[key]
    T = A.shape[-1]
    return A, model.causal[:T, :T]


def vocab_rows(model: Transformer, layer: int, heads: Sequence[int] | None = None) -> torch.Tensor:
    """Rows of the vocabulary view, [h, V, V]: attention of every token over every token, with
    the model's own row normalisation (softmax, or alpha-entmax). Differentiable."""
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
    attn = model.blocks[layer].attn
    scale = attn.qk_scale.view(-1)
    widths = [cfg.head_d_qk(layer, h) for h in range(cfg.n_heads)]
    rows = [
        QKForm(left=attn.W_Q[h, :, :w] * scale[h], right=attn.W_K[h, :, :w]).singular_values
        for h, w in enumerate(widths)
    ]
    r = max(widths)
    return torch.stack([torch.nn.functional.pad(s, (0, r - s.shape[-1])) for s in rows])


def _by_layer(heads: Heads) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for l, h in heads:
        out.setdefault(l, []).append(h)
    return out


def regularizer_value(
    spec: RegSpec, model: Transformer, heads: Heads, cache: dict | None = None, memo: dict | None = None
) -> torch.Tensor:
    """The unweighted regularizer R (a scalar, mean over ``heads``); ``cache`` holds the
    forward's patterns for the data view. ``memo`` shares vocabulary rows and spectra between
    specs within one step."""
    memo = {} if memo is None else memo
    kind = spec.name.removeprefix("vocab_")
    per_head = []
    for layer, hs in _by_layer(heads).items():
        if spec.view == "data":
            if cache is None:
                raise ValueError(f"{spec.name!r} reads the training batch's attention; pass the forward cache")
            A, mask = data_rows(model, cache, layer)
            A = A[:, hs]
            per_head.append(mean_rows(row_penalty(kind, A, mask, spec.k), A.shape, mask))
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
            per_head.append(sigma[..., 0] if kind == "spectral" else sigma.sum(-1))
    return torch.cat(per_head).mean()


class ConcentrationPenalty:
    """A Trainer ``Penalty``: ``penalty(model, batch, cache) -> {label: lambda * R}``.

    Built by :func:`build_penalty`; ``specs`` are those with lambda > 0 (a zero strength turns
    a regularizer off), ``heads[label]`` the resolved heads of each, ``regularized_heads`` their
    union (every head when no spec is active)."""

    def __init__(self, specs: list[RegSpec], heads: dict[str, Heads], cfg: ModelConfig):
        self.specs = [s for s in specs if s.strength > 0]
        self.all_specs = specs
        self.heads = heads
        union = sorted({lh for s in self.specs for lh in heads[s.label]})
        self.regularized_heads: Heads = tuple(union) if union else all_heads(cfg)

    def __call__(self, model: Transformer, batch=None, cache: dict | None = None) -> dict[str, torch.Tensor]:
        memo: dict = {}
        return {s.label: s.strength * regularizer_value(s, model, self.heads[s.label], cache, memo) for s in self.specs}

    def values(self, model: Transformer, cache: dict | None = None) -> dict[str, float]:
        """Unweighted R of every spec (also those with lambda = 0), without gradients."""
        memo: dict = {}
        with torch.no_grad():
            return {
                s.label: float(regularizer_value(s, model, self.heads[s.label], cache, memo)) for s in self.all_specs
            }

    def __bool__(self) -> bool:
        return bool(self.specs)

    def describe(self) -> list[dict]:
        return [
            {**s.to_dict(), "label": s.label, "resolved_heads": [head_label(*lh) for lh in self.heads[s.label]]}
            for s in self.all_specs
        ]


def build_penalty(specs: SpecsLike, cfg: ModelConfig | Transformer, heads=None) -> ConcentrationPenalty:
    """Validate specs against a model and build its penalty. ``heads`` is the default selection
    (see :func:`parse_heads`) for specs that name none. Raises ValueError on a negative lambda, an
    unknown name or a layer/head out of range."""
    cfg = cfg.cfg if isinstance(cfg, Transformer) else cfg
    specs = parse_specs(specs)
    default = parse_heads(heads, cfg)
    resolved = {s.label: parse_heads(s.heads, cfg) if s.heads else default for s in specs}
    for s in specs:
        if s.view == "vocab" and cfg.d_vocab > 4096:
            raise ValueError(f"{s.name!r} forms a d_vocab x d_vocab view per head; {cfg.d_vocab} tokens is too many")
    return ConcentrationPenalty(specs, resolved, cfg)


# --- per-head summaries (telemetry and before/after) ------------------------------------------------


@torch.no_grad()
def data_concentration(model: Transformer, cache: dict, heads: Heads | None = None) -> dict[str, torch.Tensor]:
    """Per head on the cached forward: ``entropy`` (mean normalized entropy) and ``top1`` (mean
    top-1 mass) over informative rows, each [n_layers, n_heads] (NaN where not selected)."""
    cfg = model.cfg
    out = {k: torch.full((cfg.n_layers, cfg.n_heads), math.nan) for k in ("entropy", "top1")}
    for layer, hs in _by_layer(heads or all_heads(cfg)).items():
        A, mask = data_rows(model, cache, layer)
        A = A[:, hs].float()
        out["entropy"][layer, hs] = mean_rows(metrics.normalized_entropy(A, mask), A.shape, mask).cpu()
        out["top1"][layer, hs] = mean_rows(metrics.topk_mass(A, 1, mask), A.shape, mask).cpu()
    return out


@torch.no_grad()
def vocab_concentration(model: Transformer, heads: Heads | None = None) -> dict[str, torch.Tensor]:
    """Per head on the vocabulary view: ``entropy`` and ``top1``, [n_layers, n_heads]."""
    cfg = model.cfg
    out = {k: torch.full((cfg.n_layers, cfg.n_heads), math.nan) for k in ("entropy", "top1")}
    for layer, hs in _by_layer(heads or all_heads(cfg)).items():
        P = vocab_rows(model, layer, hs).float()
        out["entropy"][layer, hs] = mean_rows(metrics.normalized_entropy(P), P.shape, None).cpu()
        out["top1"][layer, hs] = mean_rows(metrics.topk_mass(P, 1), P.shape, None).cpu()
    return out


@torch.no_grad()
def spectrum(model: Transformer) -> dict[str, torch.Tensor]:
    """Singular values of B of every head [n_layers, n_heads, r] (descending) and its stable rank
    [n_layers, n_heads], on the CPU."""
    form = model_form(model)
    return {"singular_values": form.singular_values.float().cpu(), "stable_rank": form.stable_rank.float().cpu()}


def with_entmax(model: Transformer, alpha: float | None) -> Transformer:
    """The model with alpha-entmax attention (1 = softmax, 1.5 = entmax15, 2 = sparsemax): a new
    model with the same weights, or the model itself when alpha is None or unchanged."""
    if alpha is None or float(alpha) == model.cfg.entmax_alpha:
        return model
    cfg = replace(model.cfg, entmax_alpha=float(alpha))  # validates 1 <= alpha <= 2
    out = Transformer(cfg).to(next(model.parameters()).device)
    out.load_state_dict(model.state_dict())
    return out
