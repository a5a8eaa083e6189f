"""Edits of whole heads, no retraining: what one ``--head`` group of ``attn-lab edit`` asks for
(:class:`HeadEdit`), checked against the model, and applied to a copy of it (:func:`edit_model`).

Per head, in this order:

- ``source``: a transplant: the head's W_Q, W_K and their biases (with ``with_ov`` also W_V, b_V
  and W_O) copied from head ``source_head`` of another model of the same family and shape (a zoo
  model, a folder, ``run:<id>``, a checkpoint). Refused under grouped-query attention with more
  than one query head per key/value head: W_K is shared by the group, so a transplant would
  change the other heads too;
- ``rank`` / ``drop`` / ``scale``: the head's modes (``surgery.modes``; query side only). With
  QK-norm the per-token gains depend on W_Q and W_K, so an edit must go after them: across heads
  (OLMo 2) into the head's slice of the q_norm weight (any plane edit of a rotary head; one factor
  for every singular mode otherwise); a per-head norm's weight is the layer's, so there modes are
  refused, and a transplant is taken only from a layer with the same norm weights (across heads
  refused: the gain is every head's);
- ``sink``: the head's learned sink logit z (gpt-oss) times this factor (0: z = 0, a sink worth one
  key of score 0); refused on a model without learned sinks;
- ``ablate``: ``zero`` sets the head's W_O to 0 (its output is zero); ``mean`` replaces its output by
  its mean over the inputs given (the task's samples or the text windows): W_O[h] = 0 and
  ``b_O += mean(z_h) W_O[h]``, which needs the attention output bias (a model without one is
  refused: the mean has nowhere to live).

The loaded model is never changed: :func:`edit_model` returns a new :class:`LoadedModel`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace

import torch

from attn_core.checkpoint import LoadedModel
from attn_core.hooks import act_name
from attn_core.model import ModelConfig
from attn_core.regularizers.heads import head_label, parse_heads
from attn_core.surgery.modes import apply_factors, head_modes, mode_factors
from attn_core.validate import is_int, is_real, shown

ABLATIONS = ("zero", "mean")
SHAPE_KEYS = (
    "d_model",
    "d_head",
    "qk",
    "positional",
    "rotary_dim",
    "rope_theta",
    "rope_scaling",
    "attn_bias",
    "n_kv_heads",
    "qk_norm",
    "kv_lora_rank",
    "q_lora_rank",
    "d_v",
)


def parse_head(text: str, cfg: ModelConfig, model: str = "the model") -> tuple[int, int]:
    """``L<layer>H<head>`` of a model of config ``cfg`` as (layer, head); one ValueError
    sentence for anything else (a whole layer, a list, a head the model does not have)."""
    if not isinstance(text, str) or "," in text or "h" not in text.lower():
        raise ValueError(f"head {text!r} is not one L<layer>H<head> (e.g. L1H0)")
    try:
        ((layer, head),) = parse_heads(text, cfg)
    except ValueError as e:
        raise ValueError(f"{model}: {e}") from None
    return layer, head


@dataclass(frozen=True)
class HeadEdit:
    """What to do to head (layer, head): see the module doc."""

    layer: int
    head: int
    rank: int | None = None
    drop: tuple[int, ...] = ()
    scale: tuple[tuple[int, float], ...] = ()
    ablate: str | None = None
    source: str | None = None
    source_head: tuple[int, int] | None = None
    with_ov: bool = False
    sink: float | None = None

    @property
    def label(self) -> str:
        return head_label(self.layer, self.head)

    @property
    def touches_modes(self) -> bool:
        return self.rank is not None or bool(self.drop) or bool(self.scale)

    def to_json(self) -> dict:
        out = {"head": self.label}
        if self.rank is not None:
            out["rank"] = self.rank
        if self.drop:
            out["drop_modes"] = list(self.drop)
        if self.scale:
            out["scale_modes"] = {str(i): v for i, v in self.scale}
        if self.sink is not None:
            out["sink"] = self.sink
        if self.ablate:
            out["ablate"] = self.ablate
        if self.source:
            out["from"] = self.source + (f":{head_label(*self.source_head)}" if self.source_head else "")
            out["with_ov"] = self.with_ov
        return out


@dataclass
class Edited:
    """The edited model and, per edit, the head's mode factors applied (None: modes untouched)."""

    loaded: LoadedModel
    edits: list[HeadEdit]
    factors: list[torch.Tensor | None] = field(default_factory=list)


def _check_types(e: HeadEdit) -> None:
    """A HeadEdit built by hand (the Python door takes a list of them) holds what the CLI's
    options make: integer layer, head, rank and modes, (mode, factor) pairs, a str ablation and source."""
    if not (is_int(e.layer) and is_int(e.head)):
        raise ValueError(
            f"an edit's head must be integers (layer, head), got layer={shown(e.layer)}, head={shown(e.head)}"
        )
    if e.rank is not None and not is_int(e.rank):
        raise ValueError(f"the rank of the edit of head L{e.layer}H{e.head} must be an integer, got {shown(e.rank)}")
    if not isinstance(e.drop, (tuple, list)) or not all(is_int(i) for i in e.drop):
        raise ValueError(f"the modes head L{e.layer}H{e.head} drops must be a tuple of integers, got {shown(e.drop)}")
    pairs = isinstance(e.scale, (tuple, list)) and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in e.scale)
    if not pairs or not all(is_int(i) and is_real(f) for i, f in e.scale):  # a NaN: mode_factors says so
        raise ValueError(
            f"the scale of head L{e.layer}H{e.head} must be (mode, factor) pairs, e.g. ((0, 2.0),), got {shown(e.scale)}"
        )
    if e.sink is not None and not (is_real(e.sink) and math.isfinite(e.sink)):
        raise ValueError(
            f"--sink of head L{e.layer}H{e.head} must be a finite number (the factor on its sink logit), "
            f"got {shown(e.sink)}"
        )
    for name in ("ablate", "source"):
        if getattr(e, name) is not None and not isinstance(getattr(e, name), str):
            raise ValueError(
                f"the {name} of the edit of head L{e.layer}H{e.head} must be a str, got {shown(getattr(e, name))}"
            )


def check_edit(loaded: LoadedModel, e: HeadEdit, source: LoadedModel | None = None) -> None:
    """Refuse, in one ValueError sentence, an edit the model cannot take (before any work)."""
    cfg = loaded.config
    _check_types(e)
    if not 0 <= e.layer < cfg.n_layers or not 0 <= e.head < cfg.n_heads:
        raise ValueError(
            f"head {e.label} does not exist: {loaded.name} has {cfg.n_layers} layers x {cfg.n_heads} heads "
            f"(L0H0..L{cfg.n_layers - 1}H{cfg.n_heads - 1})"
        )
    if not e.touches_modes and e.ablate is None and e.source is None and e.sink is None:
        raise ValueError(
            f"head {e.label} is given nothing to do: give it a rank, modes to drop or scale, a sink factor, an "
            "ablation or a source to transplant from"
        )
    if e.sink is not None and not cfg.attn_sinks:
        raise ValueError(
            f"--sink of head {e.label}: {loaded.name}'s heads have no learned sink logit (only models with "
            "attn_sinks, such as gpt-oss, do)"
        )
    if cfg.qk_norm == "head" and e.touches_modes:
        raise ValueError(
            f"head {e.label}: {loaded.name}'s QK-norm divides q and k by gains that depend on W_Q and W_K, and its "
            "norm weights are shared by every head of the layer, so no weight of this head alone can change its "
            "modes exactly; --ablate works (so does a transplant from a model with the same norm weights)"
        )
    if cfg.qk_norm == "all" and e.source is not None:
        raise ValueError(
            f"head {e.label}: {loaded.name}'s QK-norm divides every head's q and k by one gain over all the "
            "heads of a token, which a new W_Q, W_K would change for them all; --ablate and edits of the "
            "head's modes work"
        )
    if e.touches_modes:
        f = mode_factors(head_modes(loaded.model, e.layer, e.head), e.rank, e.drop, e.scale)
        if cfg.qk_norm == "all" and cfg.positional != "rotary" and bool((f != f[0]).any()):
            raise ValueError(
                f"head {e.label}: {loaded.name}'s QK-norm divides q and k by gains that depend on W_Q and W_K, so "
                "only the norm weight after them can carry an edit, and it scales every singular mode alike; "
                "scale all modes by one factor, or use --ablate"
            )
    if e.ablate is not None:
        if e.ablate not in ABLATIONS:
            raise ValueError(f"--ablate must be one of {', '.join(ABLATIONS)}, got {e.ablate!r}")
        if e.ablate == "mean" and not has_output_bias(loaded, e.layer):
            raise ValueError(
                f"--ablate mean needs an attention output bias (b_O) to hold the head's mean output; {loaded.name} "
                "has none: use --ablate zero"
            )
    if e.source is not None:
        if source is None:
            raise ValueError("a transplant needs its source model loaded")
        check_transplant(loaded, source, e)
        if cfg.qk_norm == "head":
            _check_norm_weights(loaded, source, e)


def has_output_bias(loaded: LoadedModel, layer: int) -> bool:
    """Whether the model has a b_O that its format keeps (Qwen2 biases q, k, v but not o_proj)."""
    from attn_core.hf.family_export import fixed_params, hf_origin

    cfg = loaded.config
    return cfg.attn_bias and f"blocks.{layer}.attn.b_O" not in fixed_params(hf_origin(loaded), cfg)


def check_transplant(loaded: LoadedModel, source: LoadedModel, e: HeadEdit) -> None:
    from attn_core.hf.family_export import hf_origin

    mine, theirs = loaded.config, source.config
    differ = [k for k in SHAPE_KEYS if getattr(mine, k) != getattr(theirs, k)]
    if mine.d_qk is not None or theirs.d_qk is not None:
        differ += ["d_qk"] if mine.head_d_qk(e.layer, e.head) != _source_width(source, e) else []
    if differ:
        raise ValueError(
            f"cannot transplant from {source.name}: its heads are not of {loaded.name}'s shape ({', '.join(differ)} differ)"
        )
    fam = [(o or {}).get("model_type", "attn-lab") for o in (hf_origin(loaded), hf_origin(source))]
    if fam[0] != fam[1]:
        raise ValueError(f"cannot transplant from {source.name}: it is a {fam[1]} model, {loaded.name} a {fam[0]} one")
    if mine.n_heads // mine.kv_heads > 1:
        raise ValueError(
            f"cannot transplant into {loaded.name}: its key/value heads are shared by {mine.n_heads // mine.kv_heads} "
            "query heads (grouped-query attention), so a new W_K would change them all; edit its modes instead"
        )
    sl, sh = e.source_head or (e.layer, e.head)
    if not 0 <= sl < theirs.n_layers or not 0 <= sh < theirs.n_heads:
        raise ValueError(f"head {head_label(sl, sh)} does not exist in {source.name}")


def _check_norm_weights(loaded: LoadedModel, source: LoadedModel, e: HeadEdit) -> None:
    """A transplant into a per-head QK-norm head is exact when the source head's layer has the
    same norm weights (the layer's, shared by its heads, are not transplanted)."""
    sl, sh = e.source_head or (e.layer, e.head)
    mine, theirs = loaded.model.blocks[e.layer].attn.form(), source.model.blocks[sl].attn.form()
    if not (torch.equal(mine.norm_q, theirs.norm_q) and torch.equal(mine.norm_k, theirs.norm_k)):
        raise ValueError(
            f"cannot transplant {head_label(sl, sh)} of {source.name} "
            f"into {loaded.name}'s {e.label}: their layers' QK-norm weights differ, and those are shared by every "
            "head of the layer, so the head would not score as it did; use a source layer with the same norm weights"
        )


def _source_width(source: LoadedModel, e: HeadEdit) -> int:
    sl, sh = e.source_head or (e.layer, e.head)
    if not 0 <= sl < source.config.n_layers or not 0 <= sh < source.config.n_heads:
        return -1
    return source.config.head_d_qk(sl, sh)


@torch.no_grad()
def _transplant(model, source, e: HeadEdit) -> None:
    sl, sh = e.source_head or (e.layer, e.head)
    mine, theirs = model.blocks[e.layer].attn, source.blocks[sl].attn
    mine.set_form(theirs.form(sh), e.head)  # B (factors and biases), through the attention module
    value = "W_UV" if model.cfg.mla else "W_V"  # an MLA head's own value rows (kv_b_proj's)
    names = [value, "W_O"] + (["b_V"] if model.cfg.attn_bias else []) if e.with_ov else []
    for n in names:
        getattr(mine, n).data[e.head] = getattr(theirs, n).data[sh].to(getattr(mine, n).dtype)


@torch.no_grad()
def _scale_sink(model, e: HeadEdit) -> None:
    """The head's sink logit times ``e.sink``, written back through the attention module's form."""
    attn = model.blocks[e.layer].attn
    form = attn.form()
    z = form.sink.detach().clone()
    z[e.head] = z[e.head] * e.sink
    attn.set_form(form.replace(sink=z), e.head)


@torch.no_grad()
def _ablate(model, e: HeadEdit, tokens: torch.Tensor | None) -> None:
    attn = model.blocks[e.layer].attn
    if e.ablate == "mean":
        if tokens is None:
            raise ValueError("--ablate mean needs inputs to take the mean over (the task's samples or --text)")
        name = act_name("z", e.layer)
        _, cache = model.run_with_cache(tokens.to(attn.W_O.device), names_filter=[name])
        z = cache[name][:, e.head].double().mean((0, 1))  # [d_head]
        attn.b_O.data += (z @ attn.W_O[e.head].double()).to(attn.b_O.dtype)
    attn.W_O.data[e.head] = 0.0


def _check_weights(model, e: HeadEdit) -> None:
    """Refuse an edit whose weights leave the bounds every loader enforces (``checkpoint.check_weight``:
    finite, within ``MAX_ABS_WEIGHT``): a model no command could open again is never measured or saved."""
    from attn_core.checkpoint import check_weight

    for name, t in model.blocks[e.layer].attn.named_parameters():
        try:
            check_weight(f"blocks.{e.layer}.attn.{name}", t)
        except ValueError as err:
            what = " ".join(f"{k}={v}" for k, v in e.to_json().items() if k != "head")
            raise ValueError(
                f"the edit of head {e.label} ({what}) leaves weights no loader accepts ({err}); nothing was changed"
            ) from None


def edit_model(
    loaded: LoadedModel,
    edits: list[HeadEdit],
    sources: dict[str, LoadedModel] | None = None,
    tokens: torch.Tensor | None = None,
) -> Edited:
    """A copy of ``loaded`` with ``edits`` applied in order (module doc); ``sources`` holds the
    transplant sources by name, ``tokens`` [n, T] the inputs of a mean ablation. Every edit is
    checked first, and the weights it leaves after: a bad one changes nothing."""
    sources = sources or {}
    if not edits:
        raise ValueError("no edit given: name a head (--head L<layer>H<head>) and what to do to it")
    for e in edits:
        check_edit(loaded, e, sources.get(e.source) if e.source else None)
    model = copy.deepcopy(loaded.model)
    factors: list[torch.Tensor | None] = []
    for e in edits:
        if e.source is not None:
            _transplant(model, sources[e.source].model, e)
        f = None
        if e.touches_modes:
            f = mode_factors(head_modes(model, e.layer, e.head), e.rank, e.drop, e.scale)
            apply_factors(model, e.layer, e.head, f)
        if e.sink is not None:
            _scale_sink(model, e)
        if e.ablate is not None:
            _ablate(model, e, tokens)
        _check_weights(model, e)
        factors.append(f)
    out = replace(loaded, model=model, key=f"{loaded.key}+edit:{[x.to_json() for x in edits]}")
    return Edited(out, list(edits), factors)
