"""A series: one architecture at several training steps, ordered by step.

Built by :func:`series` from what a user names:

- **one source that holds checkpoints**: a run (``run:<id>``; also while it trains), a model folder
  with a ``checkpoints/`` folder (``attn-lab train --out DIR --checkpoint-every N``), or such a
  ``checkpoints/`` folder itself. Its members are the checkpoint files
  (:mod:`attn_core.training.checkpoints`), by the step each file records. The final model of the
  folder (when it has one) is the *reference* that attention-only checkpoints take their other
  tensors from;
- **several model sources** (folders, Hugging Face folders, zoo names, runs): e.g. local copies of
  a model's training revisions. Each one's step is the one the user gives (``steps``, in the
  order of the sources) or the one its name carries (``step1000``, ``step-1000``,
  ``checkpoint-1000``, ``ckpt_1000``, ``iter1000``, or a name that is a number).

Nothing is loaded to build a series: each member's config is read from its config.json or its
safetensors header, and every member must have the same architecture (the first difference is
named). A member is loaded by :meth:`Series.load`; its :attr:`Member.key` (file, size,
modification time) keys every cache of results computed from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from attn_core import checkpoint, hf, sources, zoo
from attn_core.checkpoint import CARD, CHECKPOINTS, CONFIG, WEIGHTS, CheckpointError, LoadedModel
from attn_core.model import ModelConfig
from attn_core.runs import RunStore
from attn_core.training import checkpoints as ckpt

MAX_MEMBERS = 2_000
MAX_HEADER = 8 * 2**20  # bytes of a safetensors header read for its config
_STEP = re.compile(r"(?:^|[^a-z])(?:step|checkpoint|ckpt|iter|iteration)[-_ ]?(\d+)(?!.*\d)", re.IGNORECASE)


def step_of_name(name: str) -> int | None:
    """The training step a folder or file name carries (the last ``step…``/``checkpoint-…`` number,
    or the whole name when it is a number); None when it carries none."""
    stem = Path(str(name).rstrip("/")).name
    stem = stem.removesuffix(".safetensors")
    if stem.isdigit():
        return int(stem)
    m = _STEP.search(stem)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Member:
    """One step of a series: a checkpoint file (``checkpoint``) or a model source."""

    step: int
    source: str
    file: Path
    checkpoint: bool = False

    @property
    def key(self) -> str:
        """The file behind the member, its size and modification time: what caches key on."""
        try:
            s = self.file.stat()
        except OSError as e:
            raise CheckpointError(f"step {self.step}: {self.file} cannot be read ({e.strerror or e})") from None
        return f"{self.file.resolve()}:{s.st_size}:{s.st_mtime_ns}"


@dataclass
class Series:
    """Members by step (ascending, distinct), their common config, and the reference model
    (``reference``: a source, or None) that attention-only checkpoints need."""

    name: str
    members: list[Member]
    config: ModelConfig
    reference: str | None = None
    partial: bool = False
    task: str | None = None  # the task the series was trained on, when its run or folder says
    _loaded_reference: LoadedModel | None = field(default=None, repr=False)

    @property
    def steps(self) -> list[int]:
        return [m.step for m in self.members]

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
        :attr:`Member.key`."""
        m = member if isinstance(member, Member) else self.member(member)
        if m.checkpoint:
            loaded = ckpt.load_checkpoint(m.file, self.reference_model(store) if self.partial else None)
        else:
            loaded = sources.resolve(m.source, store=store)
            loaded.key = m.key
        if loaded.config != self.config:
            raise CheckpointError(f"step {m.step} ({m.source}) is not the series' architecture")
        if loaded.card.task is None and self.task is not None:  # a checkpoint file: the run's task
            loaded.card.task = self.task
        loaded.name = f"{self.name} @ step {m.step}"
        return loaded


# --- building a series ----------------------------------------------------------------------------


def series(names: list[str], steps: list[int] | None = None, store: RunStore | None = None) -> Series:
    """The series the user named (see the module doc); one sentence for anything wrong."""
    names = [str(n) for n in names or []]
    if not names:
        raise ValueError("no series given: name a run (run:<id>), a model folder with checkpoints, or several models")
    if steps is not None and len(steps) != len(names):
        raise ValueError(f"{len(steps)} steps given for {len(names)} models; give one step per model")
    if len(names) == 1 and steps is None:
        return _checkpoint_series(names[0], store)
    if len(names) > MAX_MEMBERS:
        raise ValueError(f"{len(names)} models is more than {MAX_MEMBERS} in one series")
    members = []
    for i, name in enumerate(names):
        file = sources.weights_path(name, store)  # an unknown name fails here, with the known ones
        step = steps[i] if steps is not None else step_of_name(_plain_name(name))
        if step is None:
            raise ValueError(
                f"cannot tell the training step of {name!r} from its name (no step1000, checkpoint-1000 ...); "
                "give the steps with --steps S1,S2,... in the order of the models"
            )
        if not (isinstance(step, int) and step >= 0):
            raise ValueError(f"a step is a whole number >= 0, got {step!r} for {name!r}")
        members.append(Member(step, name, file))
    config = _same_config([(m, _source_config(m.source, store)) for m in members])
    label = Path(_plain_name(names[0])).name
    return Series(f"{label} (+{len(names) - 1})", _by_step(members), config)


def _plain_name(name: str) -> str:
    return name[len(sources.RUN_PREFIX) :] if sources.is_run(name) else name


def _checkpoint_series(name: str, store: RunStore | None) -> Series:
    """The checkpoints one source holds (a run, a folder with checkpoints/, a checkpoints folder)."""
    folder, reference = _series_folder(name, store)
    if sources.is_run(name):  # the run's row knows its task, also while it trains
        task = (store or RunStore()).get(_plain_name(name)).get("task")
    else:
        task = checkpoint.read_card(folder.parent / CARD).task if folder.name == CHECKPOINTS else None
    found = ckpt.read_series(folder)
    if not found:
        raise ValueError(f"{name} has no checkpoint files in {folder}")
    if len(found) > MAX_MEMBERS:
        raise ValueError(f"{len(found)} checkpoints is more than {MAX_MEMBERS} in one series")
    members = [Member(step, str(path), path, checkpoint=True) for step, path in found]
    pairs = [(m, _header_config(m.file)) for m in members]
    config = _same_config(pairs)
    partial = any(header_params(m.file) != "all" for m in members)
    if partial and reference is None:
        raise ValueError(
            f"{name} keeps only attention and LayerNorm weights and has no final model to take the rest from"
        )
    return Series(Path(_plain_name(name)).name or name, _by_step(members), config, reference, partial, task)


def _series_folder(name: str, store: RunStore | None) -> tuple[Path, str | None]:
    """(the checkpoint folder, the source of its final model or None) of a source holding a series."""
    if sources.is_run(name):
        run_folder = (store or RunStore()).path(_plain_name(name))
        reference = name if (run_folder / WEIGHTS).is_file() else None
        where = run_folder
    else:
        where = zoo.locate(name)
        reference = None
        if where.is_dir() and (where / WEIGHTS).is_file():
            reference = str(where)
    if (where / CHECKPOINTS).is_dir():
        return where / CHECKPOINTS, reference
    if where.is_dir() and ((where / ckpt.INDEX).is_file() or any(where.glob("step-*.safetensors"))):
        parent = where.parent  # the checkpoints folder itself: its model is the folder above
        return where, (str(parent) if (parent / WEIGHTS).is_file() and where.name == CHECKPOINTS else None)
    raise ValueError(
        f"{name} holds no checkpoints (no {CHECKPOINTS}/ folder): train it with --checkpoint-every or "
        "--checkpoint-log, or name several models, one per step"
    )


def _by_step(members: list[Member]) -> list[Member]:
    members = sorted(members, key=lambda m: m.step)
    for a, b in zip(members, members[1:]):
        if a.step == b.step:
            raise ValueError(f"two models have step {a.step} ({a.source} and {b.source}); each step appears once")
    return members


def _same_config(pairs: list[tuple[Member, ModelConfig]]) -> ModelConfig:
    first_member, first = pairs[0]
    ref = dataclasses.asdict(first)
    for member, cfg in pairs[1:]:
        if cfg != first:
            other = dataclasses.asdict(cfg)
            key = next((k for k in ref if ref[k] != other.get(k)), "?")
            raise ValueError(
                f"the models of a series must share one architecture: step {member.step} has {key}={other.get(key)!r}, "
                f"step {first_member.step} has {key}={ref[key]!r}"
            )
    return first


def _header(path: Path) -> dict:
    """The ``__metadata__`` of a safetensors file, reading its header only."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path.name} is too short to be a safetensors file")
        n = int.from_bytes(head, "little")
        if not 0 < n <= MAX_HEADER:
            raise CheckpointError(f"{path.name} has no readable safetensors header")
        return checkpoint.metadata(head + f.read(n))


def _header_config(path: Path) -> ModelConfig:
    text = _header(path).get("config")
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
    if folder is not None and hf.is_hf_folder(folder):
        return hf.model_config(hf.hf_config(folder))
    if folder is not None and (folder / CONFIG).is_file():
        return checkpoint.read_config(folder / CONFIG)
    if path.is_file():
        return _header_config(path)
    raise CheckpointError(f"{source} has no weights ({path} is missing)")


def available(store: RunStore | None = None, problems: list[str] | None = None) -> list[dict]:
    """Sources that hold checkpoints, newest runs first, then named models: {source, label,
    checkpoints} (a running run included: its checkpoints so far). A folder whose checkpoints
    cannot be listed (a broken index, a link leading out) is left out, never fatal: one sentence
    naming it goes to ``problems`` when a list is given."""
    out = []
    store = store or RunStore()
    try:
        runs = store.list_runs()
    except ValueError:  # an unreadable store: the named models are still listed
        runs = []
    found = [(f"{sources.RUN_PREFIX}{r['id']}", store.path(r["id"]), f"{r['parent']}, {r['status']}, ") for r in runs]
    found += [(m["name"], Path(m["path"]), "") for m in zoo.list_models(problems=[]) if m.get("path")]
    for source, where, about in found:
        folder = where / CHECKPOINTS
        try:
            n = len(ckpt.read_series(folder)) if folder.is_dir() else 0
        except (OSError, CheckpointError) as e:
            if problems is not None:
                problems.append(f"skipped the checkpoints of {source}: {e}")
            continue
        if n:
            out.append({"source": source, "label": f"{source} ({about}{n} checkpoints)", "checkpoints": n})
    return out
