"""Recipes of the shipped zoo: ``attn-lab train --preset NAME`` reproduces each model in
``assets/models/NAME`` (same seed, same steps, same code)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from attn_core import checkpoint
from attn_core.card import Card, machine, now
from attn_core.model import ModelConfig
from attn_core.tasks import Task, get_task
from attn_core.training.config import TrainConfig
from attn_core.training.trainer import evaluate, init_model, train

HELD_OUT_SAMPLES = 512  # the card's metrics: accuracy and loss on this many held-out sequences


@dataclass(frozen=True)
class Preset:
    name: str
    task: str
    model: dict
    train: TrainConfig
    description: str

    def model_config(self) -> ModelConfig:
        t = get_task(self.task)
        return ModelConfig(d_vocab=t.d_vocab, n_ctx=t.n_ctx, **self.model)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "induction-2l",
            "induction",
            dict(n_layers=2, n_heads=4, d_model=64, d_head=16),
            TrainConfig(steps=1500, batch_size=64, lr=3e-3),
            "2-layer attention-only; has a previous-token head (layer 0) and an induction head (layer 1).",
        ),
        Preset(
            "recall-2l",
            "recall",
            dict(n_layers=2, n_heads=4, d_model=64, d_head=16),
            TrainConfig(steps=2000, batch_size=128, lr=3e-3),
            "2-layer attention-only associative recall with factored QK. It plateaus near 45% held-out "
            "accuracy (below the 95% target): layer 0 never forms the previous-token head the lookup "
            "needs, with 2x32 or 4x16 heads, keys first or values first, 2000-4000 steps. The same "
            "architecture with merged QK (recall-2l-merged) solves the task within 250 steps. Not shipped "
            "in the zoo; kept so the finding can be reproduced.",
        ),
        Preset(
            "recall-2l-merged",
            "recall",
            dict(n_layers=2, n_heads=4, d_model=64, d_head=16, qk="merged"),
            TrainConfig(steps=600, batch_size=128, lr=3e-3),
            "The recall architecture with merged QK: one W_QK = B per head (seed 004). Unlike the "
            "factored recall-2l it learns the lookup, within 250 steps.",
        ),
        Preset(
            "copy-1l",
            "copy",
            dict(n_layers=1, n_heads=2, d_model=48, d_head=24),
            TrainConfig(steps=800, batch_size=128, lr=3e-3),
            "1-layer attention-only copy: each output position attends to its source position.",
        ),
        Preset(
            "reverse-1l",
            "reverse",
            dict(n_layers=1, n_heads=2, d_model=48, d_head=24),
            TrainConfig(steps=800, batch_size=128, lr=3e-3),
            "1-layer attention-only reversal: purely positional attention.",
        ),
        Preset(
            "sort-2l-mlp",
            "sort",
            dict(n_layers=2, n_heads=4, d_model=64, d_head=16, d_mlp=256, attn_bias=True),
            TrainConfig(steps=2000, batch_size=128, lr=3e-3),
            "2-layer transformer with MLPs and attention biases that sorts six numbers.",
        ),
        Preset(
            "modadd-1l-mlp",
            "modadd",
            dict(n_layers=1, n_heads=4, d_model=64, d_head=16, d_mlp=256),
            TrainConfig(steps=3000, batch_size=512, lr=3e-3, weight_decay=1.0, warmup_steps=50),
            "1-layer transformer with an MLP; a + b mod 23, trained on 80% of the pairs and evaluated "
            "on the held-out 20% (it generalises after ~2000 steps: grokking under weight decay).",
        ),
    ]
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}") from None


def train_preset(
    name: str,
    out: str | Path | None = None,
    steps: int | None = None,
    seed: int | None = None,
    device: str | None = None,
    progress: bool = False,
    overwrite: bool = False,
    command: str = "",
    precision: str | None = None,
    compile: bool | None = None,
) -> dict:
    """Train a preset, measure it on 512 held-out samples and (if ``out``) save model + card;
    returns the card as written (``Card.to_dict``)."""
    preset = get_preset(name)
    cfg = preset.train
    overrides = {
        k: v
        for k, v in (
            ("steps", steps),
            ("seed", seed),
            ("device", device),
            ("precision", precision),
            ("compile", compile),
        )
        if v is not None
    }
    cfg = replace(cfg, **overrides)
    if out is not None and Path(out).exists() and not overwrite:
        raise ValueError(f"{out} already exists; choose a new --out folder (nothing was overwritten)")
    task: Task = get_task(preset.task)
    torch.manual_seed(cfg.seed)
    model = init_model(preset.model_config(), cfg.seed)
    model, last = train(model, task, cfg, progress=progress)
    held_out = evaluate(model, task, samples=HELD_OUT_SAMPLES, seed=cfg.seed + 7)
    card = Card(
        name=preset.name if out is None else Path(out).name,
        preset=preset.name,
        task=preset.task,
        description=preset.description,
        metrics={
            "accuracy": held_out["accuracy"],
            "loss": held_out["loss"],
            "eval_samples": HELD_OUT_SAMPLES,
            "split": "test",
        },
        seed=cfg.seed,
        steps=cfg.steps,
        train=cfg.to_dict(),
        wall_time_s=round(last["wall_time_s"], 2),
        device=str(next(model.parameters()).device),
        machine=machine(),
        params=model.n_params(),
        command=command or f"attn-lab train --preset {preset.name} --out assets/models/{preset.name}",
        created=now(),
    )
    if out is not None:
        checkpoint.save(model.cpu(), out, card, overwrite=overwrite)
    return card.to_dict()
