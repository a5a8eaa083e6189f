"""What a retraining job adds for text and for imported models (``training.job`` holds one
:class:`Retraining`): the text task of a model that has no task of its own, the Hugging Face
folder it came from and its tokenizer files (saved with the run, so that ``export-hf`` writes it
back as its family and the views tokenize typed text), what ``--train`` lets learn and the
``--kl`` term (:mod:`attn_core.finetune`), and the card sections that record all of it."""

from __future__ import annotations

from attn_core import finetune
from attn_core.card import Card
from attn_core.hf import family_export
from attn_core.model import Transformer
from attn_core.presets import scratch_preset
from attn_core.sources import outline, resolve
from attn_core.tasks import get_task
from attn_core.text.source import text_task_for
from attn_core.text.task import default_batch
from attn_core.training.trainer import init_model

SCRATCH_PREFIX = "scratch:"  # source "scratch:<preset>" trains the preset's model from its init


def open_outline(cfg, store, retraining: Retraining):
    """(model config, task, card) of ``cfg.source`` (a ``JobConfig``) without its weights, what a
    job's handle reads: a preset's, or what :func:`attn_core.sources.outline` finds (zoo, folder,
    ``run:<id>``, upload) with the task ``retraining`` gives it (its own, or ``cfg.text``)."""
    if cfg.source.startswith(SCRATCH_PREFIX):
        preset = scratch_preset(cfg.source[len(SCRATCH_PREFIX) :])
        return preset.model_config(), get_task(preset.task), Card(train=preset.train.to_dict())
    found = outline(cfg.source, store=store)
    return found.config, retraining.task(found, store), found.card


def parent_model(cfg, store) -> Transformer:
    """The weights ``cfg.source`` names, as a model (what the loop trains, built where it runs): a
    fresh init of a preset under the run's seed, or the model :func:`attn_core.sources.resolve` loads."""
    if cfg.source.startswith(SCRATCH_PREFIX):
        return init_model(scratch_preset(cfg.source[len(SCRATCH_PREFIX) :]).model_config(), cfg.seed)
    return resolve(cfg.source, store=store).model


class Retraining:
    """The text and imported-model parts of one job of ``cfg`` (a ``JobConfig``)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.origin: dict | None = None  # {"model_type", "config"} of the Hugging Face folder
        self.files: dict[str, bytes] = {}  # its tokenizer files, saved beside the run's weights
        self.trained: list[str] = []  # the parameters --train lets learn

    def task(self, loaded, store):
        """The task the job trains ``loaded`` on: text (``cfg.text``, tokenized by the model
        folder's own tokenizer.json) or the card's task; a ValueError says what is missing."""
        self.origin = family_export.hf_origin(loaded)
        if self.cfg.text is None:
            if loaded.task is None:
                raise ValueError(
                    f"model {loaded.name!r} has no known task in its card, so it cannot be retrained"
                    + (" without text: give --text PATH" if self.origin is not None else "")
                )
            return loaded.task
        cfg, root = self.cfg, (store.root if store is not None else None)
        task = text_task_for(loaded, cfg.text, cfg.text_field, cfg.eval_text, cfg.block, root)
        self.files = family_export.companion_files(loaded.path)
        if cfg.batch_size is None and "batch_size" not in loaded.card.train:
            # an imported model has no recipe: the job's batch size (JobConfig.train_config reads
            # the parent's) is the default the model, block and device allow (text.task.default_batch)
            from attn_core.device import select_device

            batch = default_batch(loaded.config, task.block, cfg.kl, select_device(cfg.device).type)
            loaded.card.train = {**loaded.card.train, "batch_size": batch}
        return task

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
