"""What a training run measures, and how its metrics are named.

A metric name is either a plain name (``loss``, ``accuracy``, ``entropy_data``) or a per-head
name ``<metric>:L<layer>H<head>`` with an optional index (``sigma:L0H1:3`` is the fourth
singular value of B for layer 0, head 1). :class:`MetricKey` is the one way to build and read
such names: ``str(MetricKey("sigma", 0, 1, 3)) == "sigma:L0H1:3"`` and
``MetricKey.parse("sigma:L0H1:3") == MetricKey("sigma", 0, 1, 3)``.

:func:`measure` is the before/after measurement of a run (its :data:`MEASURE_KEYS` go into the
card through ``card.public``); :func:`telemetry_row` and :func:`spectra_row` are the per-head rows a
live job logs while it trains (the list of names is below).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from attn_core import regularizers as R
from attn_core.card import MEASURE_KEYS
from attn_core.device import autocast, autocast_dtype
from attn_core.model import Transformer
from attn_core.tasks import Task
from attn_core.training.trainer import evaluate
from attn_core.validate import is_int

__all__ = [
    "MEASURE_KEYS",
    "STEP_KEYS",
    "TERM_PREFIX",
    "MetricKey",
    "measure_run",
    "measure_tokens",
    "spectra_row",
    "step_row",
    "pattern_tensor",
    "probe_pattern",
    "probe_patterns",
    "telemetry_row",
    "telemetry_tensors",
    "term_name",
]

_METRIC = re.compile(r"^[a-z_0-9]+$")
_INT = r"(?:0|[1-9]\d*)"  # no leading zeros: one name per key
_NAME = re.compile(rf"^(?P<metric>[a-z_0-9]+)(?::L(?P<layer>{_INT})H(?P<head>{_INT})(?::(?P<index>{_INT}))?)?$")


@dataclass(frozen=True, order=True)
class MetricKey:
    """A metric's name: ``metric``, and for a per-head metric its ``layer`` and ``head``
    (and ``index``, e.g. which singular value)."""

    metric: str
    layer: int | None = None
    head: int | None = None
    index: int | None = None

    def __post_init__(self) -> None:
        if (self.layer is None) != (self.head is None) or (self.index is not None and self.head is None):
            raise ValueError(
                f"a metric key names a layer and a head together (and an index only with them), got {self!r}"
            )
        if not (isinstance(self.metric, str) and _METRIC.match(self.metric)):
            raise ValueError(f"a metric is named with lower-case letters, digits and _, got {self.metric!r}")
        for part in (self.layer, self.head, self.index):
            if part is not None and not (is_int(part) and part >= 0):
                raise ValueError(f"a metric key's layer, head and index are integers >= 0, got {self!r}")

    @property
    def head_label(self) -> str | None:
        """``L<layer>H<head>``, or None for a model-wide metric."""
        return None if self.layer is None else f"L{self.layer}H{self.head}"

    @property
    def per_head(self) -> bool:
        return self.layer is not None

    def __str__(self) -> str:
        name = self.metric if self.layer is None else f"{self.metric}:{self.head_label}"
        return name if self.index is None else f"{name}:{self.index}"

    @classmethod
    def parse(cls, name: str) -> MetricKey:
        """The key a metric name spells; ``ValueError`` for a name no key spells."""
        m = _NAME.match(str(name))
        if m is None:
            raise ValueError(f"{name!r} is not a metric name (metric or metric:L<layer>H<head>[:<index>])")
        ints = {k: (None if m[k] is None else int(m[k])) for k in ("layer", "head", "index")}
        return cls(m["metric"], **ints)

    @classmethod
    def of_head(cls, metric: str, head_label: str, index: int | None = None) -> MetricKey:
        """The key of ``metric`` for a head named by its label (``"L1H2"``); ``ValueError`` for a
        label that names no head."""
        key = cls.try_parse(f"{metric}:{head_label}")
        if key is None or key.index is not None:
            raise ValueError(f"{head_label!r} does not name a head (heads look like L0H1)")
        return cls(metric, key.layer, key.head, index)

    @classmethod
    def try_parse(cls, name: str) -> MetricKey | None:
        """:meth:`parse`, or None where ``name`` is not a metric name."""
        try:
            return cls.parse(name)
        except ValueError:
            return None


# --- what a run measures --------------------------------------------------------------------------
#
# The metric log of a run (Snapshot.metrics() and RunStore.metrics(): columns step, name, value):
#   every step        loss, task_loss, accuracy (training batch), grad_norm, lr, term:<label>
#                     (lambda * R of each regularizer, see regularizers.RegSpec.label)
#   every eval_every  eval_accuracy, eval_loss (held-out samples)
#   every telemetry_every (on a fixed held-out probe batch)
#                     entropy_data:L<l>H<h>, top1_data:L<l>H<h> per head,
#                     entropy_data, top1_data: means over the regularized heads
#   every spectrum_every
#                     sigma:L<l>H<h>:<i> (singular values of B), stable_rank:L<l>H<h>; rotary models:
#                     sigma1_offset_min/mean/max:L<l>H<h>, sigma_1(B(delta)) over the offsets, of the
#                     heads that matter (offsets_row)
# Telemetry and spectra are also taken at step 0 (before the first update). The vocabulary view's
# entropy (a V x V view per head, nothing a live page draws) is measured before and after only.
# The probe pattern of one head is computed only while someone watches it (TrainingJob.watch).

# The before/after measurement of a run on text reads held-out tokens in proportion to what the run
# trains on: MEASURE_SHARE of steps x batch x block, at least MIN_MEASURE_TOKENS and one batch (and
# at most measure_samples blocks). Each measurement then costs a few percent of the run, where a
# fixed 512 blocks cost a 100-step run about 40% of its time.
MEASURE_SHARE = 1 / 16
MIN_MEASURE_TOKENS = 1024


def measure_tokens(train_cfg, task) -> int | None:
    """Held-out tokens of the before/after measurement of a run of ``train_cfg`` (a TrainConfig)
    on ``task`` (:data:`MEASURE_SHARE`); None for a task without held-out text (its ``block``)."""
    block = getattr(task, "block", None)
    if block is None:
        return None
    batch = train_cfg.batch_size * block
    return max(MIN_MEASURE_TOKENS, batch, math.ceil(MEASURE_SHARE * train_cfg.steps * batch))


# What Trainer.step reports besides its penalty terms; every other key is a term, logged as term:<label>.
# Vocabulary-view telemetry (a V x V view per head) is taken up to this many tokens (as the vocab_*
# regularizers, ``regularizers.build_penalty``); an imported model's 50k-token vocabulary is left out.
VOCAB_VIEW_MAX = 4096
STEP_KEYS = frozenset({"step", "loss", "task_loss", "accuracy", "grad_norm", "lr", "eval_accuracy", "eval_loss"})
TERM_PREFIX = "term:"


def term_name(label: str) -> str:
    """The logged name of a penalty term (``term:entropy@L1H2``; labels are not metric keys)."""
    return TERM_PREFIX + label


def step_row(metrics: dict) -> dict:
    """A Trainer step's metrics under their logged names (without ``step``)."""
    return {(k if k in STEP_KEYS else TERM_PREFIX + k): v for k, v in metrics.items() if k != "step"}


def _mean(values: list[float]) -> float:
    good = [v for v in values if math.isfinite(v)]
    return sum(good) / len(good) if good else math.nan


@torch.no_grad()
def measure_run(
    model: Transformer,
    task: Task,
    heads=None,
    samples: int = 512,
    seed: int = 0,
    tokens: int | None = None,
    precision: str = "fp32",
) -> dict:
    """Accuracy and loss on held-out samples, and concentration means over ``heads`` (a
    selection, see ``regularizers.parse_heads``; None = every head): ``entropy_data`` (normalized
    entropy of attention rows on those samples), ``entropy_vocab`` (same on the vocabulary view),
    ``top1_mass`` (mean largest attention weight on data), ``stable_rank`` of B; ``per_head``
    holds each head's values and singular values. A task with its own ``measure`` (text:
    ``attn_core.text.TextTask``, held-out text in chunks, at most ``tokens`` of it, at the run's
    ``precision``) measures itself."""
    if getattr(task, "measure", None) is not None:
        return task.measure(model, heads, samples, seed, tokens=tokens, precision=precision)
    heads = R.parse_heads(heads, model.cfg)
    cache = R.qk_cache(model, heads)
    ev = evaluate(model, task, samples, seed, cache=cache)
    data = _host(R.data_concentration(model, cache, heads))
    vocab = _host(R.vocab_concentration(model, heads))
    return run_measurement(model, heads, {**ev, "samples": samples}, data, vocab)


def run_measurement(model: Transformer, heads, ev: dict, data: dict, vocab: dict | None) -> dict:
    """A measurement from its parts: ``ev`` (accuracy, loss, samples), the per-head data
    concentration ``data`` and vocabulary-view ``vocab`` (``entropy``/``top1``, [n_layers,
    n_heads] on the CPU; ``vocab`` None leaves the vocabulary view out) of the resolved ``heads``,
    and the spectrum of B, read here."""
    spec = R.head_spectra(model)
    per_head = [
        {
            "head": R.head_label(l, h),
            "layer": l,
            "index": h,
            "entropy_data": float(data["entropy"][l, h]),
            "top1_data": float(data["top1"][l, h]),
            **(
                {"entropy_vocab": float(vocab["entropy"][l, h]), "top1_vocab": float(vocab["top1"][l, h])}
                if vocab is not None
                else {}
            ),
            "stable_rank": float(spec["stable_rank"][l, h]),
            "singular_values": spec["singular_values"][l, h].tolist(),
        }
        for l, h in heads
    ]
    means = {
        "entropy_data": _mean([r["entropy_data"] for r in per_head]),
        "entropy_vocab": _mean([r["entropy_vocab"] for r in per_head]) if vocab is not None else None,
        "top1_mass": _mean([r["top1_data"] for r in per_head]),
        "stable_rank": _mean([r["stable_rank"] for r in per_head]),
    }
    return {
        "accuracy": ev["accuracy"],
        "loss": ev["loss"],
        **{k: v for k, v in means.items() if v is not None},
        "samples": ev["samples"],
        "per_head": per_head,
    }


def _host(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-head summaries on the CPU, in one copy (item by item would wait on the GPU for each)."""
    both = torch.stack(list(values.values())).cpu()
    return dict(zip(values, both))


@torch.no_grad()
def telemetry_tensors(model: Transformer, probe_tokens: torch.Tensor, precision: str = "fp32") -> torch.Tensor:
    """The tensor part of :func:`telemetry_row`, on the model's device: ``entropy_data`` and
    ``top1_data`` of every head on the probe batch, stacked [2, n_layers, n_heads]; the forward
    (at the run's ``precision``) keeps only Q and K, so no layer forms its T x T pattern."""
    cache = R.qk_cache(model)
    with autocast(probe_tokens.device, autocast_dtype(precision)):
        model(probe_tokens, cache=cache)
    data = R.data_concentration(model, cache)
    return torch.stack([data["entropy"], data["top1"]])


def telemetry_row(model: Transformer, probe_tokens: torch.Tensor, heads, precision: str = "fp32") -> dict:
    """Attention concentration of every head on the probe batch (``entropy_data:L<l>H<h>``,
    ``top1_data:...``) and the means over ``heads`` (the regularized ones), read in one copy."""
    cfg = model.cfg
    H_data, top1 = telemetry_tensors(model, probe_tokens, precision).cpu().tolist()
    row: dict = {}
    for l in range(cfg.n_layers):
        for h in range(cfg.n_heads):
            row[str(MetricKey("entropy_data", l, h))] = H_data[l][h]
            row[str(MetricKey("top1_data", l, h))] = top1[l][h]
    row["entropy_data"] = _mean([H_data[l][h] for l, h in heads])
    row["top1_data"] = _mean([top1[l][h] for l, h in heads])
    return row


@torch.no_grad()
def pattern_tensor(model: Transformer, tokens: torch.Tensor, layer: int, head: int | None = None) -> torch.Tensor:
    """The attention pattern of one sequence ``tokens`` [T] in ``layer``: of ``head`` [T, T], or of
    every head of the layer [n_heads, T, T] (``head`` None), float32 on the model's device, from
    the layer's Q and K (the forward forms no other pattern)."""
    from attn_core.bilinear.queries_keys import layer_qk
    from attn_core.model import attention_weights
    from attn_core.regularizers.summaries import layer_sinks

    cfg = model.cfg
    heads = list(range(cfg.n_heads)) if head is None else [head]
    cache = R.qk_cache(model, [(layer, h) for h in heads])
    model(tokens[None], cache=cache)
    qk = layer_qk(model, cache, layer, heads)
    q, scale = qk.folded()
    S = (q * scale) @ qk.k.transpose(-1, -2)
    if cfg.attn_softcap is not None:  # the model's own scores: capped
        S = torch.tanh(S / cfg.attn_softcap) * cfg.attn_softcap
    mask, sink = model.mask(tokens.shape[-1], cfg.window(layer)), layer_sinks(model, layer, heads)
    A = attention_weights(S.float(), mask, cfg.entmax_alpha, None if sink is None else sink.float())[0]
    return A if head is None else A[0]


def probe_pattern(model: Transformer, tokens: torch.Tensor, layer: int, head: int):
    """:func:`pattern_tensor` of one head as a numpy array on the host (what a watched job shows)."""
    return pattern_tensor(model, tokens, layer, head).cpu().numpy()


def probe_patterns(model: Transformer, tokens: torch.Tensor):
    """Every head's pattern of one sequence, [n_layers, n_heads, T, T] numpy (a job's preview)."""
    return torch.stack([pattern_tensor(model, tokens, l) for l in range(model.cfg.n_layers)]).cpu().numpy()


LIVE_OFFSET_HEADS = 32  # rotary heads whose sigma_1(B(delta)) a live job logs (the ones that matter first)


def offsets_row(model: Transformer, heads) -> dict:
    """For rotary models, sigma_1(B(delta)) over the offsets of each of ``heads`` (at most
    :data:`LIVE_OFFSET_HEADS`, in the order given): ``sigma1_offset_min:L<l>H<h>``,
    ``sigma1_offset_mean:...`` and ``sigma1_offset_max:...`` (``bilinear.offsets.sigma1_summaries``:
    one batched spectrum, one read); empty for other models."""
    from attn_core.bilinear.offsets import sigma1_summaries

    if model.cfg.positional != "rotary" or model.cfg.qk != "factored":
        return {}
    heads = list(dict.fromkeys(tuple(lh) for lh in heads))[:LIVE_OFFSET_HEADS]
    row: dict = {}
    for (l, h), summary in zip(heads, sigma1_summaries(model, heads)):
        for part in ("min", "mean", "max"):
            row[str(MetricKey(f"sigma1_offset_{part}", l, h))] = summary[f"sigma1_{part}"]
    return row


def spectra_row(spectrum: dict) -> dict:
    """``sigma:L<l>H<h>:<i>`` and ``stable_rank:L<l>H<h>`` of every head, from
    :func:`attn_core.regularizers.head_spectra` (tensors [n_layers, n_heads, r] and [n_layers, n_heads])."""
    sigma, stable = spectrum["singular_values"].tolist(), spectrum["stable_rank"].tolist()
    row: dict = {}
    for l, per_layer in enumerate(sigma):
        for h, values in enumerate(per_layer):
            for i, s in enumerate(values):
                row[str(MetricKey("sigma", l, h, i))] = s
            row[str(MetricKey("stable_rank", l, h))] = stable[l][h]
    return row
