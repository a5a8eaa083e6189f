"""Names of the model's activations and the hook points they pass through, TransformerLens style.

Every activation the model can record or replace has one name, made by :func:`act_name` and
nowhere else (the maths in docs/maths.md, the list in docs/architecture.md#hook-points). Per
block ``l``, in the order the forward computes them:

    blocks.{l}.hook_resid_pre         the residual stream entering the block   [batch, pos, d_model]
    blocks.{l}.hook_attn_in           X = ln1(resid_pre) (resid_pre itself without LayerNorm)
    blocks.{l}.attn.hook_q            Q = X W_Q + b_Q per head (rotated)       [batch, head, pos, w]
    blocks.{l}.attn.hook_k            K = X W_K + b_K per head (rotated)       [batch, head, pos, w]
    blocks.{l}.attn.hook_v            V = X W_V + b_V per head                 [batch, head, pos, d_head]
    blocks.{l}.attn.hook_attn_scores  S = Q K^T / sqrt(d_qk), before the mask  [batch, head, query, key]
    blocks.{l}.attn.hook_pattern      A = softmax_row(S + causal mask)         [batch, head, query, key]
    blocks.{l}.attn.hook_z            Z = A V                                  [batch, head, query, d_head]
    blocks.{l}.hook_attn_out          sum_h Z_h W_O[h] + b_O                   [batch, pos, d_model]
    blocks.{l}.hook_resid_mid         resid_pre + attn_out       (blocks with an MLP only)
    blocks.{l}.hook_mlp_out           mlp(ln2(resid_mid))        (blocks with an MLP only)
    blocks.{l}.hook_resid_post        the residual stream leaving the block    [batch, pos, d_model]

With rotary positions ``hook_q`` and ``hook_k`` hold Q and K after the rotation, and with
grouped-query attention K and V are repeated for every query head that shares them, so that
S = Q K^T / sqrt(d_qk) holds head by head. A parallel block (GPT-NeoX) has no ``hook_resid_mid``.
``w`` is the layer's stored query/key width: ``d_head``, or for grown heads (``cfg.d_qk``) the
layer's widest head, narrower heads' extra columns being zero. A *merged* head has no W_Q/W_K:
its ``hook_q`` is ``X W_QK`` ([batch, head, pos, d_model]) and its ``hook_k`` is X repeated per
head, so that S = Q K^T there too (with no scale: W_QK is B itself).

A hook is ``fn(tensor, name)``; it may return a replacement tensor (None keeps the tensor), which
is what the rest of the forward then sees. :class:`HookRun` is the state of one forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

# short name -> the part after "blocks.{l}."
_IN_BLOCK = {
    "resid_pre": "hook_resid_pre",
    "attn_in": "hook_attn_in",
    "q": "attn.hook_q",
    "k": "attn.hook_k",
    "v": "attn.hook_v",
    "attn_scores": "attn.hook_attn_scores",
    "pattern": "attn.hook_pattern",
    "z": "attn.hook_z",
    "attn_out": "hook_attn_out",
    "resid_mid": "hook_resid_mid",
    "mlp_out": "hook_mlp_out",
    "resid_post": "hook_resid_post",
}
ACTIVATIONS = tuple(_IN_BLOCK)
MLP_ACTIVATIONS = ("resid_mid", "mlp_out")  # only blocks with an MLP have these

Hook = Callable[[torch.Tensor, str], torch.Tensor | None]
NamesFilter = str | Iterable[str] | Callable[[str], bool] | None


def act_name(kind: str, layer: int) -> str:
    """The full name of activation ``kind`` (one of :data:`ACTIVATIONS`) in block ``layer``,
    e.g. ``act_name("pattern", 1) == "blocks.1.attn.hook_pattern"``."""
    try:
        return f"blocks.{layer}.{_IN_BLOCK[kind]}"
    except KeyError:
        raise ValueError(f"unknown activation {kind!r}; one of {', '.join(ACTIVATIONS)}") from None


def block_names(layer: int, mlp: bool, parallel: bool = False) -> dict[str, str]:
    """``{kind: full name}`` of every hook point of one block, in the order they are computed.
    A parallel block (attention and MLP read the same residual) has no ``resid_mid``."""
    return {
        kind: act_name(kind, layer)
        for kind in ACTIVATIONS
        if (mlp or kind not in MLP_ACTIVATIONS) and not (parallel and kind == "resid_mid")
    }


def check_names(names: Iterable[str], known: Iterable[str]) -> None:
    """Raise ValueError naming the first of ``names`` that is not one of ``known``."""
    known = set(known)
    for name in names:
        if name not in known:
            raise ValueError(
                f"unknown activation name {name!r}: this model's names are made by "
                f"act_name(kind, layer), e.g. {act_name('pattern', 0)!r}"
            )


class Cache(dict):
    """A forward cache that keeps only ``names``: ``model(tokens, cache=Cache(names))`` records
    those activations and no others, so a layer none of whose scores or pattern is kept runs its
    fused attention (a regularizer's ``cache()`` asks for the Q and K it reads this way)."""

    def __init__(self, names: Iterable[str]):
        super().__init__()
        self.names = frozenset(names)

    def keep(self, name: str) -> bool:
        return name in self.names


class HookRun:
    """What one forward records and replaces: ``hooks`` maps a name to the functions run on it
    (in order; each may return a replacement), then the value the model goes on with is stored
    in ``cache`` under its name when ``keep(name)``. Built by ``Transformer.run_with_cache`` /
    ``run_with_hooks``; a forward without one does no work at any hook point."""

    __slots__ = ("hooks", "cache", "keep")

    def __init__(
        self,
        hooks: dict[str, list[Hook]] | None = None,
        cache: dict | None = None,
        keep: Callable[[str], bool] | None = None,
    ):
        self.hooks = hooks or {}
        self.cache = cache
        self.keep = keep

    def touches(self, names) -> bool:
        """Whether a hook runs on, or the cache keeps, any of ``names`` (a block that this run
        neither reads nor changes may take its fast path)."""
        return any(n in self.hooks or (self.cache is not None and (self.keep is None or self.keep(n))) for n in names)

    def __call__(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        for fn in self.hooks.get(name, ()):
            out = fn(tensor, name)
            if out is not None:
                if not isinstance(out, torch.Tensor) or out.shape != tensor.shape:
                    got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                    raise ValueError(
                        f"the hook on {name} returned {got} where a tensor of shape "
                        f"{list(tensor.shape)} (or None) was expected"
                    )
                tensor = out
        if self.cache is not None and (self.keep is None or self.keep(name)):
            self.cache[name] = tensor
        return tensor


def name_filter(names_filter: NamesFilter, known: Iterable[str]) -> Callable[[str], bool] | None:
    """``names_filter`` (None: every name; a name; a list of names; or a predicate) as a
    predicate, None meaning every name. Names given explicitly must be ``known``."""
    if names_filter is None:
        return None
    if callable(names_filter):
        return names_filter
    wanted = {names_filter} if isinstance(names_filter, str) else set(names_filter)
    check_names(sorted(wanted), known)
    return wanted.__contains__
