"""What a Hugging Face family is to attn-lab, and the one path every family loads and exports by.

A family (one file in ``attn_core/hf/families/``, one line in its registry) declares a
:class:`Family`: its ``model_type``, how its config.json becomes our :class:`ModelConfig`, and
its tensors as a list of :class:`Slot`. A slot names one tensor of the file and the parameters
of ours it holds, with the two maps between them (``split``: the file's tensor -> ours;
``join``: ours -> the file's). The loader (``hf/load.py``) reads every slot and splits it; the
export (``hf/family_export.py``) joins every slot and writes it: one table, read both ways, so
load and export cannot disagree. Our parameters no slot holds (a bias the family has no tensor
for) are zero on import and held at zero (:func:`fixed_params`).

Layout conventions (row vectors: ``W_Q[h]`` is [d_model, d_head], ``W_O[h]`` [d_head, d_model]):
an ``nn.Linear`` stores [out, in], so its weight is transposed (:func:`linear`,
:func:`out_heads`, :func:`transposed`). :func:`decoder_slots` is the layout of the Llama-shaped
families (``model.layers.{l}.self_attn.q_proj`` ...), with the options the newer ones need:
fused qkv / gate_up projections, QK-norm weights, sandwich or post norms, Gemma's ``(1 + w)``
norm weights (folded into ours on load: Gemma computes ``1 + w`` in float32 too, so the product is
the same number).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from attn_core.checkpoint import CheckpointError
from attn_core.model import ModelConfig

Get = Callable[[str, tuple[int, ...]], torch.Tensor]  # the file's tensor, its shape checked


@dataclass(frozen=True)
class Slot:
    """One tensor of the file (``theirs``, of ``shape``) holding our parameters ``ours``."""

    theirs: str
    ours: tuple[str, ...]
    shape: tuple[int, ...]
    split: Callable[[torch.Tensor], Sequence[torch.Tensor]]
    join: Callable[[Sequence[torch.Tensor]], torch.Tensor]
    optional: bool = False  # a file without it loads; ours are then zero
    hint: str = ""  # added to a refusal of its shape (the config field that disagrees with it)


@dataclass(frozen=True)
class Family:
    """A family: its name, config reader, tensor slots and the names of its (un)embedding."""

    model_type: str
    config: Callable[[dict], ModelConfig]
    slots: Callable[[ModelConfig, dict], list[Slot]]
    prefix: str = "model."  # the file may spell every name with or without it
    embed: str = "model.embed_tokens.weight"
    head: str = "lm_head.weight"
    tied: bool = False  # tie_word_embeddings when config.json does not say
    # whole-model overrides for a family whose layout is not a slot table (GPT-2's scale folding)
    load: Callable | None = field(default=None, compare=False)
    export: Callable | None = field(default=None, compare=False)
    export_config: Callable[[ModelConfig, dict], dict] | None = field(default=None, compare=False)


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of ``Transformer(cfg)`` with its shape (built on the meta device: free)."""
    from attn_core.model import Transformer

    with torch.device("meta"):
        model = Transformer(cfg)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def _covered(fam: Family, cfg: ModelConfig, raw: dict) -> set[str]:
    return {o for s in fam.slots(cfg, raw) for o in s.ours}


def fixed_params(fam: Family, cfg: ModelConfig, raw: dict) -> set[str]:
    """Our parameters the family has no tensor for: zero on import, held at zero by retraining."""
    if fam.load is not None:
        return {"unembed.b_U"}
    return set(param_shapes(cfg)) - _covered(fam, cfg, raw)


def convert(fam: Family, cfg: ModelConfig, raw: dict, get: Get, has: Callable[[str], bool]) -> dict:
    """Our tensors from the file's (``get(name, shape)`` checks each shape before reading it;
    ``has(name)`` says whether the file holds it). The unembedding is the embedding when the file
    has no head of its own (the loader has checked that the config ties them); with
    ``cfg.tied_embed`` the unembedding is not read at all (it is the embedding)."""
    if fam.load is not None:
        return fam.load(cfg, raw, get, has)
    out: dict[str, torch.Tensor] = {}
    for s in fam.slots(cfg, raw):
        name = s.theirs
        if s.ours == ("unembed.W_U",) and cfg.tied_embed:
            continue
        if s.ours == ("unembed.W_U",) and not has(name):
            name = fam.embed
        elif s.optional and not has(name):
            continue
        try:
            t = get(name, s.shape)
        except CheckpointError as e:
            if s.hint:
                raise CheckpointError(f"{e} ({s.hint})") from None
            raise
        parts = s.split(t)
        out.update({o: p.contiguous() for o, p in zip(s.ours, parts, strict=True)})
    like = out["embed.W_E"]
    for name, shape in param_shapes(cfg).items():
        if name not in out:  # a bias the family does not have: zero, on the file's device
            if not name.rsplit(".", 1)[-1].startswith("b"):
                raise CheckpointError(f"the {fam.model_type} layout gives no tensor for {name}")
            out[name] = like.new_zeros(shape)
    return out


def export_tensors(fam: Family, model, raw: dict) -> dict[str, torch.Tensor]:
    """The family's state dict (fp32) equal to our ``model``: every slot joined (the unembedding's
    left out when it is tied to the embedding, as transformers saves a tied model)."""
    if fam.export is not None:
        return fam.export(model, raw)
    sd = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
    slots = [s for s in fam.slots(model.cfg, raw) if not (model.cfg.tied_embed and s.ours == ("unembed.W_U",))]
    return {s.theirs: s.join([sd[o] for o in s.ours]).contiguous() for s in slots}


# --- slot makers ---------------------------------------------------------------------------------


def same(theirs: str, ours: str, shape: tuple[int, ...], optional: bool = False, offset: float = 0.0) -> Slot:
    """A tensor stored as ours is (a norm weight, a bias); ``offset`` is added on load and taken off
    on export (Gemma's norms multiply by ``1 + w``)."""
    if offset:
        return Slot(theirs, (ours,), shape, lambda t: (t + offset,), lambda p: p[0] - offset, optional)
    return Slot(theirs, (ours,), shape, lambda t: (t,), lambda p: p[0], optional)


def transposed(theirs: str, ours: str, shape: tuple[int, int], optional: bool = False) -> Slot:
    """An ``nn.Linear`` weight [out, in] as our [in, out] (an MLP matrix, the unembedding)."""
    return Slot(theirs, (ours,), shape, lambda t: (t.T,), lambda p: p[0].T, optional)


def linear(theirs: str, ours: str, n: int, dh: int, d: int) -> Slot:
    """A head projection ``nn.Linear`` [n dh, d] as our per-head [n, d, dh]."""
    return Slot(theirs, (ours,), (n * dh, d), lambda t: (_heads(t, n, dh),), lambda p: _unheads(p[0]))


def head_bias(theirs: str, ours: str, n: int, dh: int, optional: bool = False) -> Slot:
    """A head projection's bias [n dh] as our [n, dh]."""
    return Slot(theirs, (ours,), (n * dh,), lambda t: (t.reshape(n, dh),), lambda p: p[0].reshape(-1), optional)


def out_heads(theirs: str, ours: str, h: int, dh: int, d: int) -> Slot:
    """The output projection ``nn.Linear`` [d, h dh] as our W_O [h, dh, d]."""
    return Slot(theirs, (ours,), (d, h * dh), lambda t: (t.T.reshape(h, dh, d),), lambda p: p[0].reshape(-1, d).T)


def fused(theirs: str, parts: list[tuple[str, int, str]], d: int) -> Slot:
    """Several projections stacked along the output of one ``nn.Linear`` (Phi-3's ``qkv_proj``,
    ``gate_up_proj``): ``parts`` is (our name, rows, "heads:<dh>" or "t") in the file's order."""
    sizes = [rows for _, rows, _ in parts]

    def split(t: torch.Tensor):
        return [_heads(c, rows // int(k[6:]), int(k[6:])) if k != "t" else c.T
                for c, (_, rows, k) in zip(t.split(sizes), parts)]  # fmt: skip

    def join(ps):
        return torch.cat([_unheads(p) if k != "t" else p.T for p, (_, _, k) in zip(ps, parts)])

    return Slot(theirs, tuple(n for n, _, _ in parts), (sum(sizes), d), split, join)


def _heads(W: torch.Tensor, n: int, dh: int) -> torch.Tensor:
    return W.reshape(n, dh, -1).transpose(1, 2)


def _unheads(W: torch.Tensor) -> torch.Tensor:
    return W.transpose(1, 2).reshape(-1, W.shape[1])


@dataclass(frozen=True)
class Experts:
    """Where a family keeps a layer's experts: the MoE module (under the layer), its router's
    weight [n_experts, d], each expert's gate, up and down projections (``experts.{e}.<name>``)
    and the config.json field that counts them."""

    module: str = "mlp."
    router: str = "gate.weight"
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    field: str = "num_experts"
    shared: str = "shared_expert."  # the shared expert (with cfg.d_shared), named as the experts are
    shared_gate: str = "shared_expert_gate.weight"  # its gate [1, d] (with cfg.shared_gate)


def expert_slots(cfg: ModelConfig, s: str, q: str, ex: Experts) -> list[Slot]:
    """Layer ``s``'s router (ours ``mlp.W_router`` [d, n_experts]) and experts (ours
    ``mlp.experts.{e}.W_gate/W_in/W_out``, as a dense MLP's) and shared expert (``mlp.shared``,
    its gate ``mlp.W_shared_gate`` [d, 1]); the router comes first, so an expert
    count that disagrees with the weights is refused naming the config field."""
    d, f, E = cfg.d_model, cfg.d_mlp, cfg.n_experts
    m = s + ex.module
    hint = f"config.json {ex.field}={E} disagrees with the weights"
    out = [Slot(m + ex.router, (q + "mlp.W_router",), (E, d), lambda t: (t.T,), lambda p: p[0].T, hint=hint)]
    gate, up, down = ex.names
    for e in range(E):
        t, o = f"{m}experts.{e}.", f"{q}mlp.experts.{e}."
        out += [transposed(t + gate + ".weight", o + "W_gate", (f, d)),
                transposed(t + up + ".weight", o + "W_in", (f, d)),
                transposed(t + down + ".weight", o + "W_out", (d, f))]  # fmt: skip
    if cfg.d_shared:
        t, o, w = m + ex.shared, q + "mlp.shared.", cfg.d_shared
        out += [transposed(t + gate + ".weight", o + "W_gate", (w, d)),
                transposed(t + up + ".weight", o + "W_in", (w, d)),
                transposed(t + down + ".weight", o + "W_out", (d, w))]  # fmt: skip
        if cfg.shared_gate:
            out.append(transposed(m + ex.shared_gate, q + "mlp.W_shared_gate", (1, d)))
    return out


# the block's norms: ours -> what the Llama-shaped files call them, by ModelConfig.block_norms
LLAMA_NORMS = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}
SANDWICH_NORMS = {
    "ln1": "input_layernorm",
    "ln1_post": "post_attention_layernorm",
    "ln2": "pre_feedforward_layernorm",
    "ln2_post": "post_feedforward_layernorm",
}
POST_NORMS = {"ln1_post": "post_attention_layernorm", "ln2_post": "post_feedforward_layernorm"}


def decoder_slots(
    cfg: ModelConfig,
    *,
    o_bias: bool = False,
    mlp_bias: bool = False,
    fused_qkv: bool = False,
    fused_mlp: bool = False,
    norm_offset: float = 0.0,
    prefix: str = "model.",
    experts: Experts | None = None,
) -> list[Slot]:
    """The Llama-shaped layout (Llama, Mistral, Qwen2/3, Gemma 2/3, OLMo 2, SmolLM3, Phi-3, ...):
    ``{prefix}layers.{l}.self_attn.{q,k,v,o}_proj`` (or one ``qkv_proj``), ``q_norm``/``k_norm``
    with QK-norm, the MLP's gate/up/down (or ``gate_up_proj``; with ``cfg.n_experts``, the router
    and each expert's, named by ``experts``), the block's norms by
    ``cfg.block_norms``, ``{prefix}norm``, ``lm_head``. q/k/v biases with ``cfg.attn_bias``, o_proj's
    with ``o_bias`` (optional in the file), the MLP's with ``mlp_bias``."""
    h, g, d, dh, f, V = cfg.n_heads, cfg.kv_heads, cfg.d_model, cfg.d_head, cfg.d_mlp, cfg.d_vocab
    norms = {"pre": LLAMA_NORMS, "sandwich": SANDWICH_NORMS, "post": POST_NORMS}[cfg.block_norms]
    out = [same(prefix + "embed_tokens.weight", "embed.W_E", (V, d))]
    for l in range(cfg.n_layers):
        s, q = f"{prefix}layers.{l}.", f"blocks.{l}."
        a = s + "self_attn."
        if fused_qkv:
            kinds = f"heads:{dh}"
            parts = [(q + "attn.W_Q", h * dh, kinds), (q + "attn.W_K", g * dh, kinds), (q + "attn.W_V", g * dh, kinds)]
            out.append(fused(a + "qkv_proj.weight", parts, d))
        else:
            out += [
                linear(a + f"{x.lower()}_proj.weight", q + f"attn.W_{x}", h if x == "Q" else g, dh, d) for x in "QKV"
            ]
        out.append(out_heads(a + "o_proj.weight", q + "attn.W_O", h, dh, d))
        if cfg.attn_bias:
            out += [head_bias(a + f"{x.lower()}_proj.bias", q + f"attn.b_{x}", h if x == "Q" else g, dh) for x in "QKV"]
            if o_bias:
                out.append(same(a + "o_proj.bias", q + "attn.b_O", (d,), optional=True))
        if cfg.qk_norm != "none":
            widths = (dh, dh) if cfg.qk_norm == "head" else (h * dh, g * dh)
            for x, w in zip("qk", widths):
                out.append(same(a + f"{x}_norm.weight", q + f"attn.{x}_norm.w", (w,), offset=norm_offset))
        out += [
            same(s + theirs + ".weight", q + ours + ".w", (d,), offset=norm_offset) for ours, theirs in norms.items()
        ]
        m = s + "mlp."
        if cfg.n_experts:
            out += expert_slots(cfg, s, q, experts or Experts())
            continue
        if fused_mlp:
            out.append(fused(m + "gate_up_proj.weight", [(q + "mlp.W_gate", f, "t"), (q + "mlp.W_in", f, "t")], d))
        else:
            out += [transposed(m + "gate_proj.weight", q + "mlp.W_gate", (f, d)),
                    transposed(m + "up_proj.weight", q + "mlp.W_in", (f, d))]  # fmt: skip
        out.append(transposed(m + "down_proj.weight", q + "mlp.W_out", (d, f)))
        if mlp_bias:
            for ours, theirs, n in (("gate", "gate_proj", f), ("in", "up_proj", f), ("out", "down_proj", d)):
                out.append(same(f"{m}{theirs}.bias", f"{q}mlp.b_{ours}", (n,)))
    out.append(same(prefix + "norm.weight", "ln_final.w", (d,), offset=norm_offset))
    out.append(transposed("lm_head.weight", "unembed.W_U", (V, d)))
    return out
