"""The two ranks of a head (arXiv 2604.04384; docs/maths.md, "The two ranks of a head").

Weight space: the singular values of B = W_Q W_K^T / sqrt(d_qk) (``heads.model_form``: the
factored spectrum of :class:`~attn_core.bilinear.form.QKForm`, never the d x d matrix; a merged
head's W_QK; with rotary positions the un-rotated form, offset 0; without the bias row).

Data space: the singular values of the centred score matrix of each probe (a window of T tokens
of text, or a task sample),

    S_c = S (I - 1 1^T / T),   S = the layer's ``hook_attn_scores`` [T, T]

the scores the model computes (biases included, rotary applied), over *every* pair of the
probe's positions: S before the causal mask (the full pre-mask matrix; the model never uses its
upper triangle, which continues the same bilinear form), each query's row centred over the
probe's keys. Centring the rows is centring the keys: S_c = X_q B (X_k - mean_k X_k)^T without
rotary, the part of the scores that tells keys apart, and softmax ignores a row's mean.

Per spectrum s (descending): the effective rank at a share f of the variance (default 90%),
the fewest components whose squared singular values reach f of the total, and the stable rank
||M||_F^2 / ||M||_2^2. Data-space ranks are the means over the probes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attn_core import linalg
from attn_core.bilinear.checks import check_model
from attn_core.bilinear.heads import layer_forms
from attn_core.hooks import act_name
from attn_core.limits import LimitError, size_text
from attn_core.model import Transformer
from attn_core.validate import shown

VARIANCE = 0.9  # the share of the variance the effective rank reaches
WORK_BYTES = 256 * 2**20  # one chunk of probes: one layer's scores in float64 at a time


def check_variance(frac: float) -> float:
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
        raise ValueError(f"--variance must be a share of the variance in (0, 1], e.g. 0.9, got {shown(frac)}")
    return float(frac)


def variance_rank(s: torch.Tensor, frac: float = VARIANCE) -> torch.Tensor:
    """The fewest leading components whose squared singular values reach ``frac`` of their sum:
    ``s`` [..., k] descending -> [...] (int64; 0 for a zero spectrum)."""
    e = s.double().pow(2)
    total = e.sum(-1, keepdim=True)
    share = e.cumsum(-1) / total.clamp_min(torch.finfo(torch.float64).tiny)
    # a relative tolerance so that a share of exactly frac in exact arithmetic counts as reached
    below = (share < frac * (1 - 1e-12)).sum(-1)
    rank = (below + 1).clamp_max(s.shape[-1])
    return torch.where(total[..., 0] > 0, rank, torch.zeros_like(rank))


def stable_rank(s: torch.Tensor) -> torch.Tensor:
    """||M||_F^2 / ||M||_2^2 from singular values ``s`` [..., k] (any order; 0 for M = 0)."""
    e = s.double().pow(2)
    top = e.amax(-1)
    return torch.where(top > 0, e.sum(-1) / top.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(top))


def cumulative_variance(s: torch.Tensor) -> torch.Tensor:
    """[..., k]: the share of the variance in the first 1..k components (0 for a zero spectrum)."""
    e = s.double().pow(2)
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e.cumsum(-1) / total.clamp_min(torch.finfo(torch.float64).tiny), 0.0)


@torch.no_grad()
def score_spectra(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """Singular values of the centred scores S_c of every probe and head, [n, L, H, T] float64 on
    the model's device (the module doc); ``tokens`` [n, T]. Read by a hook on each layer's
    ``hook_attn_scores``, a chunk of probes at a time."""
    model = check_model(model, "score_spectra")
    cfg = model.cfg
    n, T = tokens.shape
    device = model.embed.W_E.device
    per_probe = cfg.n_heads * T * T * 8 * 3  # S in float64, centred, and the SVD's work
    chunk = max(1, min(n, WORK_BYTES // per_probe))
    if per_probe > 4 * WORK_BYTES:
        raise LimitError(f"one probe of {T} tokens needs {size_text(per_probe)} for a layer's scores; use fewer tokens")
    out = torch.zeros(n, cfg.n_layers, cfg.n_heads, T, dtype=torch.float64, device=device)
    at = [0]

    def hook(layer: int):
        def read(S: torch.Tensor, name: str) -> None:
            S = S.double()
            centred = S - S.mean(-1, keepdim=True)
            out[at[0] : at[0] + S.shape[0], layer] = linalg.svdvals(centred)

        return read

    hooks = [(act_name("attn_scores", l), hook(l)) for l in range(cfg.n_layers)]
    for i in range(0, n, chunk):
        at[0] = i
        model.run_with_hooks(tokens[i : i + chunk].to(device), fwd_hooks=hooks)
    return out


@dataclass(frozen=True)
class Ranks:
    """Singular values of B per head (``weight`` [L, H, k]) and of the centred scores per probe
    (``data`` [n, L, H, T], None without probes), CPU float64; ``frac`` the share of the variance,
    ``rank_cap`` [L, H] the most B can have (d_qk of a factored head, d_model of a merged one)."""

    weight: torch.Tensor
    data: torch.Tensor | None
    frac: float
    rank_cap: torch.Tensor
    what: str = ""

    @property
    def weight_rank(self) -> torch.Tensor:
        """[L, H] int: components of B reaching ``frac`` of its variance."""
        return variance_rank(self.weight, self.frac)

    @property
    def weight_stable_rank(self) -> torch.Tensor:
        return stable_rank(self.weight)

    @property
    def data_rank(self) -> torch.Tensor | None:
        """[L, H]: the mean over probes of the components of S_c reaching ``frac`` of its variance."""
        return None if self.data is None else variance_rank(self.data, self.frac).double().mean(0)

    @property
    def data_stable_rank(self) -> torch.Tensor | None:
        return None if self.data is None else stable_rank(self.data).mean(0)

    @property
    def n_probes(self) -> int:
        return 0 if self.data is None else self.data.shape[0]

    def heads(self) -> list[dict]:
        """One record per head: the rank cap, B's and S_c's effective rank at ``frac`` and stable
        ranks, and the gap (weight / data effective rank)."""
        L, H = self.weight.shape[:2]
        wr, ws = self.weight_rank, self.weight_stable_rank
        dr, ds = self.data_rank, self.data_stable_rank
        rows = []
        for l in range(L):
            for h in range(H):
                row = dict(layer=l, head=h, rank_cap=int(self.rank_cap[l, h]))
                row.update(weight_rank=int(wr[l, h]), weight_stable_rank=float(ws[l, h]))
                d = None if dr is None else float(dr[l, h])
                row.update(data_rank=d, data_stable_rank=None if ds is None else float(ds[l, h]))
                row["gap"] = int(wr[l, h]) / d if d else None
                rows.append(row)
        return rows

    def curves(self) -> list[dict]:
        """Tidy cumulative variance per head: layer, head, space ("weight" B, "data" S_c, the
        mean over probes), components i (1..), share of the variance."""
        rows = []
        spaces = [("weight", cumulative_variance(self.weight))]
        if self.data is not None:
            spaces.append(("data", cumulative_variance(self.data).mean(0)))
        for space, c in spaces:
            L, H, k = c.shape
            for l in range(L):
                for h in range(H):
                    for i, v in enumerate(c[l, h].tolist()):
                        rows.append(dict(layer=l, head=h, space=space, components=i + 1, variance=v))
        return rows

    def to_json(self) -> dict:
        return dict(variance=self.frac, probes=self.n_probes, inputs=self.what, heads=self.heads())


def weight_spectra(model: Transformer) -> torch.Tensor:
    """Singular values of every head's B, [L, H, k] (the factored spectrum)."""
    model = check_model(model, "weight_spectra")
    with torch.no_grad():
        return torch.stack([f.singular_values for f in layer_forms(model)]).double()  # a layer at a time


def rank_caps(model: Transformer) -> torch.Tensor:
    model = check_model(model, "rank_caps")
    cfg = model.cfg
    return torch.tensor(
        [
            [cfg.head_d_qk(l, h) if cfg.qk == "factored" else cfg.d_model for h in range(cfg.n_heads)]
            for l in range(cfg.n_layers)
        ],
        device="cpu",  # a host-side table, beside the CPU spectra of Ranks
    )


def ranks(
    model: Transformer,
    tokens: torch.Tensor | None = None,
    frac: float = VARIANCE,
    what: str = "",
    weight: torch.Tensor | None = None,
) -> Ranks:
    """Both ranks of every head: of B, and (with probes ``tokens`` [n, T]) of the centred scores.
    ``weight``: B's singular values [L, H, k] when the caller has them already (``al.spectrum``):
    they are not computed again."""
    model = check_model(model, "ranks")
    frac = check_variance(frac)
    data = None
    if tokens is not None:
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=model.embed.W_E.device)
        if tokens.dim() != 2 or min(tokens.shape) < 1:
            raise ValueError(f"probes are token ids [n, T] with n, T >= 1, got shape {list(tokens.shape)}")
        if tokens.shape[1] > model.cfg.n_ctx:
            raise ValueError(f"probes of {tokens.shape[1]} tokens exceed the model context of {model.cfg.n_ctx}")
        data = score_spectra(model, tokens).cpu()
        what = what or f"{tokens.shape[0]} probes of {tokens.shape[1]} tokens"
    weight = weight_spectra(model).cpu() if weight is None else weight.double().cpu()
    if not bool(torch.isfinite(weight).all()) or (data is not None and not bool(torch.isfinite(data).all())):
        raise ValueError(
            "the spectra are not finite (NaN or Inf): the model's weights are too large for the arithmetic"
        )
    return Ranks(weight, data, frac, rank_caps(model), what)


def gap(r: Ranks) -> float:
    """Mean weight-space effective rank over the mean data-space one (NaN without probes)."""
    if r.data_rank is None:
        return math.nan
    return float(r.weight_rank.double().mean() / r.data_rank.mean())
