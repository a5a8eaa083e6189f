"""What a run starts from: the :class:`Parent` a job's handle is handed (:func:`open_parent`:
the model's config and card read without its weights, the task it trains on: its card's, or for an
imported model a text tokenized by the model folder's own tokenizer.json; the Hugging Face folder
it came from and its tokenizer files, saved with the run so that ``export-hf`` writes it back as
its family and the views tokenize typed text), the weights the loop builds where it trains
(:func:`parent_model`), and what ``--train`` lets learn and the ``--kl`` term add
(:class:`Retraining`, :mod:`attn_core.finetune`) with the card sections that record it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from attn_core import finetune
from attn_core.card import Card
from attn_core.device import select_device
from attn_core.hf import family_export
from attn_core.model import ModelConfig, Transformer
from attn_core.presets import scratch_preset
from attn_core.sources import outline, resolve
from attn_core.tasks import get_task
from attn_core.text.source import text_task_for
from attn_core.text.task import default_batch
from attn_core.training.trainer import init_model

SCRATCH_PREFIX = "scratch:"  # source "scratch:<preset>" trains the preset's model from its init


@dataclass
class Parent:
    """What a run starts from, opened without its weights (:func:`open_parent`): the model's
    config, the task it trains on, its card, and for a model imported from a Hugging Face folder
    that folder's family and config.json (``origin``) and tokenizer files (``files``, saved with the
    run). A job's handle is handed one; the loop builds the weights where it trains (:func:`parent_model`)."""

    source: str
    config: ModelConfig
    task: Any
    card: Card
    origin: dict | None = None
    files: dict[str, bytes] = field(default_factory=dict)


def open_parent(cfg, store=None) -> Parent:
    """The :class:`Parent` of ``cfg.source`` (a ``JobConfig``): a preset's, or what
    :func:`attn_core.sources.outline` finds (zoo, folder, ``run:<id>``, upload) with the task it
    trains on: text (``cfg.text``, tokenized by the model folder's own tokenizer.json) or its
    card's. A ValueError says what is missing."""
    if cfg.source.startswith(SCRATCH_PREFIX):
        preset = scratch_preset(cfg.source[len(SCRATCH_PREFIX) :])
        return Parent(cfg.source, preset.model_config(), get_task(preset.task), Card(train=preset.train.to_dict()))
    found = outline(cfg.source, store=store)
    origin = family_export.hf_origin(found)
    if cfg.text is None:
        if found.task is None:
            raise ValueError(
                f"model {found.name!r} has no known task in its card, so it cannot be retrained"
                + (" without text: give --text PATH" if origin is not None else "")
            )
        return Parent(cfg.source, found.config, found.task, found.card, origin)
    root = store.root if store is not None else None
    task = text_task_for(found, cfg.text, cfg.text_field, cfg.eval_text, cfg.block, root)
    card = found.card
    if cfg.batch_size is None and "batch_size" not in card.train:
        # an imported model has no recipe: the job's batch size (JobConfig.train_config reads
        # the parent's) is the default the model, block and device allow (text.task.default_batch)
        batch = default_batch(found.config, task.block, cfg.kl, select_device(cfg.device).type)
        card = replace(card, train={**card.train, "batch_size": batch})
    return Parent(cfg.source, found.config, task, card, origin, family_export.companion_files(found.path))


def parent_model(cfg, store) -> Transformer:
    """The weights ``cfg.source`` names, as a model (what the loop trains, built where it runs): a
    fresh init of a preset under the run's seed, or the model :func:`attn_core.sources.resolve` loads."""
    if cfg.source.startswith(SCRATCH_PREFIX):
        return init_model(scratch_preset(cfg.source[len(SCRATCH_PREFIX) :]).model_config(), cfg.seed)
    return resolve(cfg.source, store=store).model


class Retraining:
    """What ``--train`` and ``--kl`` add to one job of ``cfg`` (a ``JobConfig``) from ``parent``."""

    def __init__(self, cfg, parent: Parent):
        self.cfg, self.origin, self.files = cfg, parent.origin, parent.files
        self.trained: list[str] = []  # the parameters --train lets learn

    def penalty(self, model, penalty, start_alpha: float):
        """Freeze what ``--train`` leaves out (and what the model's family has no tensor for) and
        return the Trainer's penalty: the regularizers' with the KL term (``--kl``), or None."""
        fixed = family_export.fixed_params(self.origin, model.cfg)
        out, self.trained = finetune.setup(
            model, self.cfg.train, self.cfg.kl, penalty, self.cfg.precision, fixed=fixed, entmax_alpha=start_alpha
        )
        return out

    @staticmethod
    def start(penalty, model) -> None:
        """Once the model is on its training device: the KL term's starting model is taken."""
        if hasattr(penalty, "start"):
            penalty.start(model)

    def details(self, model, task) -> dict:
        """The card sections: what was trained (``trained``), the corpus (``text``) and the
        Hugging Face folder the model came from (``hf``: family and config.json)."""
        n = sum(p.numel() for p in model.parameters() if p.requires_grad)
        out: dict = {
            "trained": {"train": self.cfg.train, "kl": self.cfg.kl, "tensors": len(self.trained), "parameters": n}
        }
        facts = getattr(task, "facts", None)
        if facts is not None:
            out["text"] = facts
        if self.origin is not None:
            out[family_export.HF_DETAIL] = self.origin
        return out
