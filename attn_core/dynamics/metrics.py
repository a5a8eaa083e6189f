"""What one checkpoint measures, on fixed held-out inputs (docs/maths.md, "Training dynamics").

Inputs (:class:`Inputs`): ``samples`` held-out sequences of the model's task drawn with a fixed
seed (:func:`task_inputs`), or windows of a tokenized text (:func:`text_inputs`); every position's
next token is a target. Per checkpoint (:func:`checkpoint_metrics`), names as ``telemetry.MetricKey`` spells them:

    loss                    the task's loss on its scored positions (text: every position), nats
    icl_score               mean loss over the late positions minus over the early ones (nats;
                            Olsson et al. 2022), every position's next-token loss counted
    prefix_matching:LlHh    attention from each token of a repeated random sequence to the token
                            after its earlier copy (Olsson et al.; the induction detector)
    previous_token:LlHh     attention to the previous token on random tokens
    k_composition_max:LlHh  the largest K-composition score into the head from an earlier head (l >= 1)
    entropy_data:LlHh       mean normalized entropy H(A_i)/log n_i of the rows with >= 2 keys
    entropy_bound:LlHh      the same mean of the entropy floor h(n_i, ||L||_2)/log n_i (bound.py)
    sigma_max:LlHh          sigma_1(B)
    stable_rank:LlHh        ||B||_F^2 / ||B||_2^2
    copying:LlHh            the copying score of the head's OV circuit
    sink_rate               the share of sink heads (Gu et al. 2024; bilinear.sinks), and
    sink_importance:LlHh    the head's largest key importance, on the first 32 inputs' first 64 tokens
    weight_rank:LlHh        the effective rank of B at 90% of its variance (bilinear.ranks)
    data_rank:LlHh          the same of the centred scores S_c, and data_stable_rank:LlHh its stable
                            rank, means over the first 32 inputs (cut to 64 tokens)

A partial checkpoint (attention and LayerNorm weights only) has no embeddings or unembedding of
its own: what needs the forward or the vocabulary is None for it. ``k_composition`` (every
writer -> reader pair, [n, n]) comes along for the views that show K-composition per writer.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attn_core import metrics as M
from attn_core import regularizers as R
from attn_core.bilinear import head_detector_scores, ranks, sinks, variance_rank
from attn_core.circuits import composition, copying_scores
from attn_core.dynamics import bound
from attn_core.hooks import act_name
from attn_core.limits import LimitError, size_text
from attn_core.model import Transformer
from attn_core.tasks import Task
from attn_core.training.telemetry import MetricKey

SEED_OFFSET = 3_000_017  # held-out inputs never share a generator stream with training or evaluation
WORK_BYTES = 256 * 2**20  # float64 working memory of one chunk of the forward's scores
PER_HEAD = (
    "prefix_matching",
    "previous_token",
    "k_composition_max",
    "entropy_data",
    "entropy_bound",
    "sigma_max",
    "stable_rank",
    "copying",
    "sink_importance",
    "weight_rank",
    "data_rank",
    "data_stable_rank",
)
NEEDS_FORWARD = {"loss", "icl_score", "prefix_matching", "previous_token", "entropy_data", "entropy_bound", "copying"}
NEEDS_FORWARD |= {"sink_rate", "sink_importance", "data_rank", "data_stable_rank"}
PROBES, PROBE_LENGTH = 32, 64  # the inputs sinks and data ranks are measured on (bilinear.sinks)


def default_positions(T: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Early positions [1, 1 + w) and late ones [T - w, T), w = max(1, T // 8) (positions of the
    token whose next token is predicted; position 0, with no context at all, is left out)."""
    w = max(1, T // 8)
    return (1, min(1 + w, T)), (max(T - w, 1), T)


def check_positions(early: tuple[int, int], late: tuple[int, int], T: int) -> None:
    a, b = early
    c, d = late
    if not (0 <= a < b <= T and 0 <= c < d <= T and b <= c):
        raise ValueError(
            f"early positions {a}:{b} and late positions {c}:{d} must be ranges inside 0:{T}, early before late"
        )


@dataclass(frozen=True)
class Inputs:
    """Held-out inputs: ``tokens`` and next-token ``targets`` [n, T], the task's ``scored``
    positions, the ICL score's ``early`` and ``late`` positions [a, b), and what they are."""

    tokens: torch.Tensor
    targets: torch.Tensor
    scored: torch.Tensor
    early: tuple[int, int]
    late: tuple[int, int]
    what: str

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for t in (self.tokens, self.targets, self.scored):
            h.update(t.contiguous().numpy().tobytes())
        h.update(repr((self.early, self.late)).encode())
        return h.hexdigest()[:16]

    def describe(self) -> str:
        (a, b), (c, d) = self.early, self.late
        return (
            f"{self.what}; ICL score = mean loss at positions {c}..{d - 1} minus at {a}..{b - 1} "
            f"(of {self.tokens.shape[1]})"
        )


def task_inputs(task: Task, samples: int = 256, seed: int = 0, early=None, late=None) -> Inputs:
    """``samples`` held-out sequences of ``task`` (split test, seed ``seed + SEED_OFFSET``)."""
    batch = task.sample(samples, seed + SEED_OFFSET, split="test")
    e0, l0 = default_positions(task.n_ctx)
    early, late = tuple(early or e0), tuple(late or l0)
    check_positions(early, late, task.n_ctx)
    what = f"{samples} held-out {task.name} sequences (seed {seed})"
    return Inputs(batch.tokens, batch.targets, batch.mask, early, late, what)


def text_inputs(ids: list[int], length: int, samples: int, early=None, late=None) -> Inputs:
    """Up to ``samples`` windows of ``length`` + 1 consecutive tokens of a text (no overlap)."""
    n = min(samples, (len(ids) - 1) // length)
    if n < 1:
        raise ValueError(f"the text has {len(ids)} tokens: too few for one window of {length} + 1 tokens")
    seq = torch.tensor(ids[: n * length + 1], dtype=torch.long)
    tokens = torch.stack([seq[i * length : (i + 1) * length] for i in range(n)])
    targets = torch.stack([seq[i * length + 1 : (i + 1) * length + 1] for i in range(n)])
    e0, l0 = default_positions(length)
    early, late = tuple(early or e0), tuple(late or l0)
    check_positions(early, late, length)
    return Inputs(
        tokens, targets, torch.ones_like(tokens, dtype=torch.bool), early, late, f"{n} windows of {length} text tokens"
    )


@torch.no_grad()
def position_sums(model: Transformer, inputs: Inputs) -> dict[str, torch.Tensor]:
    """The sums :func:`position_losses` divides, float64 on the model's device (its tensor part:
    no data is read): ``loss`` per position [T], ``scored_loss`` and ``scored`` (the scored
    positions' loss and count), per head ``entropy`` and ``floor`` [L, H] (normalized, summed over
    informative rows), ``rows`` [L] (informative rows). One pass over the inputs in chunks."""
    cfg = model.cfg
    n, T = inputs.tokens.shape
    per_seq = cfg.n_layers * cfg.n_heads * T * T * 8 * 3
    chunk = max(1, min(n, WORK_BYTES // per_seq))
    if per_seq > 4 * WORK_BYTES:
        raise LimitError(
            f"one sequence of {T} tokens needs {size_text(per_seq)} for its scores; use shorter windows (--length)"
        )
    names = [act_name(k, l) for l in range(cfg.n_layers) for k in ("attn_scores", "pattern")]
    device = model.embed.W_E.device
    shapes = {"loss": (T,), "scored_loss": (), "scored": (), "rows": (cfg.n_layers,)}
    shapes |= {"entropy": (cfg.n_layers, cfg.n_heads), "floor": (cfg.n_layers, cfg.n_heads)}
    sums = {k: torch.zeros(shape, dtype=torch.float64, device=device) for k, shape in shapes.items()}
    for i in range(0, n, chunk):
        tok = inputs.tokens[i : i + chunk].to(device)
        tgt = inputs.targets[i : i + chunk].to(device)
        s = inputs.scored[i : i + chunk].to(device)
        logits, cache = model.run_with_cache(tok, names_filter=names)
        ce = F.cross_entropy(logits.flatten(0, 1).double(), tgt.flatten(), reduction="none").view(tok.shape)
        sums["loss"] += ce.sum(0)
        sums["scored_loss"] += torch.where(s, ce, 0.0).sum()
        sums["scored"] += s.sum()
        for l in range(cfg.n_layers):
            mask = model.mask(T, cfg.window(l))
            A = cache[act_name("pattern", l)].double()
            ok = M.informative_rows(mask, A.shape)  # [b, H, T]
            sums["entropy"][l] += (M.normalized_entropy(A, mask) * ok).sum((0, 2))
            sums["rows"][l] += ok[:, 0].sum()
            if cfg.entmax_alpha == 1.0:
                fl = bound.normalized_row_floors(cache[act_name("attn_scores", l)], mask)
                sums["floor"][l] += (fl * ok).sum((0, 2))
    return sums


def position_losses(model: Transformer, inputs: Inputs) -> tuple[torch.Tensor, float, dict]:
    """(mean next-token loss per position [T], the loss on scored positions, per-layer means of
    the entropy and its floor [L, H]), on the CPU: :func:`position_sums`, read once."""
    sums = {k: v.cpu() for k, v in position_sums(model, inputs).items()}
    rows = sums["rows"].clamp_min(1)[:, None]
    softmax = model.cfg.entmax_alpha == 1.0
    scored = float(sums["scored"])
    loss = float(sums["scored_loss"]) / scored if scored else math.nan
    concentration = {"entropy_data": sums["entropy"] / rows, "entropy_bound": sums["floor"] / rows if softmax else None}
    return sums["loss"] / inputs.tokens.shape[0], loss, concentration


def k_composition_max(K: torch.Tensor, n_layers: int, n_heads: int) -> torch.Tensor:
    """[n_layers, n_heads]: the largest K-composition score into each head from a head of an
    earlier layer (``K`` [n, n] writer -> reader, NaN where not defined); NaN in layer 0."""
    kmax = torch.full((n_layers, n_heads), math.nan, dtype=K.dtype, device=K.device)
    H = n_heads
    for l in range(1, n_layers):
        kmax[l] = K[: l * H, l * H : (l + 1) * H].nan_to_num(-math.inf).amax(0)
    return kmax


@dataclass
class Measured:
    """One checkpoint's metrics (name -> value or None) and its K-composition matrix [n, n]."""

    values: dict[str, float | None]
    k_composition: list[list[float | None]]


def _head_values(name: str, table: torch.Tensor | None, L: int, H: int, first_layer: int = 0) -> dict:
    values = None if table is None else table.double().cpu().tolist()  # one read of the table
    return {
        str(MetricKey(name, l, h)): (None if values is None else _num(values[l][h]))
        for l in range(first_layer, L)
        for h in range(H)
    }


def _num(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


@torch.no_grad()
def checkpoint_metrics(
    model: Transformer, inputs: Inputs | None, detector_samples: int = 32, seed: int = 0, partial: bool = False
) -> Measured:
    """Every metric of the module doc for one checkpoint; ``partial``: an attention-only one."""
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    forward = not partial and inputs is not None
    out: dict[str, float | None] = {"loss": None, "icl_score": None, "sink_rate": None}
    tables: dict[str, torch.Tensor | None] = {k: None for k in PER_HEAD}
    if forward:
        per_pos, loss, concentration = position_losses(model, inputs)
        (a, b), (c, d) = inputs.early, inputs.late
        out["loss"] = _num(loss)
        out["icl_score"] = _num(per_pos[c:d].mean() - per_pos[a:b].mean())
        tables.update(concentration)
        probes = inputs.tokens[:PROBES, :PROBE_LENGTH]
        found = sinks(model, probes)
        out["sink_rate"], tables["sink_importance"] = _num(found.rate), found.strongest
        both = ranks(model, probes)
        tables["data_rank"], tables["data_stable_rank"] = both.data_rank, both.data_stable_rank
    if not partial:
        det = head_detector_scores(model, n_samples=detector_samples, seed=seed)
        tables["prefix_matching"], tables["previous_token"] = det["induction"], det["previous_token"]
        tables["copying"] = copying_scores(model)
    comp = composition(model)
    K = comp.scores["k"]  # [n, n], writer -> reader, NaN unless the writer's layer is earlier
    if L > 1:
        tables["k_composition_max"] = k_composition_max(K, L, H)
    spec = R.head_spectra(model)
    tables["sigma_max"], tables["stable_rank"] = spec["singular_values"][..., 0], spec["stable_rank"]
    tables["weight_rank"] = variance_rank(spec["singular_values"])
    for name in PER_HEAD:
        if name == "k_composition_max" and L < 2:
            continue
        out.update(_head_values(name, tables[name], L, H, first_layer=1 if name == "k_composition_max" else 0))
    k_rows = [[_num(v) for v in row] for row in K.tolist()]
    return Measured(out, k_rows)
