"""One growth step of one head: the head's scores S and their gradient G on a batch,
the rank-(d_k + p) fit of the descent target S - eta G, the line search on eta, and the wider
models (the grown head and the zero/random baselines). The "Descent target", "The grown head",
"Step size" and "Baselines" sections of :mod:`attn_core.grow`'s docstring derive them."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import pandas as pd
import torch

from attn_core.bilinear import augment, check_heads, check_layer, layer_form
from attn_core.grow.config import BASES
from attn_core.grow.fit import centre_rows, fit_scores, low_rank, scores_of
from attn_core.hooks import act_name
from attn_core.model import Transformer
from attn_core.model.form import QK_PARAMS
from attn_core.tasks import Batch, Task
from attn_core.training.trainer import EVAL_SEED_OFFSET
from attn_core.validate import is_int, is_number

ARMIJO = 0.5  # sufficient decrease: at least half the first-order prediction
# the fitting and line-search batches share no stream with training, evaluation or each other
FIT_SEED_OFFSET = 3 * EVAL_SEED_OFFSET
SEARCH_SEED_OFFSET = 4 * EVAL_SEED_OFFSET


# --- the head's scores and their gradient ----------------------------------------------------------


def check_growable(model: Transformer, layer: int, head: int) -> int:
    """Validate layer/head; returns the head's current d_k."""
    check_layer(model, layer)
    check_heads(model, head)
    if model.cfg.qk != "factored":
        raise ValueError("this model has merged heads (one W_QK per head, any rank): there is no d_k to grow")
    return model.cfg.head_d_qk(layer, head)


def score_offset(layer: int, head: int, offset: torch.Tensor) -> tuple[str, Callable]:
    """A forward hook, for ``Transformer.run_with_hooks``, under which head ``head`` of ``layer``
    computes S + offset (offset [n, T, T]): L(S + offset) is the loss as a function of the scores."""

    def shifted(S: torch.Tensor, name: str) -> torch.Tensor:
        out = S.clone()  # [n, heads, T, T]
        out[:, head] = out[:, head] + offset
        return out

    return act_name("attn_scores", layer), shifted


@dataclass
class HeadBatch:
    """What one head sees on a batch, in float64: X (augmented when the model has biases), its
    scores S = X B' X^T, G = dL/dS and the loss. ``model`` is a private float64 copy."""

    model: Transformer
    task: Task
    batch: Batch
    layer: int
    head: int
    X: torch.Tensor  # [n, T, d']
    S: torch.Tensor  # [n, T, T]
    G: torch.Tensor  # [n, T, T]
    mask: torch.Tensor  # [T, T] bool, True where a key is visible
    loss: float
    augmented: bool

    def loss_with(self, delta_scores: torch.Tensor) -> float:
        """The task loss on the batch when the head's scores are S + delta_scores."""
        hook = score_offset(self.layer, self.head, delta_scores)
        with torch.no_grad():
            return self.task.loss(self.model.run_with_hooks(self.batch.tokens, [hook]), self.batch).item()


def score_gradient(
    model: Transformer, task: Task, batch: Batch, layer: int, head: int
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(loss, G = dL/dS of one head [n, T, T], the forward's cache) on ``batch`` (on the model's
    device): autograd on an offset added to the head's scores (``score_offset``), so G is the
    gradient w.r.t. exactly what the softmax sees. The tensor part of :func:`head_batch`."""
    device = model.embed.W_E.device
    batch = batch.to(device)
    n, T = batch.tokens.shape
    offset = torch.zeros(n, T, T, dtype=model.embed.W_E.dtype, device=device, requires_grad=True)
    cache: dict = {}
    logits = model.run_with_hooks(batch.tokens, [score_offset(layer, head, offset)], cache=cache)
    loss = task.loss(logits, batch)
    (G,) = torch.autograd.grad(loss, offset)
    return loss.detach(), G, cache


def head_batch(model: Transformer, task: Task, batch: Batch, layer: int, head: int) -> HeadBatch:
    """Forward the batch through a float64 copy and take G = dL/dS of one head (:func:`score_gradient`)."""
    check_growable(model, layer, head)
    m = copy.deepcopy(model).double().eval()
    batch = batch.to(m.embed.W_E.device)
    T = batch.tokens.shape[1]
    loss, G, cache = score_gradient(m, task, batch, layer, head)
    for p in m.parameters():
        p.requires_grad_(False)
    X = cache[act_name("attn_in", layer)].detach()
    augmented = model.cfg.attn_bias
    return HeadBatch(
        m,
        task,
        batch,
        layer,
        head,
        augment(X) if augmented else X,
        cache[act_name("attn_scores", layer)][:, head].detach(),
        G,
        m.mask(T, m.cfg.window(layer)),
        loss.item(),
        augmented,
    )


# --- one growth step ---------------------------------------------------------------------------------


@dataclass
class Step:
    """The rank-k fit of the descent target at step size eta and everything measured about it."""

    eta: float
    singular_values: torch.Tensor  # of the target form in the chosen basis, descending
    kept: int  # k = d_k + p
    Z: torch.Tensor  # [d', d'] rank <= k: the grown head's scores are X Z X^T
    q_factor: torch.Tensor  # [d', k] the new W_Q, q_factor k_factor^T / sqrt(k) = Z
    k_factor: torch.Tensor  # [d', k] the new W_K
    delta_scores: torch.Tensor  # [n, T, T], X (Z - B') X^T
    predicted_decrease: float  # -<G, delta_scores>
    discarded_energy: float  # sum of the discarded sigma_i^2
    fit_residual: float  # mean over visible entries of C(T - X Z* X^T)^2
    residual: float  # the same for Z
    truncation_residual: float  # mean of C(X (Z* - Z) X^T)^2

    @property
    def total_energy(self) -> float:
        return float(self.singular_values.pow(2).sum())

    def captured_share(self, d_k: int) -> float:
        """Of the energy beyond the old width (sum_{i > d_k} sigma_i^2), the part the p new
        directions hold: sum_{d_k < i <= k} sigma_i^2 / sum_{i > d_k} sigma_i^2 (1 when none is left)."""
        beyond = float(self.singular_values[d_k:].pow(2).sum())
        # beyond the old width Z* is zero at eta = 0: rounding there is not energy to share
        if beyond <= 1e-20 * self.total_energy:
            return 1.0
        return 1.0 - self.discarded_energy / beyond


class Growth:
    """Growing head ``head`` of ``layer`` by ``add`` = p query/key dimensions on one batch.
    ``step(eta)`` is the rank-(d_k + p) fit of the descent target S - eta G; ``line_search`` picks
    eta on the actual loss; ``grown_model(step)`` builds the wider model."""

    def __init__(
        self,
        model: Transformer,
        task: Task,
        batch: Batch,
        layer: int,
        head: int,
        add: int,
        basis: str = "whitened",
        val_batch: Batch | None = None,
        damping: float = 0.0,
    ):
        d_k = check_growable(model, layer, head)
        if basis not in BASES:
            raise ValueError(f"basis must be one of {BASES}, got {basis!r}")
        d_aug = model.cfg.d_model + model.cfg.attn_bias
        top = d_aug - d_k
        if top < 1:
            raise ValueError(
                f"head {head} of layer {layer} is already {d_k} wide, as wide as its input ({d_aug}): nothing to grow"
            )
        if not is_int(add) or not 1 <= add <= top:
            raise ValueError(f"add (p) must be 1..{top} (d_k = {d_k}, input width {d_aug}), got {add!r}")
        self.source, self.layer, self.head, self.add, self.d_k, self.basis = model, layer, head, add, d_k, basis
        self.kept = d_k + add
        self.hb = hb = head_batch(model, task, batch, layer, head)
        # the line search judges steps on a second batch: the fit has up to d'^2 parameters and
        # follows the fitting batch's own noise when eta is large
        self.val = head_batch(model, task, val_batch, layer, head) if val_batch is not None else None
        self.B = layer_form(hb.model, layer, hb.augmented)[head].dense  # [d', d'], S = X B X^T
        self.fit = fit_scores(hb.X, hb.G, hb.mask, damping=damping)  # D = fit.Z: the least-squares image of G
        self.B_hat = self.fit.q.metric @ self.B @ self.fit.k.metric.T  # B' in whitened coordinates
        self.n_visible = hb.X.shape[0] * int(hb.mask.sum())
        scale = centre_rows(scores_of(hb.X, self.fit.Z), hb.mask).norm()
        # eta_ref moves the (centred) scores by their own size: a scale-free unit for the line search
        self.eta_ref = float(centre_rows(hb.S, hb.mask).norm() / scale) if scale > 0 else 0.0

    @property
    def loss(self) -> float:
        return self.hb.loss

    @property
    def n_rows(self) -> int:
        return self.hb.X.shape[0] * self.hb.X.shape[1]

    def step(self, eta: float) -> Step:
        """Z*(eta) = B' - eta D truncated to rank k = d_k + p in the chosen basis, factored into
        W_Q, W_K for the new scale 1/sqrt(k), with its residuals and predicted decrease."""
        hb, fit, k = self.hb, self.fit, self.kept
        if self.basis == "whitened":
            Y = self.B_hat - eta * fit.Y_full
            left, sigma, right = low_rank(Y, k)
            left, right = fit.q.lift @ left, fit.k.lift @ right
            Z_star = fit.q.lift @ Y @ fit.k.lift.T
        else:
            Z_star = self.B - eta * fit.Z
            left, sigma, right = low_rank(Z_star, k)
        # the model divides by sqrt(k): k^(1/4) on each factor keeps W_Q W_K^T / sqrt(k) = Z
        W_Q, W_K = left * k**0.25, right * k**0.25
        Z = W_Q @ W_K.T / math.sqrt(k)
        target = hb.S - eta * hb.G
        delta = scores_of(hb.X, Z - self.B)

        def mean_sq(A: torch.Tensor) -> float:
            return float(centre_rows(A, hb.mask).pow(2).sum() / self.n_visible)

        return Step(
            eta=eta,
            singular_values=sigma,
            kept=k,
            Z=Z,
            q_factor=W_Q,
            k_factor=W_K,
            delta_scores=delta,
            predicted_decrease=float(-(hb.G * delta).sum()),
            discarded_energy=float(sigma[k:].pow(2).sum()),
            fit_residual=mean_sq(target - scores_of(hb.X, Z_star)),
            residual=mean_sq(target - scores_of(hb.X, Z)),
            truncation_residual=mean_sq(scores_of(hb.X, Z_star - Z)),
        )

    def loss_at(self, step: Step) -> float:
        """The actual loss on the fitting batch with the head's scores replaced by X Z X^T."""
        return self.hb.loss_with(step.delta_scores)

    def val_loss_at(self, step: Step) -> float:
        """The same on the line-search batch (the fitting batch when there is none)."""
        if self.val is None:
            return self.loss_at(step)
        return self.val.loss_with(scores_of(self.val.X, step.Z - self.B))

    def line_search(self, grid: int = 19, top: int = 0) -> tuple[Step, pd.DataFrame]:
        """Line search on a grid: eta = 0 and eta = eta_ref * 2^j, j = top - grid + 1, ..., top.
        A step is admissible when it passes Armijo's test on the fitting batch, measured decrease
        >= ``ARMIJO`` * first-order predicted decrease (beyond that the linear model that chose the
        directions no longer describes the loss); of the admissible steps the one of least actual
        loss on the line-search batch is taken. Returns it and the table (eta, eta / eta_ref,
        loss, measured and predicted decrease on the fitting batch, armijo, val_loss on the
        line-search batch, discarded energy, residual)."""
        if not is_int(grid) or grid < 1:
            raise ValueError(f"grid must be a positive integer, got {grid!r}")
        etas = [0.0] + ([self.eta_ref * 2.0 ** (top - j) for j in range(grid)][::-1] if self.eta_ref > 0 else [])
        rows, best, best_loss = [], None, math.inf
        for eta in etas:
            step = self.step(eta)
            loss = self.loss_at(step)
            val_loss = self.val_loss_at(step)
            measured = self.loss - loss
            armijo = eta == 0 or (step.predicted_decrease > 0 and measured >= ARMIJO * step.predicted_decrease)
            rows.append(
                dict(
                    eta=eta,
                    eta_rel=eta / self.eta_ref if self.eta_ref else 0.0,
                    loss=loss,
                    measured_decrease=measured,
                    predicted_decrease=step.predicted_decrease,
                    armijo=armijo,
                    val_loss=val_loss,
                    discarded_energy=step.discarded_energy,
                    residual=step.residual,
                )
            )
            if armijo and val_loss < best_loss:  # ties keep the smaller step
                best, best_loss = step, val_loss
        return best, pd.DataFrame(rows)

    def grown_model(self, step: Step) -> Transformer:
        """The source model with this head d_k + p wide, holding ``step``'s factors (float32)."""
        return with_head(self.source, self.layer, self.head, step.q_factor, step.k_factor)


# --- wider models -------------------------------------------------------------------------------------


def with_head(model: Transformer, layer: int, head: int, W_Q: torch.Tensor, W_K: torch.Tensor) -> Transformer:
    """A copy of ``model`` whose head has d_qk = W_Q.shape[1] and factors W_Q, W_K ([d', k], the
    last row the biases when the model has them); every other weight is copied, the config updated."""
    cfg = model.cfg
    k = W_Q.shape[1]
    widths = [[cfg.head_d_qk(l, h) for h in range(cfg.n_heads)] for l in range(cfg.n_layers)]
    widths[layer][head] = k
    new = Transformer(replace(cfg, d_qk=widths)).to(model.embed.W_E.device)
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    new.load_state_dict({n: t for n, t in state.items() if n.rsplit(".", 1)[-1] not in QK_PARAMS}, strict=False)
    with torch.no_grad():  # every head's B through the attention module; the grown one's columns padded
        for mine, theirs in zip(new.blocks, model.blocks):
            mine.attn.set_form(theirs.attn.form())
        new.zero_qk_padding()
        attn, d = new.blocks[layer].attn, cfg.d_model
        form = attn.form()
        sides = {"left": W_Q, "right": W_K}
        if form.bias_q is not None:
            sides |= {"bias_q": W_Q[d], "bias_k": W_K[d]}
        changes = {}
        for side, W in sides.items():
            t = getattr(form, side).detach().clone()
            t[head] = 0
            t[head, ..., :k] = (W[:d] if side in ("left", "right") else W).to(t)
            changes[side] = t
        attn.set_form(form.replace(**changes), head)
    return new.eval()


def widen(
    model: Transformer, layer: int, head: int, add: int, init: str = "zero", std: float = 0.02, seed: int = 0
) -> Transformer:
    """The baselines: the head's old columns rescaled by ((d_k + p) / d_k)^(1/4) (so the old scores are
    exactly kept under the new 1/sqrt(d_k + p)) and p new columns of W_Q, W_K (and biases) at zero or
    N(0, std^2) (seeded)."""
    d_k = check_growable(model, layer, head)
    if init not in ("zero", "random"):
        raise ValueError(f"init must be 'zero' or 'random', got {init!r}")
    if not (is_number(std) and std >= 0):
        raise ValueError(f"std must be a finite number >= 0, got {std!r}")
    attn = model.blocks[layer].attn
    k = d_k + add
    rescale = (k / d_k) ** 0.25
    W = {}
    g = torch.Generator().manual_seed(int(seed))
    for name in ("Q", "K"):
        old = getattr(attn, f"W_{name}")[head, :, :d_k].detach()
        if model.cfg.attn_bias:
            old = torch.cat([old, getattr(attn, f"b_{name}")[head, None, :d_k].detach()])
        new = torch.zeros(old.shape[0], add)  # drawn on the CPU (the same columns on every device), then moved
        if init == "random":
            new.normal_(0.0, std, generator=g)
        W[name] = torch.cat([old * rescale, new.to(old)], dim=1)
    return with_head(model, layer, head, W["Q"], W["K"])
