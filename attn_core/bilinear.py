"""The QK bilinear form of every head: B, its spectrum, the views of f_x(y), head detectors.

For one head of layer l (shared/DESIGN.md, row vectors), with X the attention input:

    B  = W_Q W_K^T / sqrt(d_qk)                  factored head, d_model x d_model, rank <= d_qk
    B  = W_QK                                     merged head (seed 004), any rank
    B' = W_Q' W_K'^T / sqrt(d_qk),  W_Q' = [W_Q; b_Q^T]   with biases (seed 001, Remark 1.2.2)
    S  = X' B' X'^T,  X' = [X | 1]                exactly the model's pre-softmax scores

:class:`QKForm` holds B as its factors (``left @ right^T``, the 1/sqrt(d_qk) folded into
``left``) or densely, batched over any leading dims (layers, heads), and computes the spectrum
lazily from a QR of each factor and an SVD of the small r x r core, like TransformerLens'
``FactoredMatrix``: the dense d_model^2 SVD is never taken when rank <= d_qk < d_model.

Views of f_x(y) (each a :class:`View`, a heatmap with a per-query slice ``View.row``):

- sequence: x, y are the rows of X for a real input; equals the model's cached scores;
- vocabulary ("for every x", seed 000): x_t = ln1_l(W_E[t] + mean_p W_pos[p]) for every token t,
  the token as layer l's LayerNorm would see it if nothing else were in the residual stream.
  For layer 0 this is exactly the first layer's input without its position; for l > 0 it is the
  direct (embedding) path through that layer's own LayerNorm and B, not the real residual;
- positional: x_p = ln1_l(W_pos[p] + mean_t W_E[t]) for every position p (causal mask applies).

``vocab_scores`` / ``positional_scores`` / ``head_B`` are differentiable (the regularizers of
issue 4 penalise them); the ``*_view`` functions are for display and run without gradients.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Optional, Sequence, Union

import pandas as pd
import torch

from attn_core import metrics
from attn_core.model import Transformer, attention_weights
from attn_core.hooks import act_name

# Views of more keys than this are cut to the first MAX_VIEW_TOKENS tokens unless the caller
# names its tokens (GPT-2's 50257^2 scores per head would not fit in memory).
MAX_VIEW_TOKENS = 512
DETECTORS = ("previous_token", "induction", "duplicate_token", "self")


# --- validation --------------------------------------------------------------------------------

def check_layer(model: Transformer, layer: int) -> int:
    n = model.cfg.n_layers
    if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < n:
        raise ValueError(f"layer {layer!r} is outside 0..{n - 1} (this model has {n} layer{'s' * (n != 1)})")
    return layer


def check_heads(model: Transformer, heads: Union[None, int, Sequence[int]]) -> list[int]:
    n = model.cfg.n_heads
    if heads is None:
        return list(range(n))
    heads = [heads] if isinstance(heads, int) else list(heads)
    bad = [h for h in heads if not isinstance(h, int) or isinstance(h, bool) or not 0 <= h < n]
    if bad or not heads:
        raise ValueError(f"head {bad[0] if bad else heads!r} is outside 0..{n - 1} (this model has {n} heads per layer)")
    return heads


def check_tokens(model: Transformer, token_ids: Sequence[int], max_len: Optional[int] = None) -> list[int]:
    V = model.cfg.d_vocab
    ids = [int(t) for t in token_ids]
    if not ids:
        raise ValueError("no tokens given")
    bad = [t for t in ids if not 0 <= t < V]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside 0..{V - 1} (the vocabulary has {V} tokens)")
    top = model.cfg.n_ctx if max_len is None else max_len
    if len(ids) > top:
        raise ValueError(f"{len(ids)} tokens exceed the model context of {top}")
    return ids


# --- B per head --------------------------------------------------------------------------------

def augment(x: torch.Tensor) -> torch.Tensor:
    """[x | 1] along the last dim (seed 001, Remark 1.2.2)."""
    return torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)


def has_bias(model: Transformer) -> bool:
    return model.cfg.attn_bias and model.cfg.qk == "factored"


class QKForm:
    """B = left @ right^T (factored) or B itself (dense), batched over leading dims.

    Lazy, cached properties: ``dense``, ``svd``, ``singular_values``, ``eigenvalues``,
    ``eigenvalues_sym``, ``symmetric``/``antisymmetric`` (QKForms), norms, stable and effective
    rank. The factored path (rank cap r < min(m, n)) never forms the m x n matrix for them.
    Gradients flow through every property, except that the QR's gradient is undefined when a
    factor is rank-deficient (the zero-padded columns of grown heads): to penalise a grown
    head, build its form from its own d_qk columns.
    """

    def __init__(self, left: Optional[torch.Tensor] = None, right: Optional[torch.Tensor] = None,
                 dense: Optional[torch.Tensor] = None):
        if (dense is None) == (left is None or right is None):
            raise ValueError("give either dense or both left and right")
        if dense is None and (left.shape[:-2] != right.shape[:-2] or left.shape[-1] != right.shape[-1]):
            raise ValueError(f"factors do not match: left {list(left.shape)}, right {list(right.shape)}")
        self.left, self.right, self._dense = left, right, dense

    # construction ------------------------------------------------------------------------------
    @classmethod
    def from_layer(cls, model: Transformer, layer: int, augmented: bool = False) -> "QKForm":
        """Every head of one layer, batch shape [n_heads]; ``augmented`` gives B' (d_model + 1)."""
        attn = model.blocks[check_layer(model, layer)].attn
        if model.cfg.qk == "merged":
            W = attn.W_QK  # [h, d, d]
            if augmented:  # merged heads have no query/key bias: B' = [[B, 0], [0, 0]]
                W = torch.nn.functional.pad(W, (0, 1, 0, 1))
            return cls(dense=W)
        scale = attn.qk_scale.view(-1, 1, 1)  # [h, 1, 1], 1/sqrt(d_qk) of each head
        W_Q, W_K = attn.W_Q, attn.W_K  # [h, d, w]
        if augmented:
            if model.cfg.attn_bias:
                W_Q = torch.cat([W_Q, attn.b_Q[:, None, :]], dim=1)
                W_K = torch.cat([W_K, attn.b_K[:, None, :]], dim=1)
            else:
                W_Q, W_K = (torch.nn.functional.pad(W, (0, 0, 0, 1)) for W in (W_Q, W_K))
        return cls(left=W_Q * scale, right=W_K)

    @classmethod
    def from_model(cls, model: Transformer, augmented: bool = False) -> "QKForm":
        """Every head of every layer, batch shape [n_layers, n_heads]. Layers whose grown heads
        are wider are matched by zero columns, which change nothing."""
        forms = [cls.from_layer(model, l, augmented) for l in range(model.cfg.n_layers)]
        if forms[0].is_dense:
            return cls(dense=torch.stack([f._dense for f in forms]))
        w = max(f.left.shape[-1] for f in forms)

        def pad(t):
            return torch.nn.functional.pad(t, (0, w - t.shape[-1]))

        return cls(left=torch.stack([pad(f.left) for f in forms]), right=torch.stack([pad(f.right) for f in forms]))

    # shape and access --------------------------------------------------------------------------
    @property
    def is_dense(self) -> bool:
        return self._dense is not None

    @property
    def shape(self) -> torch.Size:
        if self.is_dense:
            return self._dense.shape
        return self.left.shape[:-1] + self.right.shape[-2:-1]

    @property
    def batch_shape(self) -> torch.Size:
        return self.shape[:-2]

    @property
    def rank_cap(self) -> int:
        """An upper bound on the rank: the inner width of the factors, or min(m, n)."""
        m, n = self.shape[-2:]
        return min(m, n) if self.is_dense else min(self.left.shape[-1], m, n)

    @property
    def uses_core(self) -> bool:
        """True when the spectrum comes from the small core (never the dense matrix)."""
        m, n = self.shape[-2:]
        return not self.is_dense and self.left.shape[-1] < min(m, n)

    def __getitem__(self, idx) -> "QKForm":
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) > len(self.batch_shape):
            raise IndexError(f"index {idx} has more dims than the batch shape {list(self.batch_shape)}")
        if self.is_dense:
            return QKForm(dense=self._dense[idx])
        return QKForm(left=self.left[idx], right=self.right[idx])

    @cached_property
    def dense(self) -> torch.Tensor:
        """The matrix itself, [..., m, n]."""
        return self._dense if self.is_dense else self.left @ self.right.transpose(-1, -2)

    def bilinear(self, x: torch.Tensor, y: Optional[torch.Tensor] = None) -> torch.Tensor:
        """f_x(y) = x B y^T for rows x [..., nq, m] and y [..., nk, n] -> [..., nq, nk]; x and y
        broadcast against the batch shape (y defaults to x)."""
        y = x if y is None else y
        if self.is_dense:
            return x @ self._dense @ y.transpose(-1, -2)
        return (x @ self.left) @ (y @ self.right).transpose(-1, -2)

    # spectrum ----------------------------------------------------------------------------------
    @cached_property
    def _qr(self):
        Ql, Rl = torch.linalg.qr(self.left)  # [..., m, r], [..., r, r]
        Qr, Rr = torch.linalg.qr(self.right)
        return Ql, Rl, Qr, Rr

    @cached_property
    def core(self) -> torch.Tensor:
        """R_l R_r^T ([..., r, r]): B = Q_l core Q_r^T with Q_l, Q_r orthonormal columns."""
        _, Rl, _, Rr = self._qr
        return Rl @ Rr.transpose(-1, -2)

    @cached_property
    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(U [..., m, k], S [..., k], Vh [..., k, n]) with B = U diag(S) Vh; k = r on the
        factored path, min(m, n) on the dense one."""
        if not self.uses_core:
            return torch.linalg.svd(self.dense, full_matrices=False)
        Ql, _, Qr, _ = self._qr
        Uc, S, Vhc = torch.linalg.svd(self.core)
        return Ql @ Uc, S, Vhc @ Qr.transpose(-1, -2)

    @cached_property
    def singular_values(self) -> torch.Tensor:
        """Descending, [..., k] (k = r factored: the rest are zero)."""
        if "svd" in self.__dict__:
            return self.svd[1]
        return torch.linalg.svdvals(self.core if self.uses_core else self.dense)

    @cached_property
    def eigenvalues(self) -> torch.Tensor:
        """Complex eigenvalues, by decreasing modulus. Factored: those of the r x r core
        W_K^T W_Q / sqrt(d_qk), which are the nonzero eigenvalues of B (plus zeros)."""
        self._need_square("eigenvalues")
        core = self.right.transpose(-1, -2) @ self.left if self.uses_core else self.dense
        ev = torch.linalg.eigvals(core)
        order = ev.abs().argsort(dim=-1, descending=True)
        return ev.gather(-1, order)

    @cached_property
    def symmetric(self) -> "QKForm":
        """(B + B^T) / 2 = [L | R] [R | L]^T / 2, rank <= 2r."""
        self._need_square("a symmetric part")
        if self.is_dense:
            return QKForm(dense=(self._dense + self._dense.transpose(-1, -2)) / 2)
        return QKForm(left=torch.cat([self.left, self.right], -1), right=torch.cat([self.right, self.left], -1) / 2)

    @cached_property
    def antisymmetric(self) -> "QKForm":
        """(B - B^T) / 2 = [L | R] [R | -L]^T / 2; f_x(x) does not see it."""
        self._need_square("an antisymmetric part")
        if self.is_dense:
            return QKForm(dense=(self._dense - self._dense.transpose(-1, -2)) / 2)
        return QKForm(left=torch.cat([self.left, self.right], -1), right=torch.cat([self.right, -self.left], -1) / 2)

    @cached_property
    def eigenvalues_sym(self) -> torch.Tensor:
        """Real eigenvalues of (B + B^T)/2, descending: the quadratic form x B x^T. Factored
        (2r < m): [L | R] = Q R_F and the eigenvalues of the symmetric core R_F J R_F^T."""
        sym = self.symmetric
        if sym.uses_core:
            F = sym.left  # [..., m, 2r]
            r = self.left.shape[-1]
            Q, RF = torch.linalg.qr(F)
            eye = torch.eye(r, dtype=F.dtype, device=F.device)
            zero = torch.zeros_like(eye)
            J = torch.cat([torch.cat([zero, eye], -1), torch.cat([eye, zero], -1)], -2) / 2
            core = RF @ J @ RF.transpose(-1, -2)
            ev = torch.linalg.eigvalsh((core + core.transpose(-1, -2)) / 2)
        else:
            ev = torch.linalg.eigvalsh(sym.dense)
        return ev.flip(-1)

    def _need_square(self, what: str) -> None:
        m, n = self.shape[-2:]
        if m != n:
            raise ValueError(f"{what} needs a square matrix, this one is {m} x {n}")

    # norms and ranks ---------------------------------------------------------------------------
    @property
    def frobenius_norm(self) -> torch.Tensor:
        return self.singular_values.pow(2).sum(-1).sqrt()

    @property
    def spectral_norm(self) -> torch.Tensor:
        return self.singular_values[..., 0]

    @property
    def nuclear_norm(self) -> torch.Tensor:
        return self.singular_values.sum(-1)

    @property
    def stable_rank(self) -> torch.Tensor:
        """||B||_F^2 / ||B||_2^2 (0 for B = 0)."""
        s = self.singular_values
        top = s[..., 0].pow(2)
        return torch.where(top > 0, s.pow(2).sum(-1) / top.clamp_min(torch.finfo(s.dtype).tiny), torch.zeros_like(top))

    @property
    def effective_rank(self) -> torch.Tensor:
        """exp(H(sigma / sum sigma)) (Roy and Vetterli; 0 for B = 0)."""
        s = self.singular_values
        total = s.sum(-1, keepdim=True)
        p = s / total.clamp_min(torch.finfo(s.dtype).tiny)
        return torch.where(total[..., 0] > 0, metrics.entropy(p).exp(), torch.zeros_like(total[..., 0]))

    def __repr__(self) -> str:
        kind = "dense" if self.is_dense else f"factored r={self.left.shape[-1]}"
        return f"QKForm({kind}, shape={list(self.shape)})"


def layer_B(model: Transformer, layer: int, augmented: bool = False) -> torch.Tensor:
    """Dense B (or B') of every head of a layer, [n_heads, d, d] (differentiable)."""
    return QKForm.from_layer(model, layer, augmented).dense


def head_B(model: Transformer, layer: int, head: int, augmented: bool = False) -> torch.Tensor:
    """Dense B ([d_model, d_model]) or B' ([d_model + 1]^2) of one head (differentiable)."""
    check_heads(model, head)
    return QKForm.from_layer(model, layer, augmented)[head].dense


def spectrum(model: Transformer, augmented: bool = False) -> list[dict]:
    """One record per head: singular values, eigenvalues of the symmetric part, norms, ranks."""
    with torch.no_grad():
        form = QKForm.from_model(model, augmented)
        out = dict(singular_values=form.singular_values, eigenvalues_sym=form.eigenvalues_sym,
                   stable_rank=form.stable_rank, effective_rank=form.effective_rank,
                   spectral_norm=form.spectral_norm, nuclear_norm=form.nuclear_norm,
                   frobenius_norm=form.frobenius_norm, eigenvalues=form.eigenvalues)
    rows = []
    for l in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            row = {"layer": l, "head": h}
            for k, v in out.items():
                v = v[l, h]
                if k == "eigenvalues":
                    row["eigenvalues_real"] = v.real.tolist()
                    row["eigenvalues_imag"] = v.imag.tolist()
                else:
                    row[k] = v.tolist() if v.dim() else float(v)
            row["rank_cap"] = model.cfg.head_d_qk(l, h) if model.cfg.qk == "factored" else model.cfg.d_model
            rows.append(row)
    return rows


def spectrum_frame(model: Transformer, augmented: bool = False) -> pd.DataFrame:
    """Tidy singular values: layer, head, index, singular_value, normalized (sigma / sigma_1)."""
    rows = []
    for rec in spectrum(model, augmented):
        top = rec["singular_values"][0] or 1.0
        for i, s in enumerate(rec["singular_values"]):
            rows.append(dict(layer=rec["layer"], head=rec["head"], index=i, singular_value=s, normalized=s / top))
    return pd.DataFrame(rows)


def eigen_frame(model: Transformer, augmented: bool = False) -> pd.DataFrame:
    """Tidy eigenvalues of B: layer, head, index, real, imag, modulus."""
    rows = []
    for rec in spectrum(model, augmented):
        for i, (re, im) in enumerate(zip(rec["eigenvalues_real"], rec["eigenvalues_imag"])):
            rows.append(dict(layer=rec["layer"], head=rec["head"], index=i, real=re, imag=im,
                             modulus=(re * re + im * im) ** 0.5))
    return pd.DataFrame(rows)


# --- inputs of the views ------------------------------------------------------------------------

def vocab_inputs(model: Transformer, layer: int = 0, tokens: Optional[Sequence[int]] = None) -> torch.Tensor:
    """x_t = ln1_layer(W_E[t] + mean_p W_pos[p]) for every token (or ``tokens``), [V, d_model]."""
    E = model.embed.W_E if tokens is None else model.embed.W_E[torch.as_tensor(list(tokens), dtype=torch.long)]
    if model.cfg.positional == "learned":
        E = E + model.pos_embed.W_pos.mean(0)
    return model.blocks[check_layer(model, layer)].ln1(E)


def positional_inputs(model: Transformer, layer: int = 0) -> torch.Tensor:
    """x_p = ln1_layer(W_pos[p] + mean_t W_E[t]) for every position, [n_ctx, d_model]."""
    if model.cfg.positional != "learned":
        raise ValueError("this model has no position embeddings (positional = 'none'), so it has no positional view")
    return model.blocks[check_layer(model, layer)].ln1(model.pos_embed.W_pos + model.embed.W_E.mean(0))


def _scores(model: Transformer, layer: int, heads, x: torch.Tensor, augmented: Optional[bool]) -> torch.Tensor:
    heads = check_heads(model, heads)
    aug = has_bias(model) if augmented is None else augmented
    form = QKForm.from_layer(model, layer, aug)[heads]
    return form.bilinear(augment(x) if aug else x)


def vocab_scores(model: Transformer, layer: int = 0, heads=None, augmented: Optional[bool] = None,
                 tokens: Optional[Sequence[int]] = None) -> torch.Tensor:
    """f_x(y) for every pair of tokens, [heads, V, V] (differentiable). With biases (the
    default when the model has them) the scores are x' B' y'^T, what the head itself computes."""
    return _scores(model, layer, heads, vocab_inputs(model, layer, tokens), augmented)


def positional_scores(model: Transformer, layer: int = 0, heads=None, augmented: Optional[bool] = None) -> torch.Tensor:
    """f_x(y) for every pair of positions, [heads, n_ctx, n_ctx] (differentiable, no mask)."""
    return _scores(model, layer, heads, positional_inputs(model, layer), augmented)


# --- tokens --------------------------------------------------------------------------------------

def _model_of(m) -> Transformer:
    return m if isinstance(m, Transformer) else m.model


def token_names(m) -> list[str]:
    """Names of every token: the task's, the Hugging Face vocab.json's, else the ids."""
    model = _model_of(m)
    task = getattr(m, "task", None)
    if task is not None and task.d_vocab == model.cfg.d_vocab:
        return list(task.token_names)
    card = getattr(m, "card", None)
    vocab = card.vocab_file if card is not None else None
    if vocab and Path(vocab).is_file():
        index = json.loads(Path(vocab).read_text())
        names = [str(i) for i in range(model.cfg.d_vocab)]
        for word, i in index.items():
            if isinstance(i, int) and 0 <= i < len(names):
                names[i] = word
        return names
    return [str(i) for i in range(model.cfg.d_vocab)]


def encode(m, text: str) -> list[int]:
    """Space-separated tokens: names of the task's vocabulary, or ids / vocabulary entries for a
    model without a task. Raises ValueError naming what is wrong."""
    model = _model_of(m)
    task = getattr(m, "task", None)
    if task is not None and task.d_vocab == model.cfg.d_vocab:
        return task.encode(text)
    words = text.split()
    if not words:
        raise ValueError("no tokens given")
    index = {n: i for i, n in enumerate(token_names(m))}
    ids = []
    for w in words:
        if w in index:
            ids.append(index[w])
        elif w.lstrip("-").isdigit():
            ids.append(int(w))
        else:
            raise ValueError(f"unknown token {w!r}: give token ids 0..{model.cfg.d_vocab - 1} or names of the vocabulary")
    return check_tokens(model, ids)


def sample_tokens(m, seed: int = 0) -> list[int]:
    """The input of one held-out sample of the model's task."""
    task = getattr(m, "task", None)
    if task is None:
        raise ValueError("this model has no task in its card; type tokens or use random tokens instead")
    return task.sample(1, seed=seed, split="test").tokens[0].tolist()


def random_tokens(m, seed: int = 0, length: Optional[int] = None) -> list[int]:
    """Uniform random tokens (seeded), ``length`` defaulting to the context (at most 64)."""
    cfg = _model_of(m).cfg
    length = min(cfg.n_ctx, 64) if length is None else length
    if not 1 <= length <= cfg.n_ctx:
        raise ValueError(f"length {length} is outside 1..{cfg.n_ctx}")
    g = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, cfg.d_vocab, (length,), generator=g).tolist()


# --- views ---------------------------------------------------------------------------------------

@dataclass
class View:
    """Scores S[h, q, k] = f_{x_q}(y_k) and the pattern A of some heads of one layer.

    ``queries``/``keys`` label the rows/columns, ``token_ids`` their tokens (the vocabulary
    view's keys are its queries), ``mask`` says which keys a query sees."""

    kind: str  # "sequence" | "vocabulary" | "positional"
    layer: int
    heads: list[int]
    queries: list[str]
    keys: list[str]
    scores: torch.Tensor  # [len(heads), nq, nk]
    pattern: torch.Tensor  # [len(heads), nq, nk]
    mask: torch.Tensor  # [nq, nk] bool
    token_ids: Optional[list[int]] = None
    meta: dict = field(default_factory=dict)

    def head_index(self, head: int) -> int:
        if head not in self.heads:
            raise ValueError(f"head {head} is not in this view (heads {self.heads})")
        return self.heads.index(head)

    def check_query(self, query: int) -> int:
        n = len(self.queries)
        if not isinstance(query, int) or not -n <= query < n:
            raise ValueError(f"query {query!r} is outside 0..{n - 1} ({n} queries in this {self.kind} view)")
        return query % n

    def row(self, head: int, query: int, sort: bool = False) -> pd.DataFrame:
        """The per-query slice f_x(.) for x = query: one line per visible key (key, label,
        score, prob, rank by score), in key order or sorted by decreasing score."""
        i, q = self.head_index(head), self.check_query(query)
        vis = self.mask[q]
        keys = torch.arange(len(self.keys))[vis]
        s, p = self.scores[i, q][vis], self.pattern[i, q][vis]
        rank = torch.empty_like(keys)
        rank[s.argsort(descending=True)] = torch.arange(len(keys))
        df = pd.DataFrame(dict(key=keys.tolist(), label=[self.keys[k] for k in keys.tolist()],
                               score=s.tolist(), prob=p.tolist(), rank=(rank + 1).tolist()))
        return df.sort_values("rank", kind="stable").reset_index(drop=True) if sort else df

    def frame(self, head: Optional[int] = None) -> pd.DataFrame:
        """Tidy: head, query, key, their labels, score, prob, visible (one line per cell)."""
        heads = self.heads if head is None else [head]
        nq, nk = len(self.queries), len(self.keys)
        parts = []
        for h in heads:
            i = self.head_index(h)
            q, k = torch.meshgrid(torch.arange(nq), torch.arange(nk), indexing="ij")
            parts.append(pd.DataFrame(dict(
                layer=self.layer, head=h, query=q.flatten().tolist(), key=k.flatten().tolist(),
                query_label=[self.queries[j] for j in q.flatten().tolist()],
                key_label=[self.keys[j] for j in k.flatten().tolist()],
                score=self.scores[i].flatten().tolist(), prob=self.pattern[i].flatten().tolist(),
                visible=self.mask.flatten().tolist())))
        return pd.concat(parts, ignore_index=True)

    def concentration(self, k: int = 1) -> dict[str, torch.Tensor]:
        """Every metric of every query row of the pattern, ``{name: [len(heads), nq]}``."""
        return metrics.concentration(self.pattern, self.mask, k=k)

    def concentration_table(self, k: int = 1) -> pd.DataFrame:
        """Per head and metric: mean, min, max over the query rows that see at least two keys."""
        values = self.concentration(k)
        valid = metrics.informative_rows(self.mask, self.pattern.shape)
        rows = []
        for name, v in values.items():
            summary = metrics.summarize(v, valid)
            for i, h in enumerate(self.heads):
                rows.append(dict(layer=self.layer, head=h, metric=name, view=self.kind,
                                 **{s: float(t[i]) for s, t in summary.items()}))
        return pd.DataFrame(rows)


def _layer_input(model: Transformer, tokens: list[int], layer: int) -> torch.Tensor:
    _, cache = model.run_with_cache(torch.tensor([tokens], device=_device(model)))
    return cache[act_name("attn_in", layer)][0]  # [T, d_model]


def _device(model: Transformer) -> torch.device:
    return model.embed.W_E.device


def _finish(model, kind, layer, heads, S, mask, queries, keys, token_ids, meta) -> View:
    A = attention_weights(S, mask, model.cfg.entmax_alpha)
    return View(kind, layer, heads, queries, keys, S.detach().float().cpu(), A.detach().float().cpu(),
                mask.cpu(), token_ids, meta)


def sequence_view(m, tokens: Sequence[int], layer: int = 0, heads=None) -> View:
    """S = X' B' X'^T for a real input (X = the layer's cached attention input) and its
    pattern: the model's own scores, computed through B. Queries/keys are labelled "pos:name"."""
    model = _model_of(m)
    check_layer(model, layer)
    heads = check_heads(model, heads)
    ids = check_tokens(model, tokens)
    with torch.no_grad():
        X = _layer_input(model, ids, layer)
        S = _scores(model, layer, heads, X, None)
    names = token_names(m)
    labels = [f"{p}:{names[t]}" for p, t in enumerate(ids)]
    mask = model.causal[:len(ids), :len(ids)]
    return _finish(model, "sequence", layer, heads, S, mask, labels, labels, ids, {"n_tokens": len(ids)})


def vocabulary_view(m, layer: int = 0, heads=None, tokens: Optional[Sequence[int]] = None) -> View:
    """f_x(y) with x, y every token's embedding (see the module doc); the pattern is the
    softmax of each row over every key. More than MAX_VIEW_TOKENS tokens are cut to the first
    ones unless ``tokens`` names them."""
    model = _model_of(m)
    check_layer(model, layer)
    heads = check_heads(model, heads)
    V = model.cfg.d_vocab
    meta = {"d_vocab": V}
    if tokens is None:
        tokens = list(range(min(V, MAX_VIEW_TOKENS)))
        if V > MAX_VIEW_TOKENS:
            meta["note"] = f"first {MAX_VIEW_TOKENS} of {V} tokens"
    else:
        tokens = check_tokens(model, tokens, max_len=V)
    with torch.no_grad():
        S = vocab_scores(model, layer, heads, tokens=tokens)
    names = token_names(m)
    labels = [names[t] for t in tokens]
    mask = torch.ones(len(tokens), len(tokens), dtype=torch.bool)
    return _finish(model, "vocabulary", layer, heads, S, mask, labels, labels, list(tokens), meta)


def positional_view(m, layer: int = 0, heads=None) -> View:
    """f_x(y) with x, y every position's embedding; causal, as the model sees positions (at
    most the first MAX_VIEW_TOKENS positions)."""
    model = _model_of(m)
    check_layer(model, layer)
    heads = check_heads(model, heads)
    n = min(model.cfg.n_ctx, MAX_VIEW_TOKENS)
    meta = {"n_ctx": model.cfg.n_ctx}
    if model.cfg.n_ctx > n:
        meta["note"] = f"first {n} of {model.cfg.n_ctx} positions"
    with torch.no_grad():
        S = positional_scores(model, layer, heads)[:, :n, :n]
    labels = [f"p{p}" for p in range(n)]
    return _finish(model, "positional", layer, heads, S, model.causal[:n, :n], labels, labels, None, meta)


def concentration_table(m, tokens: Optional[Sequence[int]] = None, k: int = 1) -> pd.DataFrame:
    """Concentration of every head of every layer, on ``tokens`` (a sequence view) and on the
    vocabulary view: layer, head, metric, view, mean, min, max."""
    model = _model_of(m)
    parts = []
    for layer in range(model.cfg.n_layers):
        if tokens is not None:
            parts.append(sequence_view(m, tokens, layer).concentration_table(k))
        parts.append(vocabulary_view(m, layer).concentration_table(k))
    return pd.concat(parts, ignore_index=True)


# --- head detectors ------------------------------------------------------------------------------

def detection_patterns(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """TransformerLens' detection patterns for tokens [b, T], each [b, T, T] (1 where the head
    should attend): previous token (i -> i-1), duplicate token (i -> earlier j with the same
    token), induction (i -> j+1 for earlier j with the same token as i), self (i -> i)."""
    b, T = tokens.shape
    eye = torch.eye(T, dtype=torch.bool)
    strictly_lower = torch.tril(torch.ones(T, T, dtype=torch.bool), -1)
    same = tokens[:, :, None] == tokens[:, None, :]  # [b, T, T]
    duplicate = same & strictly_lower
    induction = torch.zeros_like(duplicate)
    induction[:, :, 1:] = duplicate[:, :, :-1]  # attend to the token after the earlier copy
    induction &= strictly_lower
    previous = torch.zeros(T, T, dtype=torch.bool)
    previous[1:, :-1] = torch.eye(T - 1, dtype=torch.bool)
    return {"previous_token": previous.expand(b, T, T), "induction": induction,
            "duplicate_token": duplicate, "self": eye.expand(b, T, T)}


def detector_inputs(m, n_samples: int = 32, seed: int = 0, length: Optional[int] = None) -> dict[str, torch.Tensor]:
    """Seeded generated inputs from the model's own vocabulary: ``random`` [n, length] uniform
    tokens, ``repeated`` [n, 2 * (length // 2)] a random half (distinct tokens when the
    vocabulary allows) written twice."""
    cfg = _model_of(m).cfg
    length = min(cfg.n_ctx, 64) if length is None else length
    if not 2 <= length <= cfg.n_ctx:
        raise ValueError(f"length {length} is outside 2..{cfg.n_ctx}")
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
    _, cache = model.run_with_cache(tokens.to(_device(model)))
    return torch.stack([cache[act_name("pattern", l)] for l in range(model.cfg.n_layers)], 1).float().cpu()


def head_detector_scores(m, n_samples: int = 32, seed: int = 0, length: Optional[int] = None,
                         rows: str = "supported") -> dict[str, torch.Tensor]:
    """``{detector: [n_layers, n_heads]}``: the attention mass a head puts where the detection
    pattern is 1 (TransformerLens' "mul" score), averaged over samples and query rows.
    ``rows="supported"`` averages over the rows where the pattern has any 1 (so a perfect head
    scores 1); ``rows="all"`` over every row, as TransformerLens does. Previous-token and self
    are measured on random tokens, duplicate-token and induction on repeated ones."""
    if rows not in ("supported", "all"):
        raise ValueError(f"rows must be 'supported' or 'all', got {rows!r}")
    model = _model_of(m)
    inputs = detector_inputs(m, n_samples, seed, length)
    out = {}
    with torch.no_grad():
        for source, names in (("random", ("previous_token", "self")), ("repeated", ("duplicate_token", "induction"))):
            tokens = inputs[source]
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


def head_detectors(m, n_samples: int = 32, seed: int = 0, length: Optional[int] = None,
                   rows: str = "supported") -> pd.DataFrame:
    """Tidy detector scores: layer, head, detector, score."""
    scores = head_detector_scores(m, n_samples, seed, length, rows)
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
