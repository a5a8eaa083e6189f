"""Views of f_x(y): heatmaps of a head's scores and the attention they yield (docs/maths.md).

Each view is a :class:`View` with a per-query slice ``View.row``:

- sequence: x, y are the rows of X for a real input; S and A are read from the model's own
  hook points (``act_name("attn_scores", l)``, ``act_name("pattern", l)``) by ``run_with_cache``,
  so they are the model's pre-softmax scores and pattern by construction;
- vocabulary ("for every x"): x_t = ln1_l(W_E[t] + mean_p W_pos[p]) for every token t
  (ln1_l(W_E[t]) with rotary positions, whose form B(offset) takes the offset between the two),
  the token as layer l's LayerNorm would see it if nothing else were in the residual stream.
  For layer 0 this is exactly the first layer's input without its position; for l > 0 it is the
  direct (embedding) path through that layer's own LayerNorm and B, not the real residual;
- positional: x_p = ln1_l(W_pos[p] + mean_t W_E[t]) for every position p (causal mask applies).

``vocab_scores`` / ``positional_scores`` take the :class:`Transformer` and are differentiable (the
regularizers penalise them); the ``*_view`` functions take the
:class:`~attn_core.sources.LoadedModel` (they name tokens), are for display and run without
gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from attn_core import metrics
from attn_core.bilinear.checks import (
    check_heads,
    check_layer,
    check_loaded,
    check_model,
    check_tokens,
    layer_mask,
)
from attn_core.bilinear.heads import augment, has_bias, layer_form
from attn_core.bilinear.sinks import EPS, check_eps, eligible_keys, key_importance, sink_keys
from attn_core.bilinear.tokens import position_labels, token_names
from attn_core.hooks import act_name
from attn_core.model import Transformer, attention_weights
from attn_core.sources import LoadedModel
from attn_core.validate import integral, is_int, shown

# Views of more keys than this are cut to the first MAX_VIEW_TOKENS tokens unless the caller
# names its tokens (GPT-2's 50257^2 scores per head would not fit in memory).
MAX_VIEW_TOKENS = 512


# --- the inputs and scores of the vocabulary and positional views (differentiable) ---------------


def vocab_inputs(model: Transformer, layer: int = 0, tokens: Sequence[int] | None = None) -> torch.Tensor:
    """x_t = ln1_layer(W_E[t] + mean_p W_pos[p]) for every token (or ``tokens``), [V, d_model]; the
    embedding times the model's ``embed_scale``; without a norm before attention (post norms), the
    sum itself."""
    model = check_model(model, "vocab_inputs")
    W_E = model.embed.W_E
    E = W_E if tokens is None else W_E[torch.as_tensor(list(tokens), dtype=torch.long, device=W_E.device)]
    if model.cfg.embed_scale != 1.0:
        E = E * torch.tensor(model.cfg.embed_scale, dtype=E.dtype, device=E.device)
    if model.cfg.positional == "learned":
        E = E + model.pos_embed.W_pos.mean(0)
    return _ln1(model, layer, E)


def _ln1(model: Transformer, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Layer ``layer``'s norm before attention applied to x (x itself without one: post norms)."""
    block = model.blocks[check_layer(model, layer)]
    return block.ln1(x) if hasattr(block, "ln1") else x


def positional_inputs(model: Transformer, layer: int = 0) -> torch.Tensor:
    """x_p = ln1_layer(W_pos[p] + mean_t W_E[t]) for every position, [n_ctx, d_model]."""
    model = check_model(model, "positional_inputs")
    if model.cfg.positional != "learned":
        raise ValueError("this model has no position embeddings (positional = 'none'), so it has no positional view")
    return _ln1(model, layer, model.pos_embed.W_pos + model.embed.W_E.mean(0))


def _scores(
    model: Transformer, layer: int, heads, x: torch.Tensor, augmented: bool | None, offset: int = 0
) -> torch.Tensor:
    heads = check_heads(model, heads)
    aug = has_bias(model) if augmented is None else augmented
    score = model.blocks[check_layer(model, layer)].attn.form()  # the layer's form: B~, gains, cap
    S = layer_form(model, layer, aug, offset)[heads].bilinear(augment(x) if aug else x)  # checks the offset
    if score.norm != "none":  # S = g_q(x) g_k(y) x B~ y^T: the per-token gains of QK-norm (or of MLA's latents)
        g_q, g_k = score.gains(x)
        S = S * g_q[heads][:, :, None] * g_k[heads][:, None, :]
        if score.cfg.mla:  # MLA's rotary term: + g_q(x) x B_R(offset) y^T
            S = S + score.rope_core(offset)[heads].bilinear(x) * g_q[heads][:, :, None]
    if score.cap is not None:  # the model's own cap
        S = torch.tanh(S / score.cap) * score.cap
    return S


def vocab_scores(
    model: Transformer,
    layer: int = 0,
    heads=None,
    augmented: bool | None = None,
    tokens: Sequence[int] | None = None,
    offset: int = 0,
) -> torch.Tensor:
    """f_x(y) for every pair of tokens, [heads, V, V] (differentiable). With biases (the
    default when the model has them) the scores are x' B' y'^T, what the head itself computes;
    with rotary positions, of a key ``offset`` positions from the query (B(offset))."""
    model = check_model(model, "vocab_scores")
    return _scores(model, layer, heads, vocab_inputs(model, layer, tokens), augmented, offset)


def positional_scores(model: Transformer, layer: int = 0, heads=None, augmented: bool | None = None) -> torch.Tensor:
    """f_x(y) for every pair of positions, [heads, n_ctx, n_ctx] (differentiable, no mask)."""
    model = check_model(model, "positional_scores")
    return _scores(model, layer, heads, positional_inputs(model, layer), augmented)


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
    token_ids: list[int] | None = None
    meta: dict = field(default_factory=dict)

    def head_index(self, head: int) -> int:
        head = integral(head)
        if not is_int(head) or head not in self.heads:  # True is no head 1
            raise ValueError(f"head {shown(head)} is not in this view (heads {self.heads})")
        return self.heads.index(head)

    def check_query(self, query: int) -> int:
        n, query = len(self.queries), integral(query)
        if not is_int(query) or not -n <= query < n:
            raise ValueError(f"query {shown(query)} is outside 0..{n - 1} ({n} queries in this {self.kind} view)")
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
        df = pd.DataFrame(
            dict(
                key=keys.tolist(),
                label=[self.keys[k] for k in keys.tolist()],
                score=s.tolist(),
                prob=p.tolist(),
                rank=(rank + 1).tolist(),
            )
        )
        return df.sort_values("rank", kind="stable").reset_index(drop=True) if sort else df

    def frame(self, head: int | None = None) -> pd.DataFrame:
        """Tidy: head, query, key, their labels, score, prob, visible (one line per cell)."""
        heads = self.heads if head is None else [self.heads[self.head_index(head)]]
        nq, nk = len(self.queries), len(self.keys)
        q, k = np.repeat(np.arange(nq), nk), np.tile(np.arange(nk), nq)  # vectorised: 512^2 cells stay fast
        query_label, key_label = np.asarray(self.queries, dtype=object)[q], np.asarray(self.keys, dtype=object)[k]
        parts = []
        for h in heads:
            i = self.head_index(h)
            parts.append(
                pd.DataFrame(
                    dict(
                        layer=self.layer,
                        head=h,
                        query=q,
                        key=k,
                        query_label=query_label,
                        key_label=key_label,
                        score=self.scores[i].flatten().double().numpy(),
                        prob=self.pattern[i].flatten().double().numpy(),
                        visible=self.mask.flatten().numpy(),
                    )
                )
            )
        return pd.concat(parts, ignore_index=True)

    def sink_keys(self, eps: float = EPS) -> torch.Tensor:
        """[len(heads), nk] bool: each head's sink keys on this view's own input (importance,
        the mean attention a key receives over the queries that see it, above ``eps``, among keys
        that enough queries see: ``bilinear.sinks``)."""
        return sink_keys(key_importance(self.pattern, self.mask), eligible_keys(self.mask), check_eps(eps))

    def concentration(self, k: int = 1, without_sinks: bool = False, eps: float = EPS) -> dict[str, torch.Tensor]:
        """Every metric of every query row of the pattern, ``{name: [len(heads), nq]}``;
        ``without_sinks``: of the rows renormalized without each head's sink keys."""
        exclude = self.sink_keys(eps)[:, None, :] if without_sinks else None
        return metrics.concentration(self.pattern, self.mask, k=k, exclude=exclude)

    def concentration_table(self, k: int = 1, without_sinks: bool = False, eps: float = EPS) -> pd.DataFrame:
        """Per head and metric: mean, min, max over the query rows that see at least two keys;
        ``without_sinks``: measured without each head's sink keys (listed in ``sink_keys``; rows
        left with fewer than two keys are skipped)."""
        values = self.concentration(k, without_sinks, eps)
        mask, extra = self.mask, [{} for _ in self.heads]
        if without_sinks:
            sinks = self.sink_keys(eps)
            _, mask = metrics.drop_keys(self.pattern, self.mask, sinks[:, None, :])
            extra = [{"sink_keys": " ".join(map(str, torch.nonzero(s).flatten().tolist()))} for s in sinks]
        valid = metrics.informative_rows(mask, self.pattern.shape)
        rows = []
        for name, v in values.items():
            summary = metrics.summarize(v, valid)
            for i, h in enumerate(self.heads):
                rows.append(
                    dict(
                        layer=self.layer,
                        head=h,
                        metric=name,
                        view=self.kind,
                        **{s: float(t[i]) for s, t in summary.items()},
                        **extra[i],
                    )
                )
        return pd.DataFrame(rows)


def _view(
    kind: str,
    layer: int,
    heads: list[int],
    S: torch.Tensor,
    A: torch.Tensor,
    mask: torch.Tensor,
    labels: list[str],
    token_ids: list[int] | None,
    meta: dict,
) -> View:
    return View(
        kind,
        layer,
        heads,
        labels,
        labels,
        S.detach().float().cpu(),
        A.detach().float().cpu(),
        mask.cpu(),
        token_ids,
        meta,
    )


def sequence_view(loaded: LoadedModel, tokens: Sequence[int], layer: int = 0, heads=None) -> View:
    """S and A of a real input, read from the model's hook points (``run_with_cache``): the
    model's own scores (equal to X' B' X'^T, X the layer's attention input). Queries/keys are
    labelled "pos:name"."""
    loaded = check_loaded(loaded, "sequence_view")
    model = loaded.model
    check_layer(model, layer)
    heads = check_heads(model, heads)
    ids = check_tokens(model, tokens)
    names = [act_name("attn_scores", layer), act_name("pattern", layer)]
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([ids], device=model.embed.W_E.device), names_filter=names)
    S, A = (cache[n][0, heads] for n in names)  # [len(heads), T, T]
    labels = position_labels(loaded, ids)
    mask = layer_mask(model, layer, len(ids))
    return _view("sequence", layer, heads, S, A, mask, labels, ids, {"n_tokens": len(ids)})


def vocabulary_view(
    loaded: LoadedModel, layer: int = 0, heads=None, tokens: Sequence[int] | None = None, offset: int = 0
) -> View:
    """f_x(y) with x, y every token's embedding (see the module doc); the pattern is the
    softmax of each row over every key. More than MAX_VIEW_TOKENS tokens are cut to the first
    ones unless ``tokens`` names them. With rotary positions, ``offset`` is the key's position
    minus the query's (B(offset); 0: the un-rotated form)."""
    loaded = check_loaded(loaded, "vocabulary_view")
    model = loaded.model
    check_layer(model, layer)
    heads = check_heads(model, heads)
    V = model.cfg.d_vocab
    meta = {"d_vocab": V}
    if model.cfg.positional == "rotary":
        meta["offset"] = offset
    if tokens is None:
        tokens = list(range(min(V, MAX_VIEW_TOKENS)))
        if V > MAX_VIEW_TOKENS:
            meta["note"] = f"first {MAX_VIEW_TOKENS} of {V} tokens"
    else:
        tokens = check_tokens(model, tokens, max_len=V)
    with torch.no_grad():
        S = vocab_scores(model, layer, heads, tokens=tokens, offset=offset)
        mask = torch.ones(len(tokens), len(tokens), dtype=torch.bool, device=S.device)
        A = attention_weights(S, mask, model.cfg.entmax_alpha, _learned_sinks(model, layer, heads))
    names = token_names(loaded)
    return _view("vocabulary", layer, heads, S, A, mask, [names[t] for t in tokens], list(tokens), meta)


def positional_view(loaded: LoadedModel, layer: int = 0, heads=None) -> View:
    """f_x(y) with x, y every position's embedding; masked as the model masks the layer (causal,
    and its sliding window), at most the first MAX_VIEW_TOKENS positions."""
    loaded = check_loaded(loaded, "positional_view")
    model = loaded.model
    check_layer(model, layer)
    heads = check_heads(model, heads)
    n = min(model.cfg.n_ctx, MAX_VIEW_TOKENS)
    meta = {"n_ctx": model.cfg.n_ctx}
    if model.cfg.n_ctx > n:
        meta["note"] = f"first {n} of {model.cfg.n_ctx} positions"
    mask = layer_mask(model, layer, n)
    with torch.no_grad():
        S = positional_scores(model, layer, heads)[:, :n, :n]
        A = attention_weights(S, mask, model.cfg.entmax_alpha, _learned_sinks(model, layer, heads))
    return _view("positional", layer, heads, S, A, mask, [f"p{p}" for p in range(n)], None, meta)


def _learned_sinks(model: Transformer, layer: int, heads: list[int]) -> torch.Tensor | None:
    """The learned sink logits of ``heads`` of ``layer`` (None without): a view's rows keep them."""
    z = model.blocks[layer].attn.form().sink
    return None if z is None else z[heads]


def concentration_table(
    loaded: LoadedModel, tokens: Sequence[int] | None = None, k: int = 1, without_sinks: bool = False, eps: float = EPS
) -> pd.DataFrame:
    """Concentration of every head of every layer, on ``tokens`` (a sequence view) and on the
    vocabulary view: layer, head, metric, view, mean, min, max; ``without_sinks``: without each
    head's sink keys on that view (``View.concentration_table``)."""
    loaded = check_loaded(loaded, "concentration_table")
    model = loaded.model
    parts = []
    for layer in range(model.cfg.n_layers):
        if tokens is not None:
            parts.append(sequence_view(loaded, tokens, layer).concentration_table(k, without_sinks, eps))
        parts.append(vocabulary_view(loaded, layer).concentration_table(k, without_sinks, eps))
    return pd.concat(parts, ignore_index=True)
