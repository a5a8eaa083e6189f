"""Composition between heads (Elhage et al. 2021): how much a later head reads what an earlier
head writes, through its queries (Q), its keys (K) or its values (V).

Row vectors (docs/maths.md). Head A of layer a adds ``r W_OV^A`` to the residual stream
(``W_OV = W_V W_O``, see :mod:`attn_core.circuits.ov`). Head B of a later layer b reads the
residual through ``ln1_b``; with each token's LayerNorm scale frozen (one scalar per token, which
cancels in the normalised scores below) and its bias dropped (a constant), ``ln1_b(r) = r N`` with
``N = P diag(w_b)``, ``P = I - 11^T / d_model`` (``N = I`` without a LayerNorm, or with
``fold_ln=False``). Seen from the residual stream, head B's matrices are therefore

    B~ = N B N^T        (its QK form)        W~_OV^B = N W_OV^B        (its OV map)

If the query reads A's output, ``f = (r W_OV^A) B~ y^T``; if the key does, ``f = x B~ (r W_OV^A)^T
= x (W_OV^A B~^T)^T r^T``; if the value does, B writes ``r W_OV^A W~_OV^B``. The scores are

    C_Q(A, B) = ||W_OV^A B~  ||_F / (||W_OV^A||_F ||B~||_F)
    C_K(A, B) = ||W_OV^A B~^T||_F / (||W_OV^A||_F ||B~||_F)
    C_V(A, B) = ||W_OV^A W~_OV^B||_F / (||W_OV^A||_F ||W~_OV^B||_F)

each in [0, 1] (``||M1 M2||_F <= ||M1||_F ||M2||_F``) and blind to the scale of either matrix. This
is TransformerLens' ``all_composition_scores`` (``OV @ QK``, ``OV @ QK.T``, ``OV @ OV``) on a model
with LayerNorm folded in.

Factored throughout: every matrix is ``L R^T`` with thin factors (W_OV: ``W_V``, ``W_O^T``; B:
``W_Q / sqrt(d_qk)``, ``W_K``; a merged B is ``B I^T``), and with ``K = R1^T L2`` (r1 x r2) and
Gram matrices ``G(X) = X^T X``,

    ||L1 R1^T L2 R2^T||_F^2 = tr(G(L1) K G(R2) K^T),        ||L R^T||_F^2 = sum(G(L) * G(R)),

so only r x r matrices are multiplied (r = d_head or d_qk), never d_model x d_model ones.

**Baseline.** Even unrelated matrices have a positive score: when one of them is random and
rotation invariant, ``E ||M1 M2||_F^2 = ||M1||_F^2 ||M2||_F^2 / d_model``, so about
``1 / sqrt(d_model)`` whatever the ranks (0.125 for d_model = 64). The baseline of a pair is the mean score over ``n_samples`` pairs of random
matrices of the same shapes: their factors are independent standard Gaussian matrices of the
factors' shapes (a dense merged B: a Gaussian d_model x d_model matrix). It depends only on the
shapes, so it is drawn once per shape, from a generator seeded with ``seed`` (deterministic). The
**baseline-corrected** score is the score minus its baseline: above 0, more than chance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attn_core.bilinear import QKForm, check_layer, check_model, vocab_inputs
from attn_core.circuits.ov import positivity
from attn_core.circuits.settings import KINDS, N_SAMPLES
from attn_core.model import Transformer
from attn_core.regularizers import head_label
from attn_core.validate import check_int


@dataclass
class Composition:
    """Composition scores between every pair of heads, ``[n, n]`` with n = n_layers * n_heads in
    ``order`` (L0H0, L0H1, ...): entry [i, j] is from writer head i into reader head j, NaN
    unless i's layer is before j's. ``scores`` and ``baseline`` are keyed by q, k, v."""

    order: list[str]
    layers: list[int]
    scores: dict[str, torch.Tensor]
    baseline: dict[str, torch.Tensor]
    meta: dict = field(default_factory=dict)

    def corrected(self, kind: str) -> torch.Tensor:
        """Score minus its random-matrix baseline, [n, n]."""
        return self.scores[_kind(kind)] - self.baseline[_kind(kind)]

    def values(self, kind: str, corrected: bool = False) -> torch.Tensor:
        return self.corrected(kind) if corrected else self.scores[_kind(kind)]

    def edges(self, kind: str, corrected: bool = True, top: int = 10) -> list[dict]:
        """The ``top`` strongest writer -> reader edges of one kind, strongest first: source,
        target (labels), score, baseline, corrected."""
        kind = _kind(kind)
        c = self.corrected(kind)
        key = c if corrected else self.scores[kind]
        flat = torch.nan_to_num(key, nan=-float("inf")).flatten()
        n = len(self.order)
        out = []
        for idx in flat.argsort(descending=True)[:top].tolist():
            i, j = divmod(idx, n)
            if torch.isnan(key[i, j]):
                break
            out.append(
                dict(
                    kind=kind,
                    source=self.order[i],
                    target=self.order[j],
                    score=float(self.scores[kind][i, j]),
                    baseline=float(self.baseline[kind][i, j]),
                    corrected=float(c[i, j]),
                )
            )
        return out


def _kind(kind: str) -> str:
    k = str(kind).lower()
    if k not in KINDS:
        raise ValueError(f"composition kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return k


# --- factored Frobenius norms -------------------------------------------------------------------


def gram(X: torch.Tensor) -> torch.Tensor:
    """X^T X over the last two dims, [..., r, r]."""
    return X.transpose(-1, -2) @ X


def frobenius_sq(L: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """||L R^T||_F^2 = sum(G(L) * G(R)), [...]."""
    return (gram(L) * gram(R)).sum((-1, -2))


def composition_score(L1: torch.Tensor, R1: torch.Tensor, L2: torch.Tensor, R2: torch.Tensor) -> torch.Tensor:
    """||M1 M2||_F / (||M1||_F ||M2||_F) for M1 = L1 R1^T [a.., d, r1] and M2 = L2 R2^T
    [b.., d, r2], broadcast as [a.., b..] when given ``L1[:, None]`` etc. (0 when one is 0)."""
    K = R1.transpose(-1, -2) @ L2  # [..., r1, r2]
    num = ((gram(L1) @ K @ gram(R2)) * K).sum((-1, -2)).clamp_min(0)
    den = frobenius_sq(L1, R1) * frobenius_sq(L2, R2)
    return torch.where(den > 0, (num / den.clamp_min(torch.finfo(den.dtype).tiny)).sqrt(), torch.zeros_like(den))


# --- the factors of each head -------------------------------------------------------------------


def _reading_map(model: Transformer, layer: int, fold_ln: bool) -> torch.Tensor:
    """N = P diag(w) of ln1 at ``layer``, [d, d] (the identity without a LayerNorm)."""
    d = model.cfg.d_model
    W = model.embed.W_E
    eye = torch.eye(d, dtype=W.dtype, device=W.device)
    ln = getattr(model.blocks[layer], "ln1", None)  # none before attention with post norms
    if not fold_ln or not hasattr(ln, "w"):
        return eye
    return (eye - 1.0 / d) * ln.w[None, :]


def head_factors(model: Transformer, layer: int, fold_ln: bool = True) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Thin factors of every head of a layer, batch [n_heads]: ``ov`` = (W_V, W_O^T) as written
    (the writer's side, [h, d, d_head] each), ``qk`` = (N W_Q / sqrt(d_qk), N W_K) or, merged,
    (N B N^T, I) and ``ov_read`` = (N W_V, W_O^T) as read by this layer (see the module doc)."""
    model = check_model(model, "head_factors")
    attn = model.blocks[layer].attn
    form = attn.form()
    N = _reading_map(model, layer, fold_ln)  # [d, d]
    h = model.cfg.n_heads
    if form.merged:
        eye = torch.eye(model.cfg.d_model, dtype=N.dtype, device=N.device)
        qk = (N @ form.dense @ N.T, eye.expand(h, -1, -1))  # [h, d, d] each
    else:
        W_Q, W_K = form.factors()
        qk = (N @ (W_Q * form.scale.view(-1, 1, 1)), N @ W_K)  # [h, d, w] each
    W_Ot = attn.W_O.transpose(-1, -2)  # [h, d, d_head]
    W_V = attn.per_head("W_V")
    return {"ov": (W_V, W_Ot), "qk": qk, "ov_read": (N @ W_V, W_Ot)}


def _shapes(model: Transformer, layer: int, head: int) -> dict[str, tuple]:
    """Shapes of a head's factors for the baseline: (d, r, dense) per matrix."""
    cfg = model.cfg
    ov = (cfg.d_model, cfg.d_v or cfg.d_head, False)  # MLA's value width is its own
    qk = (cfg.d_model, cfg.d_model, True) if cfg.qk == "merged" else (cfg.d_model, cfg.head_d_qk(layer, head), False)
    return {"ov": ov, "qk": qk}


def _random_factors(shape: tuple, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    d, r, dense = shape
    if dense:
        return torch.randn(n, d, d, generator=g, dtype=torch.float64), torch.eye(d, dtype=torch.float64).expand(n, d, d)
    return torch.randn(n, d, r, generator=g, dtype=torch.float64), torch.randn(
        n, d, r, generator=g, dtype=torch.float64
    )


def baseline_score(kind: str, writer: tuple, reader: tuple, n_samples: int = N_SAMPLES, seed: int = 0) -> float:
    """Mean composition score of ``kind`` over ``n_samples`` random pairs whose factors have the
    shapes ``writer`` (the OV map: (d, r, dense)) and ``reader`` (the QK form for q/k, the OV map
    for v); deterministic for a seed."""
    kind = _kind(kind)
    g = torch.Generator().manual_seed(int(seed))
    L1, R1 = _random_factors(writer, n_samples, g)
    L2, R2 = _random_factors(reader, n_samples, g)
    if kind == "k":
        L2, R2 = R2, L2
    return float(composition_score(L1, R1, L2, R2).mean())


def composition(model: Transformer, fold_ln: bool = True, n_samples: int = N_SAMPLES, seed: int = 0) -> Composition:
    """Q-, K- and V-composition scores from every head into every head of a later layer, with
    their random-matrix baselines (see the module doc)."""
    model = check_model(model, "composition")
    n_samples = check_int("n_samples", n_samples, 1, 100_000)
    seed = check_int("seed", seed)
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    n = L * H
    order = [head_label(l, h) for l in range(L) for h in range(H)]
    scores = {k: torch.full((n, n), float("nan")) for k in KINDS}
    base = {k: torch.full((n, n), float("nan")) for k in KINDS}
    with torch.no_grad():
        factors = [
            {k: tuple(t.double() for t in v) for k, v in head_factors(model, l, fold_ln).items()} for l in range(L)
        ]
        for a in range(L):
            L1, R1 = (t[:, None] for t in factors[a]["ov"])  # [H, 1, d, d_head]
            for b in range(a + 1, L):
                QL, QR = (t[None] for t in factors[b]["qk"])  # [1, H, d, r]
                VL, VR = (t[None] for t in factors[b]["ov_read"])
                block = {
                    "q": composition_score(L1, R1, QL, QR),
                    "k": composition_score(L1, R1, QR, QL),
                    "v": composition_score(L1, R1, VL, VR),
                }  # [H, H] each
                for k in KINDS:
                    scores[k][a * H : (a + 1) * H, b * H : (b + 1) * H] = block[k].float().cpu()
        cache: dict = {}
        for i in range(n):
            a, ha = divmod(i, H)
            for j in range((a + 1) * H, n):
                b, hb = divmod(j, H)
                writer, reader = _shapes(model, a, ha)["ov"], _shapes(model, b, hb)
                for k in KINDS:
                    key = (k, writer, reader["ov" if k == "v" else "qk"])
                    if key not in cache:
                        cache[key] = baseline_score(k, key[1], key[2], n_samples, seed)
                    base[k][i, j] = cache[key]
    return Composition(
        order,
        [l for l in range(L) for _ in range(H)],
        scores,
        base,
        meta=dict(fold_ln=fold_ln, n_samples=n_samples, seed=seed),
    )


def k_composed_positivity(
    model: Transformer, writer: tuple[int, int], layer: int, fold_ln: bool = True
) -> torch.Tensor:
    """QK positivity of every head of ``layer`` with its keys read through the writer head's
    OV map, [n_heads]: the eigenvalue positivity (``circuits.ov.positivity``) of

        M[t, s] = x_t B (e_s W_OV^A N)^T          V x V

    with x_t, e_s the vocabulary rows of the reader's and the writer's layers
    (``bilinear.vocab_inputs``) and N the reader's frozen LayerNorm (module doc); query/key
    biases are left out. For an induction head reading a previous-token head it is near 1: the
    query attends to the key whose *previous* token is its own (Elhage et al. 2021, the
    K-composition term of the induction head's QK circuit)."""
    model = check_model(model, "k_composed_positivity")
    a, ha = writer
    check_layer(model, a)
    check_layer(model, layer)
    if not a < layer:
        raise ValueError(f"the writer's layer {a} must come before the reader's layer {layer}")
    check_int("head", ha, 0, model.cfg.n_heads - 1)
    with torch.no_grad():
        Eq, Ek = vocab_inputs(model, layer), vocab_inputs(model, a)  # [V, d] each
        W = model.blocks[a].attn
        N = _reading_map(model, layer, fold_ln)  # [d, d]
        moved = Ek @ W.per_head("W_V")[ha]  # [V, d_head]
        out_map = W.W_O[ha] @ N  # [d_head, d]: e W_V W_O N = moved @ out_map
        reader = model.blocks[layer].attn.form()
        if reader.merged:
            left = Eq @ reader.dense @ out_map.T  # [h, V, d_head]
            form = QKForm(left=left, right=moved.expand(left.shape[0], *moved.shape))
        else:
            W_Q, W_K = reader.factors()
            left = Eq @ (W_Q * reader.scale.view(-1, 1, 1))  # [h, V, w]
            right = moved @ (out_map @ W_K)  # [h, V, w]
            form = QKForm(left=left, right=right)
        return positivity(form.eigenvalues).float()


def composed_qk_positivities(model: Transformer, comp: Composition | None = None) -> list[dict]:
    """For every head of a layer > 0: its QK positivity read through the earlier head with the
    strongest baseline-corrected K-composition into it (``k_composed_positivity``), one record
    per head (layer, head, writer label, qk_positivity_composed). Induction heads land near 1."""
    model = check_model(model, "composed_qk_positivities")
    comp = comp if comp is not None else composition(model)
    H = model.cfg.n_heads
    K = comp.corrected("k")
    out = []
    for layer in range(1, model.cfg.n_layers):
        cols = K[: layer * H, layer * H : (layer + 1) * H]  # [writers, H]
        for h in range(H):
            w = int(cols[:, h].nan_to_num(-float("inf")).argmax())
            pos = k_composed_positivity(model, divmod(w, H), layer)
            out.append(dict(layer=layer, head=h, writer=comp.order[w], qk_positivity_composed=float(pos[h])))
    return out
