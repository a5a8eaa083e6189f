"""The singular-mode split of a few of one query's scores on a long input, from the layer's kept
Q and K (``bilinear.blocked.LayerQK``): the same :class:`~attn_core.circuits.attribution.Attribution`
as :func:`~attn_core.circuits.attribution.attribute` gives, for the chosen keys only, without a
second forward and without a row of T scores per key.

Without rotary positions, with B = U diag(sigma) V^T of the head (``head_form``) and x, y the
attention input of the query and of a key, the terms are sigma_i (x . u_i)(y . v_i) plus the
bias parts (``bias_terms``); with rotary positions the score is split by rotation plane of the
kept (rotated) Q and K, as ``attribute`` does (its module doc). Float64, on the device of Q.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attn_core.bilinear.blocked import LayerQK
from attn_core.bilinear.checks import check_bilinear, check_model
from attn_core.circuits.attribution import Attribution, _omega, bias_terms, head_form
from attn_core.model import Transformer


def _keys(qk: LayerQK, query: int, keys: Sequence[int]) -> list[int]:
    if not isinstance(query, int) or isinstance(query, bool) or not 0 <= query < qk.n:
        raise ValueError(f"query {query!r} is outside 0..{qk.n - 1}")
    keys = [int(k) for k in keys]
    dev = qk.q.device
    if not keys:
        raise ValueError("no keys to split")
    seen = qk.visible(torch.tensor([query], device=dev), torch.tensor(keys, device=dev))[0]
    if not bool(seen.all()):
        bad = keys[int((~seen).nonzero()[0])]
        raise ValueError(f"query {query} does not see key {bad} (causal mask or sliding window)")
    return keys


@torch.no_grad()
def mode_split(
    model: Transformer, qk: LayerQK, head: int, query: int, keys: Sequence[int], names: Sequence[str] | None = None
) -> Attribution:
    """The scores of ``query`` against ``keys`` split into their rank-1 terms (or rotation
    planes) and bias, an :class:`Attribution` (its ``frame()`` and ``runner_up()`` work);
    ``names`` labels the tokens (default: ids). A soft-capped head's terms add up to its score
    before the cap, the capped score beside it (``Attribution.capped``), as ``attribute``'s."""
    model = check_model(model, "mode_split")
    if model.cfg.qk_norm != "none" and model.cfg.positional != "rotary":
        check_bilinear(model, "the mode split")  # the gains: x B~ y^T is not S
    h = qk.check_head(head)
    keys = _keys(qk, query, keys)
    cfg, layer = model.cfg, qk.layer
    ids = [qk.token_ids[k] for k in keys]
    labels = [names[t] if names is not None else str(t) for t in ids]
    who = (layer, h, query, keys, ids, labels)
    query_token = names[qk.token_ids[query]] if names is not None else str(qk.token_ids[query])
    if cfg.mla:  # an MLA head's two terms: its absorbed B's (with the latent gains) and the rotary one
        Qt, Kt, n = qk.q[h, query].double(), qk.k[qk.kv_head[h], keys].double(), cfg.d_head
        parts = [list(range(n)), list(range(n, n + cfg.rotary_dims))]
        return Attribution(
            *who,
            torch.zeros(2, dtype=torch.float64, device="cpu"),
            torch.stack([Qt[p].norm() for p in parts]).cpu(),
            torch.stack([Kt[:, p].norm(dim=-1) for p in parts], dim=-1).cpu(),
            torch.stack([(Qt[p] * Kt[:, p]).sum(-1) * qk.scale[h] for p in parts], dim=-1).cpu(),
            torch.zeros(len(keys), 3, dtype=torch.float64, device="cpu"),  # on the CPU, like the rest
            meta=dict(query_token=query_token, rank_cap=2, split="absorbed B and rotary term"),
            term_names=["absorbed B", "rotary term"],
        )
    if cfg.positional == "rotary":
        Qt = qk.q[h, query].double()
        Kt = qk.k[qk.kv_head[h], keys].double()
        r, half = cfg.rotary_dims, cfg.rotary_dims // 2
        planes = [[c, c + half] for c in range(half)] + ([list(range(r, cfg.d_head))] if r < cfg.d_head else [])
        terms = torch.stack([(Qt[p] * Kt[:, p]).sum(-1) * qk.scale[h] for p in planes], dim=-1)
        omega = _omega(model, layer).to(Qt.device)
        freqs = torch.cat([omega, torch.zeros_like(omega[:1])])[: len(planes)]
        term_names = [f"plane {c} (ω {w:.3g})" for c, w in enumerate(omega[:half].tolist())]
        term_names += ["offset-free dims"] if r < cfg.d_head else []
        return Attribution(
            *who,
            freqs.cpu(),
            torch.stack([Qt[p].norm() for p in planes]).cpu(),
            torch.stack([Kt[:, p].norm(dim=-1) for p in planes], dim=-1).cpu(),
            terms.cpu(),
            torch.zeros(len(keys), 3, dtype=torch.float64, device="cpu"),  # on the CPU, like the rest
            meta=dict(query_token=query_token, rank_cap=len(planes), split="rotation planes"),
            term_names=term_names,
            cap=cfg.attn_softcap,
        )
    if qk.x is None:
        raise ValueError("this LayerQK kept no attention input (a rotary model's); the split needs it")
    form = head_form(model, layer, h)
    U, S, Vh = form.svd()
    x, y = qk.x[query].double().to(U.device), qk.x[keys].double().to(U.device)
    xc, yc = x @ U, y @ Vh.T
    bias = bias_terms(model, layer, h, x, y)
    return Attribution(
        *who,
        S.cpu(),
        xc.cpu(),
        yc.cpu(),
        (S * xc * yc).cpu(),
        bias.cpu(),
        meta=dict(query_token=query_token, rank_cap=len(S)),
        cap=cfg.attn_softcap,
    )
