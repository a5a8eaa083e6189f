"""Why a query attends where it does: one score f_x(y) split into the rank-1 terms of B, and
at layer 0 into its token and position parts.

Row vectors (docs/maths.md). For a head with ``B = U diag(sigma) V^T`` (``QKForm.svd()``: u_i the
columns of U, v_i the rows of Vh), and x, y rows of the layer's attention input X,

    x B y^T = sum_i sigma_i (x . u_i)(y . v_i)                                   (1)

term i is how much key y wins for query x along the singular pair i. A factored head has
``rank(B) <= d_qk`` terms, taken from the head's own d_qk columns (grown heads are stored padded
to the widest head); a merged head has d_model. With query/key biases the model computes
``S = (x W_Q + b_Q) . (y W_K + b_K) / sqrt(d_qk) = x' B' y'^T`` (the augmented form), i.e. (1) plus

    bias = (x W_Q . b_K + b_Q . y W_K + b_Q . b_K) / sqrt(d_qk)                 (2)

kept as its own term (its three parts in ``bias_parts``). (1) + (2) is the model's own
pre-softmax score ``S[q, k]`` (``act_name("attn_scores", layer)``); a test checks it to 1e-5.
The sums are taken in float64.

**Rotary heads.** Each key sits at its own offset, so there is no one B to split; the score is
split instead by rotation plane (``_rotary_attribution``): the term of plane c is what the pair
of dims (c, c + r/2), turning at omega_c per position, adds to S, plus one term of the dims that
do not turn. The terms add up to S exactly.

**Soft-capped heads** (Gemma 2: the model's score is ``c tanh(S / c)``). The terms split the
score *before* the cap, S, exactly (it is what the head's form computes; the cap is one more
function of S alone, not of its terms); the capped score is given beside it
(``Attribution.capped``). The cap is increasing, so the keys rank the same before and after it.

**Runner-up.** For the winning key y1 and the runner-up y2 of a query, term by term
``sigma_i (x . u_i)((y1 - y2) . v_i)`` (and the bias difference) add up to the score margin: the
directions with the largest positive differences are those that make y1 win.

**Token and position parts (layer 0, learned positions).** The residual of token j is
``r_j = e_j + p_j`` (``e_j = W_E[t_j]``, ``p_j = W_pos[j]``) and
``X_j = ln1(r_j) = (r_j - mean(r_j)) * w / s_j + b`` with ``s_j = sqrt(var(r_j) + eps)``. Freezing
each token's scale s_j at its value on this input (the usual linearisation of a folded
LayerNorm) makes ``X_j = tok_j + pos_j + b`` exact, with ``tok_j = (e_j - mean e_j) * w / s_j`` and
``pos_j = (p_j - mean p_j) * w / s_j`` (without a LayerNorm, ``tok_j = e_j``, ``pos_j = p_j``, b = 0).
Then, by bilinearity of ``x' B' y'^T`` over ``x' = [x | 1]``,

    S[q, k] = tok_q B tok_k^T + tok_q B pos_k^T + pos_q B tok_k^T + pos_q B pos_k^T + bias

(token-token, token-position, position-token, position-position; the first word is the query's
side), where ``bias`` gathers every term with the LayerNorm bias b or the attention biases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch

from attn_core.bilinear import (
    QKForm,
    check_heads,
    check_layer,
    check_loaded,
    check_tokens,
    layer_form,
    token_names,
    visible_keys,
)
from attn_core.bilinear.checks import check_bilinear, check_model
from attn_core.hooks import act_name
from attn_core.model import Transformer
from attn_core.sources import LoadedModel
from attn_core.validate import check_int

BIAS_PARTS = ("x·b_K", "b_Q·y", "b_Q·b_K")
SPLIT_PARTS = ("token-token", "token-position", "position-token", "position-position", "bias")


@dataclass
class Attribution:
    """The scores of one query against every key it sees, split as in (1) and (2).

    ``keys`` [n] the key positions the query sees (the model's own mask: causal, and the
    layer's sliding window), ``sigma`` [k] the singular values of B,
    ``x_coords`` [k] = x . u_i, ``y_coords`` [n, k] = y . v_i, ``terms`` [n, k] the rank-1
    contributions, ``bias_parts`` [n, 3], ``scores`` [n] = terms.sum(-1) + bias."""

    layer: int
    head: int
    query: int
    keys: list[int]
    token_ids: list[int]
    token_labels: list[str]
    sigma: torch.Tensor
    x_coords: torch.Tensor
    y_coords: torch.Tensor
    terms: torch.Tensor
    bias_parts: torch.Tensor
    meta: dict = field(default_factory=dict)
    # Rotary heads: one term per rotation plane (see the module doc), named here; ``sigma`` then
    # holds each plane's angular frequency omega_c (0 for the offset-free dims).
    term_names: list[str] | None = None
    cap: float | None = None  # the head's soft cap c: the model's score is c tanh(scores / c)

    def term(self, d: int) -> str:
        return self.term_names[d] if self.term_names else f"σ{d + 1}"

    @property
    def bias(self) -> torch.Tensor:
        return self.bias_parts.sum(-1)

    @property
    def scores(self) -> torch.Tensor:
        return self.terms.sum(-1) + self.bias

    @property
    def capped(self) -> torch.Tensor:
        """The model's score after its soft cap, c tanh(S / c) of :attr:`scores` (S itself uncapped)."""
        return self.scores if self.cap is None else self.cap * torch.tanh(self.scores / self.cap)

    def ranking(self) -> list[int]:
        """Indices into ``keys`` by decreasing score."""
        return self.scores.argsort(descending=True).tolist()

    def top(self, n: int | None = None) -> list[int]:
        """Key positions of the ``n`` highest scores (all by default), best first."""
        order = self.ranking()
        return [self.keys[i] for i in (order if n is None else order[:n])]

    def frame(self, top: int | None = None) -> pd.DataFrame:
        """Tidy: key, label, rank, score, term ("σ1".., or "bias"), direction (-1 for the
        bias), sigma, contribution (and capped_score, the model's, for a soft-capped head); keys
        best first."""
        rows = []
        for rank, i in enumerate(self.ranking()[:top] if top else self.ranking(), start=1):
            base = dict(
                layer=self.layer,
                head=self.head,
                query=self.query,
                key=self.keys[i],
                label=self.token_labels[i],
                rank=rank,
                score=float(self.scores[i]),
            )
            if self.cap is not None:
                base["capped_score"] = float(self.capped[i])
            for d in range(self.terms.shape[1]):
                rows.append(
                    dict(
                        base,
                        term=self.term(d),
                        direction=d,
                        sigma=float(self.sigma[d]),
                        contribution=float(self.terms[i, d]),
                    )
                )
            rows.append(dict(base, term="bias", direction=-1, sigma=float("nan"), contribution=float(self.bias[i])))
        return pd.DataFrame(rows)

    def runner_up(self) -> pd.DataFrame:
        """Term by term, winner minus runner-up (direction, sigma, winner, runner_up, difference),
        by decreasing |difference|; the differences add up to the score margin. Empty when the
        query sees one key."""
        order = self.ranking()
        if len(order) < 2:
            return pd.DataFrame(columns=["direction", "term", "sigma", "winner", "runner_up", "difference"])
        w, r = order[0], order[1]
        rows = [
            dict(
                direction=d,
                term=self.term(d),
                sigma=float(self.sigma[d]),
                winner=float(self.terms[w, d]),
                runner_up=float(self.terms[r, d]),
            )
            for d in range(self.terms.shape[1])
        ]
        rows.append(
            dict(
                direction=-1, term="bias", sigma=float("nan"), winner=float(self.bias[w]), runner_up=float(self.bias[r])
            )
        )
        df = pd.DataFrame(rows)
        df["difference"] = df["winner"] - df["runner_up"]
        df = df.reindex(df["difference"].abs().sort_values(ascending=False).index).reset_index(drop=True)
        df.attrs.update(winner=self.keys[w], runner_up=self.keys[r])
        return df


# --- the head's form ----------------------------------------------------------------------------


def head_form(model: Transformer, layer: int, head: int) -> QKForm:
    """B of one head from its own d_qk columns (factored) or W_QK (merged), in float64."""
    model = check_model(model, "head_form")
    form = layer_form(model, check_layer(model, layer))[check_heads(model, head)[0]]
    if form.is_dense:
        return QKForm(dense=form.dense.double())
    w = model.cfg.head_d_qk(layer, head)
    return QKForm(left=form.left[:, :w].double(), right=form.right[:, :w].double())


def bias_terms(model: Transformer, layer: int, head: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(2) split in its parts, [n, 3] for one query row x [d] and key rows y [n, d] (zeros
    without query/key biases)."""
    model = check_model(model, "bias_terms")
    if not (model.cfg.attn_bias and model.cfg.qk == "factored"):
        return torch.zeros(y.shape[0], 3, dtype=torch.float64, device=y.device)
    form = model.blocks[layer].attn.form(head)
    w = model.cfg.head_d_qk(layer, head)
    W_Q, W_K = (t.double() for t in form.factors(own=True))  # [d, w]
    b_Q, b_K = (t[:w].double() for t in form.biases())  # [w]
    scale = w**-0.5
    xb = (x @ W_Q @ b_K).expand(y.shape[0])  # [n]
    by = y @ W_K @ b_Q  # [n]
    bb = (b_Q @ b_K).expand(y.shape[0])
    return torch.stack([xb, by, bb], dim=-1) * scale  # [n, 3]


def _layer_input(model: Transformer, ids: list[int], layer: int) -> torch.Tensor:
    _, cache = model.run_with_cache(torch.tensor([ids], device=model.embed.W_E.device))
    return cache[act_name("attn_in", layer)][0]  # [T, d]


def _check_query(query: int, n: int) -> int:
    return check_int("query", query, 0, n - 1)


def attribute(loaded: LoadedModel, tokens: Sequence[int], layer: int, head: int, query: int) -> Attribution:
    """Split the scores of query position ``query`` against the keys it sees of a real input
    (``tokens``) into the rank-1 terms of B and the bias, per (1) and (2); keys are named by
    ``bilinear.token_names``."""
    loaded = check_loaded(loaded, "attribute")
    model = loaded.model
    ids = check_tokens(model, tokens)
    q = _check_query(query, len(ids))
    keys = visible_keys(model, check_layer(model, layer), len(ids), q)  # the model's own mask (window too)
    if model.cfg.mla:
        return _mla_attribution(loaded, ids, layer, check_heads(model, head)[0], q, keys)
    if model.cfg.positional == "rotary":
        out = _rotary_attribution(loaded, ids, layer, check_heads(model, head)[0], q, keys)
        out.cap = model.cfg.attn_softcap
        return out
    if model.cfg.qk_norm != "none":  # a per-token gain on each side: S is not x B y^T
        check_bilinear(model, "attribute")
    with torch.no_grad():
        form = head_form(model, layer, head)
        U, S, Vh = form.svd()  # [d, k], [k], [k, d]
        X = _layer_input(model, ids, layer).double()  # [T, d]
        x, y = X[q], X[keys]  # [d], [n, d]
        xc = x @ U  # [k]
        yc = y @ Vh.T  # [n, k]
        terms = S * xc * yc  # [n, k]
        bias = bias_terms(model, layer, head, x, y)  # [n, 3]
    names = token_names(loaded)
    return Attribution(
        *_who(layer, head, q, keys, ids, names),
        S.cpu(),
        xc.cpu(),
        yc.cpu(),
        terms.cpu(),
        bias.cpu(),
        meta=dict(query_token=names[ids[q]], rank_cap=len(S)),
        cap=model.cfg.attn_softcap,
    )


def _who(layer: int, head: int, q: int, keys: list[int], ids: list[int], names: list[str]) -> tuple:
    """The first fields of an :class:`Attribution`: layer, head, query, the keys it sees, their ids and labels."""
    return layer, head, q, keys, [ids[k] for k in keys], [names[ids[k]] for k in keys]


def _rotary_attribution(
    loaded: LoadedModel, ids: list[int], layer: int, head: int, q: int, keys: list[int]
) -> Attribution:
    """Rotary heads: each key has its own B(delta), so the score is split by rotation plane.
    With Q~ and K~ the rotated query and keys (biases included, as the hook points hold them),
    S = sum_c (Q~_c K~_c + Q~_{c+r/2} K~_{c+r/2}) / sqrt(d) + Q~[r:] . K~[r:] / sqrt(d): plane
    c turns by omega_c per position (low c: fast, positional; high c: slow, semantic), and the
    offset-free dims past r are one more term. Exact (float64)."""
    model = loaded.model
    cfg = model.cfg
    names_kept = [act_name("q", layer), act_name("k", layer)]
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids], device=model.embed.W_E.device), names_filter=names_kept)
        Qt = cache[names_kept[0]][0, head, q].double()  # [w]
        Kt = cache[names_kept[1]][0, head, keys].double()  # [n, w]
    r, half = cfg.rotary_dims, cfg.rotary_dims // 2
    scale = float(model.blocks[layer].attn.form(head).head_scales())  # the model's own scale
    planes = [[c, c + half] for c in range(half)] + ([list(range(r, cfg.d_head))] if r < cfg.d_head else [])
    terms = torch.stack([(Qt[p] * Kt[:, p]).sum(-1) * scale for p in planes], dim=-1)  # [n, k]
    omega = _omega(model, layer)  # omega_c of each plane
    freqs = torch.cat([omega, torch.zeros_like(omega[:1])])[: len(planes)]
    term_names = [f"plane {c} (ω {w:.3g})" for c, w in enumerate(omega[:half].tolist())] + (
        ["offset-free dims"] if r < cfg.d_head else []
    )
    names = token_names(loaded)
    return Attribution(
        *_who(layer, head, q, keys, ids, names),
        freqs.cpu(),
        torch.stack([Qt[p].norm() for p in planes]).cpu(),
        torch.stack([Kt[:, p].norm(dim=-1) for p in planes], dim=-1).cpu(),
        terms.cpu(),
        torch.zeros(len(keys), 3, dtype=torch.float64, device="cpu"),  # on the CPU, like the rest
        meta=dict(query_token=names[ids[q]], rank_cap=len(planes), split="rotation planes"),
        term_names=term_names,
    )


def _mla_attribution(
    loaded: LoadedModel, ids: list[int], layer: int, head: int, q: int, keys: list[int]
) -> Attribution:
    """MLA heads (attn_core/model/mla.py): S_ij = g_q(i) g_kv(j) x_i B y_j^T + the rotary term, and
    B = U diag(sigma) V^T, so the score splits into one term per singular mode of the absorbed B,
    g_q(i) g_kv(j) sigma_m (x_i u_m)(y_j v_m), and the rotary term s q_R(i) . k_R(j) (the rotated
    query and key parts the hook points hold). Exact (float64)."""
    model = loaded.model
    kept = [act_name("attn_in", layer), act_name("q", layer), act_name("k", layer)]
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids], device=model.embed.W_E.device), names_filter=kept)
        X = cache[kept[0]][0].double()
        form = model.blocks[layer].attn.form(head)
        g_q, g_kv = (g.double() for g in form.gains(X))
        core = form.core()
        U, S, Vh = QKForm(left=core.left.double(), right=core.right.double()).svd()
        n = model.cfg.d_head
        Qr, Kr = cache[kept[1]][0, head, q, n:].double(), cache[kept[2]][0, head, keys, n:].double()
        xc = g_q[q] * (X[q] @ U)  # [k]
        yc = g_kv[keys, None] * (X[keys] @ Vh.T)  # [n, k]
        rope = (Kr @ Qr) * float(form.head_scales())  # [n]
        terms = torch.cat([S * xc * yc, rope[:, None]], dim=-1)
    names = token_names(loaded)
    return Attribution(
        *_who(layer, head, q, keys, ids, names),
        torch.cat([S, S.new_zeros(1)]).cpu(),
        torch.cat([xc, Qr.norm()[None]]).cpu(),
        torch.cat([yc, Kr.norm(dim=-1)[:, None]], dim=-1).cpu(),
        terms.cpu(),
        torch.zeros(len(keys), 3, dtype=torch.float64, device="cpu"),  # on the CPU, like the rest
        meta=dict(query_token=names[ids[q]], rank_cap=len(S), split="singular modes of the absorbed B, rotary term"),
        term_names=[f"σ{i + 1}" for i in range(len(S))] + ["rotary term"],
    )


def _omega(model: Transformer, layer: int) -> torch.Tensor:
    """omega_c of each rotation plane of ``layer`` (zeros in a layer without positions: NoPE)."""
    form = model.blocks[layer].attn.form()
    if form.inv_freq is not None:
        return form.inv_freq.double()
    return torch.zeros(model.cfg.rotary_dims // 2, dtype=torch.float64, device=model.embed.W_E.device)


# --- token / position split at layer 0 ----------------------------------------------------------


def residual_parts(model: Transformer, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tok [T, d], pos [T, d], const [d]) with X = tok + pos + const the layer-0 attention
    input exactly, each token's LayerNorm scale frozen (see the module doc); float64."""
    model = check_model(model, "residual_parts")
    if model.cfg.positional != "learned":
        raise ValueError("the token/position split needs learned position embeddings; this model has none")
    t = torch.as_tensor(ids, dtype=torch.long, device=model.embed.W_E.device)
    e = model.embed.W_E[t].double()  # [T, d]
    p = model.pos_embed.W_pos[: len(ids)].double()  # [T, d]
    ln = model.blocks[0].ln1
    if not hasattr(ln, "w"):
        return e, p, torch.zeros_like(e[0])
    r = e + p
    s = (r.var(-1, unbiased=False, keepdim=True) + ln.eps).sqrt()  # [T, 1], frozen scales
    w = ln.w.double()

    def centred(v: torch.Tensor) -> torch.Tensor:
        return (v - v.mean(-1, keepdim=True)) * w / s

    return centred(e), centred(p), ln.b.double()


def token_position_split(loaded: LoadedModel, tokens: Sequence[int], head: int, query: int) -> pd.DataFrame:
    """At layer 0: per key the query sees (``visible_keys``), the score and its token-token, token-position,
    position-token, position-position and bias parts (columns named by SPLIT_PARTS), which add up
    to the model's own score."""
    loaded = check_loaded(loaded, "token_position_split")
    model = loaded.model
    ids = check_tokens(model, tokens)
    q = _check_query(query, len(ids))
    check_heads(model, head)
    keys = visible_keys(model, 0, len(ids), q)
    with torch.no_grad():
        tok, pos, const = residual_parts(model, ids)
        form = layer_form(model, 0, augmented=True)[head]
        Bp = form.dense.double()  # [d + 1, d + 1], B' (zero last row/column without biases)

        def aug(v: torch.Tensor, one: float) -> torch.Tensor:
            return torch.cat([v, torch.full_like(v[..., :1], one)], dim=-1)

        xs = {"token": aug(tok[q], 0.0), "position": aug(pos[q], 0.0), "const": aug(const, 1.0)}  # [d + 1]
        ys = {
            "token": aug(tok[keys], 0.0),
            "position": aug(pos[keys], 0.0),
            "const": aug(const, 1.0).expand(len(keys), -1),
        }  # [n, d + 1]
        parts = {f"{a}-{b}": ys[b] @ (xs[a] @ Bp) for a in xs for b in ys}  # [n] each
    out = {name: parts[name] for name in SPLIT_PARTS[:4]}
    out["bias"] = sum(v for k, v in parts.items() if "const" in k)
    names = token_names(loaded)
    df = pd.DataFrame({k: v.tolist() for k, v in out.items()})
    df.insert(0, "label", [names[ids[k]] for k in keys])
    df.insert(0, "key", keys)
    df.insert(2, "score", df[list(SPLIT_PARTS)].sum(axis=1))
    return df.assign(layer=0, head=head, query=q)
