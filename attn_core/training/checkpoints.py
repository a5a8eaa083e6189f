"""Checkpoints across training: a run's weights at chosen steps, as a series of safetensors files.

A **plan** (:class:`~attn_core.training.checkpoint_plan.CheckpointPlan`: every N steps, K log-spaced steps, explicit steps, which
parameters, a disk bound) gives the steps of a run of ``total`` steps (:meth:`~CheckpointPlan.schedule`):
always step 0 (the initial weights) and the last step. A :class:`CheckpointWriter` writes them into
one folder (``checkpoint.CHECKPOINTS`` inside the model folder once the run is saved)::

    checkpoints/index.json                     {"params", "steps": [...], "files": [...], "bytes"}
    checkpoints/step-000000100.safetensors     the weights after 100 updates; metadata: config, step, params
    checkpoints/tokenizer.json                 a text run's tokenizer files, written when it starts

Each file is written to a hidden temporary name and renamed into place (a reader never sees a
half-written one); ``index.json`` is rewritten the same way after each file, and past 500 files
after every n/50-th and the last (a rewrite costs the index's length: 10,000 rewrites of a growing
index took most of an hour in ``benchmarks/dynamics_many.py``, a cost growing with n^2); a reader takes the files the
index lists and the ``step-*.safetensors`` files written since (:func:`read_series`). Every file of a
series has the same size (the step in the metadata is zero-padded), so the disk use is known
exactly before training: :meth:`CheckpointWriter.start` states it and refuses a series larger
than ``max_mb`` or than the free space of the disk. ``params="attn"`` keeps only attention and
LayerNorm tensors (all the QK/OV views need; the embeddings, MLPs and unembedding of a large
model are most of its bytes).

:func:`attach` hooks a writer into a :class:`~attn_core.training.trainer.Trainer`: a callback
writes at the scheduled steps (it runs once the step's update is applied) and the scheduled steps
are sync points, so the weights written are those of that step whatever the trainer's
``sync_every``. The reading side (:func:`read_series`, :func:`load_checkpoint`) is here too:
one module for the format. See docs/checkpoints.md ("Checkpoints across training").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load as st_load_bytes
from safetensors.torch import save as st_save_bytes

from attn_core import checkpoint, limits
from attn_core.card import Card
from attn_core.checkpoint import CHECKPOINTS, CheckpointError, LoadedModel
from attn_core.model import ModelConfig, Transformer
from attn_core.training.checkpoint_plan import CheckpointPlan, log_steps
from attn_core.validate import is_int

INDEX = "index.json"
INDEX_EVERY_FROM = 500  # up to this many files the index is rewritten after each; past it, after every n/50-th
FREE_MARGIN = 64 * 2**20  # leave this much of the disk free
_FILE = re.compile(r"^step-(\d{9})\.safetensors$")
_ATTN = re.compile(r"^(blocks\.\d+\.(attn|ln1|ln2)\.|ln_final\.)")


def file_name(step: int) -> str:
    return f"step-{step:09d}.safetensors"


def kept_names(names, params: str) -> list[str]:
    """The tensor names a checkpoint of ``params`` keeps."""
    return [n for n in names if params == "all" or _ATTN.match(n)]


def _metadata(cfg: ModelConfig, step: int, params: str) -> dict[str, str]:
    return {"config": json.dumps(cfg.to_dict()), "step": f"{step:09d}", "params": params}


def to_bytes(model: Transformer, step: int, params: str) -> bytes:
    """One checkpoint: the kept tensors (float32, CPU) with config, step and params in the metadata."""
    state = model.state_dict()
    tensors = {k: state[k].detach().to("cpu", torch.float32).contiguous() for k in kept_names(state, params)}
    return st_save_bytes(tensors, metadata=_metadata(model.cfg, step, params))


def checkpoint_bytes(cfg: ModelConfig, params: str) -> int:
    """The size of one checkpoint of a model of ``cfg`` (what :func:`to_bytes` writes), worked out
    from the tensors' shapes on the ``meta`` device, without weights: safetensors' 8-byte header
    length, its JSON header (the metadata, then each tensor's dtype, shape and offsets, by name)
    padded with spaces to 8 bytes, and the float32 data."""
    with torch.device("meta"):
        state = Transformer(cfg).state_dict()
    header: dict = {"__metadata__": _metadata(cfg, 0, params)}
    offset = 0
    for name in sorted(kept_names(state, params)):
        size = state[name].numel() * 4
        header[name] = {"dtype": "F32", "shape": list(state[name].shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return 8 + len(text) + (-len(text)) % 8 + offset


class CheckpointWriter:
    """Writes the scheduled checkpoints of one run of ``total`` steps (see the module doc)."""

    def __init__(self, plan: CheckpointPlan, total: int):
        self.plan, self.total = plan, total
        self.steps = plan.schedule(total)
        self._due = set(self.steps)
        self.folder: Path | None = None
        self.written: list[int] = []
        self.bytes_each = 0
        self.bytes = 0

    @property
    def max_bytes(self) -> int:
        return int(self.plan.max_mb * 2**20)

    def estimate(self, cfg: ModelConfig) -> int:
        """Bytes of the whole series of a model of ``cfg`` (every file has the size of the first:
        :func:`checkpoint_bytes`)."""
        self.bytes_each = checkpoint_bytes(cfg, self.plan.params)
        return self.bytes_each * len(self.steps)

    def statement(self, cfg: ModelConfig) -> str:
        """What the series of a model of ``cfg`` will take, in one line (said before training)."""
        total = self.estimate(cfg)
        shown = ", ".join(map(str, self.steps[:6])) + (f", ... {self.steps[-1]}" if len(self.steps) > 6 else "")
        what = "attention and LayerNorm weights" if self.plan.params == "attn" else "all weights"
        return (
            f"checkpoints: {len(self.steps)} at steps {shown} ({what}, {limits.size_text(self.bytes_each)} each, "
            f"{limits.size_text(total)} in all; the bound is {limits.size_text(self.max_bytes)})" + self.log_note()
        )

    def log_note(self) -> str:
        """Why ``--checkpoint-log K`` keeps fewer than K steps, when it does ("" otherwise)."""
        K = self.plan.log
        got = len(log_steps(self.total, K)) if K is not None else 0
        if K is None or got >= K:
            return ""
        return f"; --checkpoint-log {K} gives {got} distinct steps (log-spaced steps that round to the same step count once)"

    def check_room(self, model: Transformer, folder: Path) -> None:
        """Refuse a series larger than the bound or than the disk's free space (before training)."""
        total = self.estimate(model.cfg)
        if total > self.max_bytes:
            raise limits.LimitError(
                f"the {len(self.steps)} checkpoints would take {limits.size_text(total)}, more than the bound of "
                f"{limits.size_text(self.max_bytes)} (--checkpoint-max-mb); keep fewer steps or --checkpoint-params attn"
            )
        existing = folder
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free = shutil.disk_usage(existing).free
        if total + FREE_MARGIN > free:
            raise limits.LimitError(
                f"the {len(self.steps)} checkpoints would take {limits.size_text(total)} and {existing} has only "
                f"{limits.size_text(free)} free"
            )

    def start(self, folder: str | Path, model: Transformer, files: dict[str, bytes] | None = None) -> None:
        """Check the room, make ``folder``, write ``files`` into it (a text run's tokenizer: the
        series can then be measured on text while the run trains, or after it was killed) and
        step 0 (before the first update)."""
        folder = Path(folder)
        self.check_room(model, folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name, data in (files or {}).items():
                if Path(name).name != name or name.startswith(".") or _FILE.match(name) or name == INDEX:
                    raise ValueError(f"a file beside the checkpoints needs a plain name of its own, not {name!r}")
                _atomic_write(folder / name, data)
        except OSError as e:
            raise CheckpointError(f"the checkpoint folder {folder} cannot be made: {e.strerror or e}") from None
        self.folder = folder
        self.write(0, model)

    def due(self, step: int) -> bool:
        return step in self._due

    def on_step(self, step: int, model: Transformer) -> None:
        """Write ``step`` if it is scheduled and not written yet (``model`` holds its weights)."""
        if step in self._due and (not self.written or step > self.written[-1]):
            self.write(step, model)

    def write(self, step: int, model: Transformer) -> Path:
        """Write one checkpoint atomically and update the index; refuses to pass the bound."""
        if self.folder is None:
            raise RuntimeError("start() the writer before writing")
        data = to_bytes(model, step, self.plan.params)
        if self.bytes + len(data) > self.max_bytes:
            raise limits.LimitError(
                f"checkpoint {step} would bring the series to {limits.size_text(self.bytes + len(data))}, "
                f"past its bound of {limits.size_text(self.max_bytes)}"
            )
        path = self.folder / file_name(step)
        try:
            _atomic_write(path, data)
            self.written.append(step)
            self.bytes += len(data)
            n = len(self.written)
            if n <= INDEX_EVERY_FROM or n % max(1, n // 50) == 0 or step == self.steps[-1]:
                _atomic_write(self.folder / INDEX, json.dumps(self.listing(relative=False), indent=1).encode())
        except OSError as e:
            raise CheckpointError(
                f"checkpoint {step} could not be written in {self.folder}: {e.strerror or e}"
            ) from None
        return path

    def listing(self, relative: bool = True) -> dict:
        """What the run's card records (``checkpoints``): folder, params, steps, files, bytes, plan."""
        out = {
            "params": self.plan.params,
            "steps": list(self.written),
            "kept": len(self.written),  # --checkpoint-log K may keep fewer than K (log_steps)
            "scheduled": len(self.steps),  # more than kept when the run stopped early
            "files": [file_name(s) for s in self.written],
            "bytes": self.bytes,
            "plan": self.plan.to_dict(),
        }
        return {"folder": CHECKPOINTS, **out} if relative else out


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def attach(trainer, writer: CheckpointWriter) -> None:
    """Make ``trainer`` write ``writer``'s checkpoints: a callback at each scheduled step (once
    its update is applied) and every scheduled step a sync point of the trainer."""
    previous = trainer.sync_at

    def sync_at(step: int) -> bool:
        return writer.due(step) or (previous is not None and previous(step))

    def on_metrics(metrics: dict) -> None:
        step = metrics["step"]
        if step == trainer.step_index and writer.due(step):  # a step read late (a window) is not the model's state
            with trainer.view() as model:  # the model, or on rank 0 of an FSDP run its gathered weights
                writer.on_step(step, model)

    trainer.sync_at = sync_at
    trainer.callbacks.append(on_metrics)


def for_job(trainer, plan: CheckpointPlan | None, store=None) -> CheckpointWriter | None:
    """The writer of a job's ``plan`` attached to its trainer, its room checked now (before
    training) where the series will go; None when the plan keeps nothing."""
    if plan is None:
        return None
    writer = CheckpointWriter(plan, trainer.cfg.steps)
    with trainer.view() as model:
        writer.check_room(model, Path(store.root) if store is not None else Path(tempfile.gettempdir()))
    attach(trainer, writer)
    return writer


def job_folder(store, run_id: str | None) -> Path:
    """Where a job's checkpoints go: its run's folder in the store (carried into the saved run,
    ``RunStore.finish``), else a new temporary folder that the caller reads and removes (a sweep
    trial sends its files back to the driver)."""
    if store is not None and run_id is not None:
        return store.path(run_id) / CHECKPOINTS
    return Path(tempfile.mkdtemp(prefix="attn-lab-checkpoints-"))


def take_files(writer: CheckpointWriter | None) -> dict[str, bytes] | None:
    """The files a job's writer wrote into its temporary folder (name -> bytes, the index
    included), which is then removed: what a run without a store sends to the one that records
    it. None when it kept none."""
    if writer is None or writer.folder is None:
        return None
    try:
        return {p.name: p.read_bytes() for p in sorted(writer.folder.iterdir()) if p.is_file()}
    finally:
        shutil.rmtree(writer.folder, ignore_errors=True)


# --- reading --------------------------------------------------------------------------------------


def read_series(folder: str | Path, problems: list | None = None) -> list[tuple[int, Path]]:
    """(step, file) of every checkpoint in a series folder, by step: the files its index lists
    that exist and every ``step-*.safetensors`` file it does not list (written since the index
    was last rewritten; without an index, every such file). Like every file of a model
    folder (``checkpoint.model_file``), the index and each file must lie inside the folder: a
    link leading out is refused. An index that cannot be read is a CheckpointError; an entry of
    it that names no checkpoint of its step (a step that is not a whole number, a file of
    another step, a file that is missing or leads out) is left out and, when ``problems`` is a
    list, appended to it as (step or None, file name, reason)."""
    folder = Path(folder)
    problems = [] if problems is None else problems
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a checkpoint folder")
    if (folder / INDEX).is_file() or (folder / INDEX).is_symlink():
        index = checkpoint.read_json(checkpoint.model_file(folder, INDEX), f"{folder.name}/{INDEX}")
        steps, files = index.get("steps"), index.get("files")
        if not (isinstance(steps, list) and isinstance(files, list) and len(steps) == len(files)):
            raise CheckpointError(f"{folder / INDEX} must list as many steps as files")
        pairs = []
        for s, f in zip(steps, files):
            m = _FILE.match(f) if isinstance(f, str) else None
            if m is None or not is_int(s) or int(m.group(1)) != s:
                what = repr(f)[:80] if m is None else f"step {str(s)[:40]!r}"
                step = int(m.group(1)) if m is not None else None  # the file's own step
                problems.append((step, str(f)[:80], f"{INDEX} lists {what}, not a checkpoint of its step"))
                continue
            pairs.append((int(s), f))
        listed = set(files)  # and the files written since the index was last rewritten
        pairs += [
            (int(m.group(1)), p.name) for p in folder.iterdir() if (m := _FILE.match(p.name)) and p.name not in listed
        ]
    else:
        pairs = [(int(m.group(1)), p.name) for p in folder.iterdir() if (m := _FILE.match(p.name))]
    out = []
    for s, f in pairs:
        try:
            path = checkpoint.model_file(folder, f)
        except CheckpointError as e:
            problems.append((s, f, str(e)))
            continue
        if path.is_file():
            out.append((s, path))
        elif os.path.lexists(folder / f):
            problems.append((s, f, "is not a regular file"))
        else:
            problems.append((s, f, f"is listed in {INDEX} but missing"))
    return sorted(out)


def load_checkpoint(path: str | Path, reference: LoadedModel | None = None) -> LoadedModel:
    """A checkpoint file as a model (float32, CPU). A partial one (``params`` attn) takes its
    other tensors from ``reference`` (same architecture) and says so in its card
    (``details["checkpoint"]["partial"]``); without a reference it is refused."""
    path = Path(path)
    data = checkpoint.read_bytes(path, checkpoint.MAX_WEIGHTS_BYTES)
    checkpoint.refuse_pickle(data)
    try:
        tensors = st_load_bytes(data)
    except Exception as e:  # the Rust loader raises several error types
        raise CheckpointError(f"{path.name} is not a readable safetensors file ({type(e).__name__})") from None
    meta = checkpoint.metadata(data)
    cfg = checkpoint.config_from_metadata(data)
    step = meta.get("step", "")
    params = meta.get("params", "all")
    partial = params != "all"
    if partial:
        if reference is None or reference.config != cfg:
            raise CheckpointError(
                f"{path.name} holds only attention and LayerNorm weights; it needs the run's final model "
                "(same architecture) for the rest"
            )
        # the reference may live on a GPU or in another dtype: its tensors join the file's (CPU, float32)
        state = reference.model.state_dict()
        tensors = {**{k: v.detach().to("cpu", torch.float32) for k, v in state.items() if k not in tensors}, **tensors}
    model = checkpoint.build_checked(cfg, tensors)
    card = Card.from_dict(reference.card.to_dict() if reference is not None else None)
    card.details["checkpoint"] = {"step": int(step) if step.isdigit() else None, "params": params, "partial": partial}
    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return LoadedModel(name=path.name, model=model.eval(), config=cfg, card=card, path=path, key=key)
