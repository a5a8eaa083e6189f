"""What an edit does: the same measurements before and after (:func:`edit_metrics`), on fixed inputs
(:func:`edit_inputs`): the model's held-out task samples, or windows of a text (``--text``).

    loss         the task's loss on its scored positions (text: every position's next token), nats
    perplexity   exp of the mean next-token loss over every position of the inputs
    accuracy     the task's held-out accuracy (``training.trainer.evaluate``); None without a task
    icl_score    mean loss over the late positions minus the early ones (``dynamics.metrics``)
    sink_rate    the share of sink heads (``bilinear.sinks``) on the inputs' first 32 rows
    heads        per edited head: ``entropy`` (mean normalized entropy of its attention rows)
                 and ``sigma_1`` (the largest singular value of its B at offset 0); with learned
                 sinks also ``sink`` (its sink logit) and ``sink_share`` (the mean mass of its rows
                 on the sink, over the inputs' first 32 rows)

:func:`edit_preview` is what a dashboard slider move pays for: the edit, one forward (:func:`quick_loss`:
loss and perplexity only) and the head's pattern.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from attn_core.bilinear.sinks import sinks
from attn_core.checkpoint import LoadedModel
from attn_core.dynamics.metrics import Inputs, default_positions, position_losses, task_inputs
from attn_core.hooks import act_name
from attn_core.surgery.edit import Edited, HeadEdit, edit_model
from attn_core.surgery.modes import head_form64

SINK_ROWS, SINK_LENGTH = 32, 64


def edit_inputs(
    loaded: LoadedModel,
    text: str | Path | None = None,
    samples: int = 64,
    length: int | None = None,
    seed: int = 0,
    field: str | None = None,
) -> Inputs:
    """The inputs an edit is measured on: ``samples`` windows of ``length`` + 1 tokens of
    ``text`` (next-token targets, every position scored), else the task's held-out samples
    (``length`` is then refused: they have the task's own length)."""
    if length is not None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"--length must be a whole number of tokens, 1 or more, got {length!r}")
        if text is None:
            raise ValueError(
                "--length sets the length of --text windows: give --text too (task samples have their own)"
            )
    if text is None:
        if loaded.task is None or loaded.task.d_vocab != loaded.config.d_vocab:
            raise ValueError(f"{loaded.name} has no task in its card: give --text FILE to measure the edit on")
        return task_inputs(loaded.task, samples, seed)
    from attn_core.text.probes import probes

    n_ctx = loaded.config.n_ctx
    T = min(128 if length is None else length, n_ctx - 1) + 1
    p = probes(loaded, text, samples, T, seed, field=field)
    tokens = p.tokens
    early, late = default_positions(T - 1)
    return Inputs(tokens[:, :-1], tokens[:, 1:], torch.ones_like(tokens[:, 1:], dtype=torch.bool), early, late, p.what)


@torch.no_grad()
def quick_loss(model, inputs: Inputs) -> dict:
    """``loss`` (scored positions) and ``perplexity`` (every position) in one forward."""
    device = model.embed.W_E.device
    tok, tgt, scored = (t.to(device) for t in (inputs.tokens, inputs.targets, inputs.scored))
    ce = F.cross_entropy(model(tok).flatten(0, 1).double(), tgt.flatten(), reduction="none").view(tok.shape)
    loss = float(ce[scored].mean()) if bool(scored.any()) else math.nan
    return dict(loss=loss, perplexity=math.exp(min(float(ce.mean()), 700.0)))


@torch.no_grad()
def edit_metrics(loaded: LoadedModel, inputs: Inputs, heads: list[tuple[int, int]], seed: int = 0) -> dict:
    """The module doc's measurements of ``loaded`` on ``inputs``, per head of ``heads``."""
    model = loaded.model
    per_pos, loss, concentration = position_losses(model, inputs)
    (a, b), (c, d) = inputs.early, inputs.late
    out = dict(
        loss=_num(loss),
        perplexity=_num(math.exp(min(float(per_pos.mean()), 700.0))),
        accuracy=None,
        icl_score=_num(per_pos[c:d].mean() - per_pos[a:b].mean()),
        sink_rate=_num(sinks(model, inputs.tokens[:SINK_ROWS, :SINK_LENGTH]).rate),
    )
    if loaded.task is not None and loaded.task.d_vocab == loaded.config.d_vocab:
        from attn_core.training.trainer import evaluate

        out["accuracy"] = _num(evaluate(model, loaded.task, samples=inputs.tokens.shape[0], seed=seed)["accuracy"])
    ent = concentration["entropy_data"]
    out["heads"] = {
        f"L{l}H{h}": dict(entropy=_num(ent[l, h]), sigma_1=_num(head_form64(model, l, h).singular_values[0].cpu()))
        for l, h in heads
    }
    if model.cfg.attn_sinks:
        found = sinks(model, inputs.tokens[:SINK_ROWS, :SINK_LENGTH])
        for l, h in heads:
            z = model.blocks[l].attn.form(h).head_sinks()
            out["heads"][f"L{l}H{h}"].update(sink=_num(z), sink_share=_num(found.learned[l, h]))
    return out


def _num(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


@torch.no_grad()
def head_pattern(model, tokens: torch.Tensor, layer: int, head: int) -> torch.Tensor:
    """A [T, T] of one head on one row of tokens [T], on the CPU."""
    name = act_name("pattern", layer)
    _, cache = model.run_with_cache(tokens[None].to(model.embed.W_E.device), names_filter=[name])
    return cache[name][0, head].float().cpu()


@dataclass
class Preview:
    """What a dashboard slider move shows: the edited model, its loss and perplexity, and the
    head's attention on the first input row."""

    edited: Edited
    loss: float
    perplexity: float
    pattern: torch.Tensor


def edit_preview(
    loaded: LoadedModel,
    edits: list[HeadEdit],
    inputs: Inputs,
    layer: int,
    head: int,
    sources: dict[str, LoadedModel] | None = None,
) -> Preview:
    """Edit, one forward on ``inputs`` (:func:`quick_loss`) and the head's pattern: the one call a
    slider move makes (``benchmarks/edit_speed.py`` times it)."""
    edited = edit_model(loaded, edits, sources, tokens=inputs.tokens)
    q = quick_loss(edited.loaded.model, inputs)
    return Preview(edited, q["loss"], q["perplexity"], head_pattern(edited.loaded.model, inputs.tokens[0], layer, head))
