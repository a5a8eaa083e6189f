"""Regularizer specs: the table of regularizers (:data:`REGULARIZERS`), :class:`RegSpec` and the
parsers of the ``NAME[:K][@HEADS]=LAMBDA`` syntax (see ``attn_core.regularizers``)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from attn_core.declarations import check_bounds, setting
from attn_core.limits import MAX_BLOCK
from attn_core.validate import is_number, shown

# name -> (view, what it penalises); the view decides what the penalty reads.
REGULARIZERS: dict[str, tuple[str, str]] = {
    "entropy": ("data", "normalized entropy of attention rows on the training batch"),
    "hoyer": ("data", "1 - Hoyer sparsity of attention rows on the training batch"),
    "topk": ("data", "1 - mass of the k largest weights of attention rows on the training batch"),
    "sink": ("data", "attention mass on the first key (an attention sink's) of rows on the training batch"),
    "vocab_entropy": ("vocab", "normalized entropy of the vocabulary view's rows (every token as query and key)"),
    "vocab_hoyer": ("vocab", "1 - Hoyer sparsity of the vocabulary view's rows"),
    "vocab_topk": ("vocab", "1 - top-k mass of the vocabulary view's rows"),
    "spectral": ("spectrum", "spectral norm sigma_1 of B (works against concentration)"),
    "nuclear": ("spectrum", "nuclear norm sum sigma_i of B (low rank)"),
}


@dataclass(frozen=True)
class RegSpec:
    """One regularizer: its name, strength lambda >= 0, k (top-k only) and heads (None = the
    job's default selection). ``str(spec)`` gives the spec back in the CLI's syntax."""

    name: str
    strength: float
    k: int = setting(  # at most the model's context (the page's bound); MAX_BLOCK beyond any model's
        1,
        bounds=(1, MAX_BLOCK),
        widget=dict(label="k", help="Penalise 1 − (mass of the k largest attention weights)", min_value=1, step=1),
    )
    heads: str | None = None  # a selection string; resolved against a model by `resolve`

    def __post_init__(self) -> None:
        if self.name not in REGULARIZERS:
            raise ValueError(f"unknown regularizer {self.name!r}; choose from {', '.join(REGULARIZERS)}")
        try:
            strength = float(self.strength)
        except (TypeError, ValueError):
            raise ValueError(f"strength of {self.name!r} must be a number, got {self.strength!r}") from None
        if not math.isfinite(strength) or strength < 0:
            raise ValueError(
                f"strength (lambda) of {self.name!r} must be a finite number >= 0, got {shown(self.strength)}"
            )
        object.__setattr__(self, "strength", strength)
        check_bounds(self, ("k",), f"regularizer {self.name!r}: ")
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
    """``NAME[:K][@HEADS]=LAMBDA`` (see the ``attn_core.regularizers`` doc)."""
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
    raise ValueError(f"strength (lambda) of {shown(name)} must be a number, got {shown(lam)}")


def regularized_heads(specs: SpecsLike, heads: str | None, cfg) -> list[tuple[int, int]]:
    """The (layer, head) pairs a run's penalties act on, in order: each spec's own ``@HEADS``,
    else the run's head selection ``heads`` (None: every head), resolved against ``cfg``."""
    from attn_core.regularizers.heads import parse_heads

    out: list[tuple[int, int]] = []
    for spec in parse_specs(specs):
        for pair in parse_heads(spec.heads if spec.heads is not None else heads, cfg):
            if pair not in out:
                out.append(pair)
    return out
