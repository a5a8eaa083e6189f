"""A series: one architecture at several training steps, ordered by step.

Built by :func:`series` from what a user names:

- **one source that holds checkpoints**: a run (``run:<id>``; also while it trains), a model folder
  with a ``checkpoints/`` folder (``attn-lab train --out DIR --checkpoint-every N``), or such a
  ``checkpoints/`` folder itself. Its members are the checkpoint files
  (:mod:`attn_core.training.checkpoints`), by the step each file records. The final model of the
  folder (when it has one) is the *reference* that attention-only checkpoints take their other
  tensors from;
- **a folder of model folders, one per checkpoint** (Hugging Face folders of a published series:
  ``step1000/``, ``step2000/`` ..., or listed in ``series.json``/``series.csv`` with steps and
  tokens: :mod:`attn_core.dynamics.folders`);
- **several model sources** (folders, Hugging Face folders, zoo names, runs): e.g. local copies of
  a model's training revisions. Each one's step is the one the user gives (``steps``, in the
  order of the sources) or the one its name carries (``step1000``, ``step-1000``,
  ``checkpoint-1000``, ``ckpt_1000``, ``iter1000``, or a name that is a number).

Nothing is loaded to build a series: each member's config is read from its config.json (through
``checkpoint.model_file``: a link leading out of its folder is refused) or its safetensors header.
A member that cannot be a member is **skipped** with its reason (:class:`Skipped`), never fatal:
an unreadable or truncated file, a step listed twice or past ``limits.MAX_STEPS``, a config of
another architecture (the series' architecture is its final model's, else the one most members
share, a tie going to the latest step). A member is loaded by :meth:`Series.load` (every tensor's
name, shape and value checked then); its :attr:`Member.key` (files, sizes, modification times)
keys every cache of results computed from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from attn_core import checkpoint, hf, limits, sources, zoo
from attn_core.checkpoint import CARD, CHECKPOINTS, CONFIG, WEIGHTS, CheckpointError, LoadedModel
from attn_core.dynamics import folders
from attn_core.dynamics.folders import step_of_name
from attn_core.model import ModelConfig
from attn_core.runs import RunStore
from attn_core.training import checkpoints as ckpt
from attn_core.training.checkpoint_plan import MAX_CHECKPOINTS

MAX_MEMBERS = MAX_CHECKPOINTS  # what one run may keep is what one series may hold
MAX_HEADER = 8 * 2**20  # bytes of a safetensors header read for its config

__all__ = ["MAX_MEMBERS", "Member", "Series", "Skipped", "series", "step_of_name"]


@dataclass(frozen=True)
class Skipped:
    """A checkpoint left out of a series, and why (one sentence)."""

    step: int | None
    source: str
    reason: str

    def line(self) -> str:
        name = Path(self.source).name or self.source
        return (f"step {self.step} ({name})" if self.step is not None else name) + f": {self.reason}"

    def to_json(self) -> dict:
        return {"step": self.step, "source": self.source, "reason": self.reason}


@dataclass(frozen=True)
class Member:
    """One step of a series: a checkpoint file (``checkpoint``) or a model source (whose
    ``files`` besides ``file`` key it too); ``tokens`` seen by then, when known."""

    step: int
    source: str
    file: Path
    checkpoint: bool = False
    tokens: int | None = None
    files: tuple[Path, ...] = ()

    @property
    def key(self) -> str:
        """The files behind the member, their sizes and modification times: what caches key on."""
        parts = []
        for f in (self.file, *self.files):
            try:
                s = f.stat()
            except OSError as e:
                raise CheckpointError(f"step {self.step}: {f} cannot be read ({e.strerror or e})") from None
            parts.append(f"{f.resolve()}:{s.st_size}:{s.st_mtime_ns}")
        return "|".join(parts)


@dataclass
class Series:
    """Members by step (ascending, distinct), their common config, the reference model
    (``reference``: a source, or None) that attention-only checkpoints need, the members left
    out (``skipped``) and the folders the series reads (``folders``)."""

    name: str
    members: list[Member]
    config: ModelConfig
    reference: str | None = None
    partial: bool = False
    task: str | None = None  # the task the series was trained on, when its run or folder says
    skipped: list[Skipped] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    _loaded_reference: LoadedModel | None = field(default=None, repr=False)

    @property
    def steps(self) -> list[int]:
        return [m.step for m in self.members]

    @property
    def tokens(self) -> list[int | None] | None:
        """Tokens seen at each step, when any member says (a manifest, OLMo's names); else None."""
        found = [m.tokens for m in self.members]
        return found if any(t is not None for t in found) else None

    @property
    def key(self) -> str:
        """One key for the whole series (every member's key)."""
        return hashlib.sha256("\n".join(m.key for m in self.members).encode()).hexdigest()[:16]

    def member(self, step: int) -> Member:
        for m in self.members:
            if m.step == step:
                return m
        raise ValueError(f"the series has no step {step}; its steps are {self.steps[0]}..{self.steps[-1]}")

    def reference_model(self, store: RunStore | None = None) -> LoadedModel | None:
        """The final model of the series' folder (loaded once), None when there is none."""
        if self._loaded_reference is None and self.reference is not None:
            self._loaded_reference = sources.resolve(self.reference, store=store)
        return self._loaded_reference

    def load(self, member: Member | int, store: RunStore | None = None) -> LoadedModel:
        """The member's model (CPU, eval mode), named ``<series> @ step N``; its ``key`` is
        :attr:`Member.key`. A CheckpointError says why a damaged one cannot be loaded."""
        m = member if isinstance(member, Member) else self.member(member)
        if m.checkpoint:
            loaded = ckpt.load_checkpoint(m.file, self.reference_model(store) if self.partial else None)
        else:
            loaded = sources.resolve(m.source, store=store)
            loaded.key = m.key
        if loaded.config != self.config:
            raise CheckpointError(f"step {m.step} ({Path(m.source).name}) is not the series' architecture")
        if loaded.card.task is None and self.task is not None:  # a checkpoint file: the run's task
            loaded.card.task = self.task
        loaded.name = f"{self.name} @ step {m.step}"
        return loaded

    def first_loaded(self, store: RunStore | None = None) -> LoadedModel:
        """The final model, else the first member that loads (for a series' tokenizer or task)."""
        reasons = []
        try:
            found = self.reference_model(store)
        except CheckpointError as e:
            found, reasons = None, [f"its final model: {e}"]
        if found is not None:
            return found
        for m in self.members:
            try:
                return self.load(m, store)
            except (CheckpointError, OSError) as e:
                reasons.append(f"step {m.step}: {e}")
        raise CheckpointError(f"no checkpoint of {self.name} can be loaded ({reasons[0]})")


# --- building a series ----------------------------------------------------------------------------


def series(names: list[str], steps: list[int] | None = None, store: RunStore | None = None) -> Series:
    """The series the user named (see the module doc); one sentence for anything wrong."""
    names = [str(n) for n in names or []]
    if not names:
        raise ValueError("no series given: name a run (run:<id>), a model folder with checkpoints, or several models")
    if steps is not None and len(steps) != len(names):
        raise ValueError(f"{len(steps)} steps given for {len(names)} models; give one step per model")
    if len(names) == 1 and steps is None:
        if not sources.is_run(names[0]) and folders.is_model_folders(zoo.locate(names[0])):
            return _folder_series(zoo.locate(names[0]), store)
        return _checkpoint_series(names[0], store)
    if len(names) > MAX_MEMBERS:
        raise limits.LimitError(f"{len(names):,} models is more than {MAX_MEMBERS:,} in one series")
    pairs, skipped, named = [], [], {}
    for i, name in enumerate(names):
        file = sources.weights_path(name, store)  # an unknown name fails here, with the known ones
        step = steps[i] if steps is not None else step_of_name(_plain_name(name))
        if (first := named.setdefault(file.resolve(), i)) != i:  # the same model named twice: one step
            skipped.append(Skipped(step, name, f"is named twice (also as {names[first]!r})"))
            continue
        if step is None:
            raise ValueError(
                f"cannot tell the training step of {name!r} from its name (no step1000, checkpoint-1000 ...); "
                "give the steps with --steps S1,S2,... in the order of the models"
            )
        if not (isinstance(step, int) and 0 <= step <= limits.MAX_STEPS):
            raise ValueError(f"a step is a whole number 0..{limits.MAX_STEPS:,}, got {step!r} for {name!r}")
        _add(
            pairs,
            skipped,
            Member(step, name, file, files=_side_files(file)),
            lambda name=name: _source_config(name, store),
        )
    label = Path(_plain_name(names[0])).name
    where = [m.file.parent for m, _ in pairs if m.file.name in (WEIGHTS, hf.INDEX)]
    return _finish(f"{label} (+{len(names) - 1})", pairs, skipped, where=where)


def _folder_series(folder: Path, store: RunStore | None) -> Series:
    """The model folders one folder holds, one per checkpoint (:mod:`attn_core.dynamics.folders`)."""
    listed, problems = folders.entries(folder, MAX_MEMBERS)
    skipped = [Skipped(step, file, why) for step, file, why in problems]
    pairs: list = []
    for e in listed:
        try:
            file = sources.weights_path(str(e.folder), store)
        except CheckpointError as err:
            skipped.append(Skipped(e.step, str(e.folder), str(err)))
            continue
        member = Member(e.step, str(e.folder), file, tokens=e.tokens, files=_side_files(file))
        _add(pairs, skipped, member, lambda e=e: _folder_config(e.folder))
    return _finish(folder.name, pairs, skipped, where=[folder], what=f"{folder} holds no model folder that")


def _plain_name(name: str) -> str:
    return name[len(sources.RUN_PREFIX) :] if sources.is_run(name) else name


def _checkpoint_series(name: str, store: RunStore | None) -> Series:
    """The checkpoints one source holds (a run, a folder with checkpoints/, a checkpoints folder)."""
    folder, reference = _series_folder(name, store)
    if sources.is_run(name):  # the run's row knows its task, also while it trains
        task = (store or RunStore()).get(_plain_name(name)).get("task")
    else:
        task = checkpoint.read_card(folder.parent / CARD).task if folder.name == CHECKPOINTS else None
    problems: list = []
    found = ckpt.read_series(folder, problems)
    skipped = [Skipped(step, file, why) for step, file, why in problems]
    if len(found) > MAX_MEMBERS:
        raise limits.LimitError(f"{len(found):,} checkpoints is more than {MAX_MEMBERS:,} in one series")
    pairs: list = []
    params = {}
    for step, path in found:
        member = Member(step, str(path), path, checkpoint=True)

        def config(path=path, step=step):
            meta = _header(path)
            params[step] = meta.get("params", "all")
            return _header_config(path, meta)

        _add(pairs, skipped, member, config)
    prefer = None
    if reference is not None:
        try:
            prefer = _source_config(reference, store)
        except (CheckpointError, OSError, ValueError):
            prefer = None
    where = folder.parent if folder.name == CHECKPOINTS else folder
    out = _finish(
        Path(_plain_name(name)).name or name,
        pairs,
        skipped,
        prefer,
        [folder, where],
        what=f"{name} has no checkpoint file in {folder} that",
    )
    out.reference, out.task = reference, task
    out.partial = any(params.get(m.step, "all") != "all" for m in out.members)
    if out.partial and reference is None:
        raise ValueError(
            f"{name} keeps only attention and LayerNorm weights and has no final model to take the rest from"
        )
    return out


def _add(pairs: list, skipped: list[Skipped], member: Member, config) -> None:
    """Read ``member``'s config (``config()``) into ``pairs``, or skip it with the reason."""
    try:
        pairs.append((member, config()))
    except (CheckpointError, OSError, ValueError) as e:
        skipped.append(Skipped(member.step, member.source, _reason(e)))


def _reason(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__


def _finish(
    name: str,
    pairs: list[tuple[Member, ModelConfig]],
    skipped: list[Skipped],
    prefer: ModelConfig | None = None,
    where: list[Path] | None = None,
    what: str | None = None,
) -> Series:
    """The series of ``pairs``: one member per step (a step listed again is skipped), those of
    the series' architecture (``prefer`` when a member has it, else the most common, a tie going
    to the latest step); the others skipped with the reason."""
    if not pairs:
        reason = f" (first: {skipped[0].line()})" if skipped else ""
        raise ValueError(f"{what or name + ' has nothing'} can be read{reason}")

    def arch(c: ModelConfig) -> str:
        return json.dumps(c.to_dict(), sort_keys=True, default=str)

    counts = Counter(arch(cfg) for _, cfg in pairs)
    latest = {arch(cfg): (m.step, cfg) for m, cfg in sorted(pairs, key=lambda p: p[0].step)}
    if prefer is not None and arch(prefer) in counts:
        config = prefer
    else:
        config = latest[max(counts, key=lambda c: (counts[c], latest[c][0]))][1]
    members, seen = [], {}
    for m, cfg in sorted(pairs, key=lambda p: p[0].step):
        if cfg != config:
            skipped.append(Skipped(m.step, m.source, _other_architecture(cfg, config)))
        elif m.step in seen:
            skipped.append(Skipped(m.step, m.source, f"step {m.step} is listed twice (also {Path(seen[m.step]).name})"))
        else:
            seen[m.step] = m.source
            members.append(m)
    return Series(name, members, config, skipped=sorted(skipped, key=_order), folders=list(where or []))


def _order(s: Skipped) -> tuple:
    return (s.step is None, s.step or 0, s.source)


def _other_architecture(cfg: ModelConfig, config: ModelConfig) -> str:
    ref, other = dataclasses.asdict(config), dataclasses.asdict(cfg)
    key = next((k for k in ref if ref[k] != other.get(k)), "?")
    return f"another architecture ({key}={other.get(key)!r}; the series has {key}={ref.get(key)!r})"


def _side_files(file: Path) -> tuple[Path, ...]:
    """The other files a model folder's weights consist of (its config, the shards of an index)."""
    folder = file.parent
    if file.name not in (WEIGHTS, hf.INDEX) or not folder.is_dir():
        return ()
    try:
        shards = hf.folder.weight_files(folder) if file.name == hf.INDEX else []
    except CheckpointError:
        shards = []
    return tuple(p for p in (folder / CONFIG, *shards) if p.is_file())


def _folder_config(folder: Path) -> ModelConfig:
    """A model folder's config (ours or a Hugging Face one), read through ``model_file`` (a link
    leading out is refused), its weight files checked to be there (never read) and its size
    checked against the memory (``hf.folder.check_fits``)."""
    raw = checkpoint.read_json(checkpoint.model_file(folder, CONFIG), f"{folder.name}/{CONFIG}")
    if isinstance(raw.get("model_type"), str):
        cfg = hf.model_config(raw)
    else:
        cfg = checkpoint.read_config(checkpoint.model_file(folder, CONFIG))
    hf.folder.weight_files(folder)
    hf.folder.check_fits(cfg, folder.name)
    return cfg


def _series_folder(name: str, store: RunStore | None) -> tuple[Path, str | None]:
    """(the checkpoint folder, the source of its final model or None) of a source holding a series."""
    if sources.is_run(name):
        store = store or RunStore()
        run_folder = store.path(_plain_name(name))
        limits.not_led_out(run_folder, store.root, f"{name}'s folder", "the run store")
        reference = name if (run_folder / WEIGHTS).is_file() else None
        where = run_folder
    else:
        where = zoo.locate(name)
        reference = str(where) if where.is_dir() and (where / WEIGHTS).is_file() else None
    limits.not_led_out(where / CHECKPOINTS, where, f"the {CHECKPOINTS}/ folder of {name}", "its folder")
    if (where / CHECKPOINTS).is_dir():
        return where / CHECKPOINTS, reference
    if where.is_dir() and ((where / ckpt.INDEX).is_file() or any(where.glob("step-*.safetensors"))):
        parent = where.parent  # the checkpoints folder itself: its model is the folder above
        return where, (str(parent) if (parent / WEIGHTS).is_file() and where.name == CHECKPOINTS else None)
    raise ValueError(
        f"{name} holds no checkpoints (no {CHECKPOINTS}/ folder, no model folders named by step): train it with "
        "--checkpoint-every or --checkpoint-log, or name several models, one per step"
    )


def _header(path: Path) -> dict:
    """The ``__metadata__`` of a safetensors file, reading its header only (a regular file)."""
    limits.regular_file_size(path, path.name)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path.name} is too short to be a safetensors file")
        n = int.from_bytes(head, "little")
        if not 0 < n <= MAX_HEADER:
            raise CheckpointError(f"{path.name} has no readable safetensors header")
        body = f.read(n)
        if len(body) < n:
            raise CheckpointError(f"{path.name} is truncated: its header is cut short")
        return checkpoint.metadata(head + body)


def _header_config(path: Path, meta: dict | None = None) -> ModelConfig:
    text = (_header(path) if meta is None else meta).get("config")
    if not text:
        raise CheckpointError(f"{path.name} carries no config in its metadata")
    raw = checkpoint.parse_json(text, f"the config of {path.name}")
    try:
        return ModelConfig.from_dict(raw)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path.name}: {e}") from None


def header_params(path: Path) -> str:
    return _header(path).get("params", "all")


def _source_config(source: str, store: RunStore | None) -> ModelConfig:
    """A model source's config without loading its weights."""
    path = sources.weights_path(source, store)
    folder = path.parent if path.name in (WEIGHTS, hf.INDEX) else None
    if folder is not None and (folder / CONFIG).is_file():
        return _folder_config(folder)
    if path.is_file():
        return _header_config(path)
    raise CheckpointError(f"{source} has no weights ({path.name} is missing)")
