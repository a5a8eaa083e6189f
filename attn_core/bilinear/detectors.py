"""Head detectors: how much attention a head puts where a known circuit would (TransformerLens'
detection patterns: previous token, duplicate token, induction, self), on generated inputs.
Pure model maths: every function takes the :class:`Transformer`; the patterns are read from its
``act_name("pattern", l)`` hook points.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from attn_core.bilinear.checks import check_model
from attn_core.hooks import act_name
from attn_core.model import Transformer
from attn_core.validate import is_int, shown

DETECTORS = ("previous_token", "induction", "duplicate_token", "self")


def detection_patterns(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """TransformerLens' detection patterns for tokens [b, T], each [b, T, T] (1 where the head
    should attend): previous token (i -> i-1), duplicate token (i -> earlier j with the same
    token), induction (i -> j+1 for earlier j with the same token as i), self (i -> i)."""
    b, T = tokens.shape
    eye = torch.eye(T, dtype=torch.bool, device=tokens.device)
    strictly_lower = torch.tril(torch.ones(T, T, dtype=torch.bool, device=tokens.device), -1)
    same = tokens[:, :, None] == tokens[:, None, :]  # [b, T, T]
    duplicate = same & strictly_lower
    induction = torch.zeros_like(duplicate)
    induction[:, :, 1:] = duplicate[:, :, :-1]  # attend to the token after the earlier copy
    induction &= strictly_lower
    previous = torch.zeros_like(eye)
    previous[1:, :-1] = eye[1:, 1:]
    return {
        "previous_token": previous.expand(b, T, T),
        "induction": induction,
        "duplicate_token": duplicate,
        "self": eye.expand(b, T, T),
    }


def detector_inputs(
    model: Transformer, n_samples: int = 32, seed: int = 0, length: int | None = None
) -> dict[str, torch.Tensor]:
    """Seeded generated inputs from the model's own vocabulary: ``random`` [n, length] uniform
    tokens, ``repeated`` [n, 2 * (length // 2)] a random half (distinct tokens when the
    vocabulary allows) written twice."""
    cfg = check_model(model, "the head detectors").cfg
    length = min(cfg.n_ctx, 64) if length is None else length
    if not is_int(length) or not 2 <= length <= cfg.n_ctx:
        raise ValueError(f"length {shown(length)} is outside 2..{cfg.n_ctx}")
    if n_samples < 1:
        raise ValueError(f"n_samples must be positive, got {n_samples}")
    g = torch.Generator().manual_seed(int(seed))
    random = torch.randint(0, cfg.d_vocab, (n_samples, length), generator=g)
    half = length // 2
    if half <= cfg.d_vocab:
        first = torch.rand(n_samples, cfg.d_vocab, generator=g).argsort(-1)[:, :half]
    else:
        first = torch.randint(0, cfg.d_vocab, (n_samples, half), generator=g)
    return {"random": random, "repeated": torch.cat([first, first], dim=1)}


def _patterns(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """A of every head, [b, L, H, T, T] float32, from the model's hook points (on its device)."""
    names = [act_name("pattern", l) for l in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=names)
    return torch.stack([cache[n] for n in names], 1).float()


def detector_tensors(
    model: Transformer, inputs: dict[str, torch.Tensor], rows: str = "supported"
) -> dict[str, torch.Tensor]:
    """:func:`head_detector_scores` of ``inputs`` (:func:`detector_inputs`), on the model's device
    (the tensor part: no data is read)."""
    model = check_model(model, "detector_tensors")
    if not isinstance(rows, str) or rows not in ("supported", "all"):
        raise ValueError(f"rows must be 'supported' or 'all', got {shown(rows)}")
    device = model.embed.W_E.device
    out = {}
    with torch.no_grad():
        for source, names in (("random", ("previous_token", "self")), ("repeated", ("duplicate_token", "induction"))):
            tokens = inputs[source].to(device)
            A = _patterns(model, tokens)  # [b, L, H, T, T]
            patterns = detection_patterns(tokens)
            for name in names:
                D = patterns[name][:, None, None].float()  # [b, 1, 1, T, T]
                mass = (A * D).sum(-1)  # [b, L, H, T]
                if rows == "supported":  # NaN where no row has support (contexts too short)
                    sel = (D.sum(-1) > 0).expand_as(mass)
                    count = sel.sum((0, 3))
                    out[name] = torch.where(count > 0, (mass * sel).sum((0, 3)) / count.clamp_min(1), math.nan)
                else:
                    out[name] = mass.sum((0, 3)) / A.sum((-1, -2)).sum(0)
    return {name: out[name] for name in DETECTORS}


def head_detector_scores(
    model: Transformer, n_samples: int = 32, seed: int = 0, length: int | None = None, rows: str = "supported"
) -> dict[str, torch.Tensor]:
    """``{detector: [n_layers, n_heads]}`` on the CPU: the attention mass a head puts where the
    detection pattern is 1 (TransformerLens' "mul" score), averaged over samples and query rows.
    ``rows="supported"`` averages over the rows where the pattern has any 1 (so a perfect head
    scores 1); ``rows="all"`` over every row, as TransformerLens does. Previous-token and self
    are measured on random tokens, duplicate-token and induction on repeated ones."""
    model = check_model(model, "the head detectors")
    scores = detector_tensors(model, detector_inputs(model, n_samples, seed, length), rows)
    return {name: t.cpu() for name, t in scores.items()}


def head_detectors(
    model: Transformer, n_samples: int = 32, seed: int = 0, length: int | None = None, rows: str = "supported"
) -> pd.DataFrame:
    """Tidy detector scores: layer, head, detector, score."""
    model = check_model(model, "head_detectors")
    scores = head_detector_scores(model, n_samples, seed, length, rows)
    recs = []
    for name, t in scores.items():
        for l in range(t.shape[0]):
            for h in range(t.shape[1]):
                recs.append(dict(layer=l, head=h, detector=name, score=float(t[l, h])))
    return pd.DataFrame(recs)


def best_heads(detectors: pd.DataFrame) -> dict[str, dict]:
    """For each detector, the head with the highest score: {detector: {layer, head, score}},
    None for a detector that could not be measured (NaN everywhere)."""
    out = {}
    for name, part in detectors.groupby("detector", sort=False):
        part = part.dropna(subset=["score"])
        if part.empty:  # not measurable on this model's context
            out[name] = None
            continue
        top = part.loc[part["score"].idxmax()]
        out[name] = {"layer": int(top["layer"]), "head": int(top["head"]), "score": float(top["score"])}
    return out
