"""What a retrain trains, and what keeps it near where it started: ``--train`` and ``--kl``.

``--train`` chooses the parameters that learn (the others are frozen: ``requires_grad`` off, so
they get no gradient and, through ``training.trainer.make_optimizer``, no optimizer state):

    all    every parameter (except those a model family keeps at zero, see ``fixed`` below)
    attn   every attention weight of every layer: W_Q, W_K, W_V, W_O and their biases
    qk     only W_Q, W_K and their biases (W_QK of merged heads) in the layers that carry a
           regularizer: the bilinear form B itself. With grouped-query attention a key head's
           W_K is shared by the query heads of its group, so training it for one regularized
           head moves the scores of the other heads of the group too.

``fixed`` names parameters held at zero whatever ``--train`` says: an imported family has no
such tensor (Llama's MLP biases, GPT-2's unembedding bias), so a retrained model can still be
written back as its own family (``attn_core.hf.family_export.fixed_params``).

``--kl LAMBDA`` adds ``LAMBDA * KL(p_start || p_model)`` on the training batch itself:
:class:`KLPenalty`, a Trainer penalty like the regularizers, which reads the model's last
residual stream from the forward's cache (no second forward of the model being trained) and runs
the frozen starting model on the same tokens. The starting model shares every frozen
parameter with the model (no copy) and holds its own copy of the trainable ones.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch

from attn_core.device import autocast_args, autocast_dtype
from attn_core.hooks import Cache, act_name
from attn_core.model import Transformer
from attn_core.model.form import QK_PARAMS
from attn_core.training.config import TRAIN

ATTN_PARAMS = QK_PARAMS + ("W_V", "b_V", "W_O", "b_O", "W_DKV", "W_UV")  # MLA's latent and values too
KL_TERM = "kl"  # the term's label (logged as term:kl)


def regularized_layers(penalty) -> set[int]:
    """The layers of every spec's heads (those at lambda = 0 included, so that a sweep's baseline
    trains what its trials train); every layer when no spec is given."""
    layers = {l for heads in penalty.heads.values() for l, _ in heads}
    return layers or {l for l, _ in penalty.regularized_heads}


def select_trainable(model: Transformer, train: str, layers: set[int], fixed=()) -> list[str]:
    """Switch ``requires_grad`` so that only what ``train`` names learns (module doc); returns
    the names of the parameters that do. Raises ValueError when nothing would."""
    if train not in TRAIN:
        raise ValueError(f"--train must be one of {', '.join(TRAIN)}, got {train!r}")
    fixed = set(fixed)
    trained = []
    for name, p in model.named_parameters():
        parts = name.split(".")
        in_attn = len(parts) > 3 and parts[0] == "blocks" and parts[2] == "attn"
        if name in fixed:
            on = False
        elif train == "all":
            on = True
        elif train == "attn":
            on = in_attn and parts[-1] in ATTN_PARAMS
        else:
            on = in_attn and parts[-1] in QK_PARAMS and int(parts[1]) in layers
        p.requires_grad_(on)
        if on:
            trained.append(name)
    if not trained:
        raise ValueError(f"--train {train} leaves nothing to train in this model")
    return trained


def frozen_copy(model: Transformer, entmax_alpha: float | None = None) -> Transformer:
    """The model as it is now, frozen: frozen parameters shared (same storage), trainable ones
    copied; ``entmax_alpha`` its attention (default the model's)."""
    cfg = model.cfg if entmax_alpha is None else replace(model.cfg, entmax_alpha=float(entmax_alpha))
    device = next(model.parameters()).device
    with torch.device("meta"):
        ref = Transformer(cfg)
    state = {n: p.detach() if not p.requires_grad else p.detach().clone() for n, p in model.named_parameters()}
    ref.load_state_dict(state, assign=True)
    for block in ref.blocks:
        block.attn.reset_buffers()
    return ref.to(device).requires_grad_(False).eval()


class KLPenalty:
    """A Trainer penalty: ``{"kl": strength * KL(p_start || p_model)}``, the KL divergence per
    token (nats) from the starting model's next-token distribution to the model's, on the
    training batch. It reads the model's last residual stream from the forward's cache
    (:meth:`cache` asks for it alone, so every layer keeps its fused attention). The starting
    model is taken by :meth:`start` once the model is on its training device (the job calls it),
    else at the first call, which the trainer makes before its first update."""

    def __init__(self, strength: float, cfg, precision: str = "fp32", entmax_alpha: float | None = None):
        self.strength = float(strength)
        self.autocast = autocast_dtype(precision)
        self.entmax_alpha = entmax_alpha
        self.reads = (act_name("resid_post", cfg.n_layers - 1),)
        self.reference: Transformer | None = None
        self._amp: tuple | None = None  # (device type, dtype) of the reference's autocast, from start()

    def cache(self) -> Cache:
        """The forward cache it reads: the last block's residual stream."""
        return Cache(self.reads)

    def start(self, model: Transformer) -> None:
        """Take ``model``'s weights now as the starting model (frozen ones shared, not copied),
        and its device's autocast (asked here, outside a compiled step: it is not traceable)."""
        self.reference = frozen_copy(model, self.entmax_alpha)
        self._amp = autocast_args(next(model.parameters()).device, self.autocast)

    def __call__(self, model: Transformer, batch, cache: dict | None) -> dict[str, torch.Tensor]:
        if self.reference is None:
            self.start(model)
        (name,) = self.reads
        if cache is None or name not in cache:
            raise ValueError(f"the KL term reads {name} from the forward's cache; the trainer passed none")
        resid = cache[name]
        amp = contextlib.nullcontext() if self._amp is None else torch.autocast(self._amp[0], dtype=self._amp[1])
        with torch.no_grad(), amp:
            ref_logp = log_softmax_(self.reference(batch.tokens).float())  # its logits' storage
        logits = torch.addmm(model.unembed.b_U, model.ln_final(resid).flatten(0, -2), model.unembed.W_U)
        return {KL_TERM: self.strength * mean_kl(logits, ref_logp.flatten(0, -2))}


ROWS_BYTES = 2**24  # float32 bytes of one chunk of rows in mean_kl (its temporaries)


@torch.no_grad()
def log_softmax_(logits: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits, -1)`` written into ``logits`` (no second tensor of its size)."""
    return logits.sub_(logits.logsumexp(-1, keepdim=True))


class _MeanKL(torch.autograd.Function):
    """Mean over rows of KL(p || softmax(z)) for logits ``z`` [N, V] and log-probabilities
    ``log_p`` [N, V], read in chunks of rows: it keeps only its inputs for backward and makes its
    gradient, (softmax(z) - p) / N, chunk by chunk into one tensor, where autograd through
    log_softmax and kl_div would keep several tensors of the logits' size."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(z, log_p)
        parts = []
        for rows in _chunks(z):
            zc, lp = _wide(z[rows]), _wide(log_p[rows])
            parts.append((lp.exp() * (lp - zc + zc.logsumexp(-1, keepdim=True))).sum())
        return torch.stack(parts).sum() / z.shape[0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        z, log_p = ctx.saved_tensors
        out = torch.empty_like(z)
        scale = grad / z.shape[0]
        for rows in _chunks(z):
            out[rows] = ((_wide(z[rows]).softmax(-1) - _wide(log_p[rows]).exp()) * scale).to(z.dtype)
        return out, None


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 at least (bf16 logits are summed in float32; float64 stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _chunks(z: torch.Tensor) -> list[slice]:
    step = max(1, ROWS_BYTES // (4 * z.shape[-1]))
    return [slice(lo, lo + step) for lo in range(0, z.shape[0], step)]


def mean_kl(logits: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """Mean over the rows of ``logits`` [N, V] of KL(p || softmax(logits)) in nats, with
    ``log_p`` [N, V] the log-probabilities of p (no gradient flows to them); see :class:`_MeanKL`."""
    return _MeanKL.apply(logits, log_p.detach())


class Penalties:
    """Several Trainer penalties as one: their terms side by side (labels must differ), and one
    forward cache holding what each reads (:meth:`cache`)."""

    def __init__(self, *parts):
        self.parts = [p for p in parts if p]

    def __bool__(self) -> bool:
        return bool(self.parts)

    def cache(self) -> dict | None:
        """The union of the parts' caches (a part without ``cache()`` reads everything: a plain dict)."""
        names: set[str] = set()
        for part in self.parts:
            make = getattr(part, "cache", None)
            made = make() if make is not None else {}
            if made is None:
                continue
            if not isinstance(made, Cache):
                return {}
            names |= made.names
        return Cache(names) if names else None

    def start(self, model: Transformer) -> None:
        for part in self.parts:
            if hasattr(part, "start"):
                part.start(model)

    def __call__(self, model, batch, cache) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for part in self.parts:
            out.update(part(model, batch, cache))
        return out


def setup(model: Transformer, train: str, kl: float, penalty, precision: str = "fp32", fixed=(), entmax_alpha=None):
    """Freeze what ``train`` leaves out (:func:`select_trainable`) and return the Trainer's penalty:
    ``penalty`` (the regularizers) with the KL term when ``kl`` > 0, or None when there is no
    term at all; also the names of the trained parameters. Call the penalty's ``start(model)``
    (when it has one) once the model is on its training device."""
    trained = select_trainable(model, train, regularized_layers(penalty), fixed)
    if kl <= 0:
        return (penalty if penalty else None), trained
    kl_term = KLPenalty(kl, model.cfg, precision, entmax_alpha)
    return (Penalties(penalty, kl_term) if penalty else kl_term), trained
