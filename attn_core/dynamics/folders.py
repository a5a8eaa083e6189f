"""A folder of model folders, one per checkpoint: what a user has of a published checkpoint series
(Pythia's ``step1000`` revisions, OLMo's ``step1000-tokens4B``, PolyPythias), downloaded as
Hugging Face folders. This module lists such a folder without reading any weights; the series
is built from the list by ``dynamics.series`` (each member's config read and checked there,
its weights only when it is measured).

The members are, in order of preference:

- the rows of a **manifest** in the folder, ``series.json`` (``{"checkpoints": [{"step": 1000,
  "tokens": 2097152000, "folder": "step1000"}, ...]}`` or the list alone) or ``series.csv``
  (a header ``step,folder[,tokens]``, one row per checkpoint);
- else every subfolder whose name carries a step (:func:`step_of_name`: ``step1000``,
  ``checkpoint-1000``, ``step1000-tokens4B``, ``1000`` ...).

Every folder a manifest names, and every subfolder, must lie inside the folder (``..``, an
absolute path and a link leading out are refused, as for every file of a model folder:
``untrusted.model_file``). What cannot be a member (a row without a whole step, a step past
``limits.MAX_STEPS``, a folder named twice, a subfolder holding a config but no step in its
name) is a *problem*: (step or None, name, reason), skipped by the series with its reason.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

from attn_core import limits, untrusted
from attn_core.checkpoint import CONFIG, CheckpointError
from attn_core.validate import is_int, whole_number

MANIFESTS = ("series.json", "series.csv")
MAX_MANIFEST_BYTES = 4 * 2**20
# ASCII digits only (re.ASCII): a name's "²" or "٣" is no step
_STEP = re.compile(r"(?:^|[^a-z])(?:step|checkpoint|ckpt|iter|iteration)[-_ ]?(\d+)(?!.*\d)", re.I | re.A)
_OLMO = re.compile(r"(?:^|[^a-z])step[-_]?(\d+)[-_]tokens[-_]?(\d+)([KMBT]?)$", re.I | re.A)
_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}

Problem = tuple[int | None, str, str]  # (step or None, the name, why it is skipped)


def step_and_tokens(name: str) -> tuple[int | None, int | None]:
    """(the training step, the tokens seen) a folder or file name carries: the last ``step…`` /
    ``checkpoint-…`` number or the whole name when it is a number, and OLMo's
    ``step1000-tokens4B`` (4 x 10^9 tokens); None where it carries none."""
    stem = Path(str(name).rstrip("/")).name.removesuffix(".safetensors")
    if whole_number(stem) is not None:
        return whole_number(stem), None
    m = _OLMO.search(stem)
    if m:
        return int(m.group(1)), int(m.group(2)) * _SCALE[m.group(3).upper()]
    m = _STEP.search(stem)
    return (int(m.group(1)), None) if m else (None, None)


def step_of_name(name: str) -> int | None:
    """The training step a folder or file name carries (:func:`step_and_tokens`), None when none."""
    return step_and_tokens(name)[0]


@dataclass(frozen=True)
class CheckpointEntry:
    """One listed checkpoint: its step, the tokens seen when known, its folder."""

    step: int
    tokens: int | None
    folder: Path


def manifest(folder: Path) -> Path | None:
    """The folder's manifest file (``series.json`` or ``series.csv``), None when it has none."""
    for name in MANIFESTS:
        if (folder / name).exists() or (folder / name).is_symlink():
            return folder / name
    return None


def is_model_folders(folder: str | Path) -> bool:
    """Whether ``folder`` holds a checkpoint series of model folders: a manifest, or a subfolder
    whose name carries a step and that holds a config.json (nothing else is read)."""
    folder = Path(folder)
    try:
        if not folder.is_dir():
            return False
        if manifest(folder) is not None:
            return True
        return any(
            not p.name.startswith(".") and step_of_name(p.name) is not None and (p / CONFIG).is_file()
            for p in folder.iterdir()
        )
    except OSError:
        return False


def entries(folder: str | Path, limit: int) -> tuple[list[CheckpointEntry], list[Problem]]:
    """The checkpoints ``folder`` lists (see the module doc), by step, and the problems; at most
    ``limit`` entries (a LimitError past it)."""
    folder = Path(folder)
    found = manifest(folder)
    rows, problems = _manifest_rows(found) if found is not None else _subfolders(folder, limit)
    if len(rows) > limit:
        raise limits.LimitError(f"{folder.name} lists {len(rows):,} checkpoints, more than {limit:,} in one series")
    out: list[CheckpointEntry] = []
    seen: dict[Path, int] = {}
    for step, tokens, name in rows:
        why = _bad_step(step)
        if why is None and tokens is not None and not (is_int(tokens) and tokens >= 0):
            why = f"its tokens {str(tokens)[:40]!r} are not a whole number >= 0"
        if why is None:
            try:
                where = untrusted.model_file(folder, name)
            except CheckpointError as e:
                why = str(e)
            else:
                if not where.is_dir():
                    why = "is not a folder"
                elif where in seen:
                    why = f"is named twice (also at step {seen[where]})"
        if why is not None:
            problems.append((step if isinstance(step, int) else None, str(name)[:200], why))
            continue
        seen[where] = step
        out.append(CheckpointEntry(step, tokens, where))
    return sorted(out, key=lambda e: e.step), problems


def _bad_step(step) -> str | None:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return f"its step {str(step)[:40]!r} is not a whole number >= 0"
    if step > limits.MAX_STEPS:
        return f"its step {step:,} is past {limits.MAX_STEPS:,}, the most steps of a run"
    return None


def _subfolders(folder: Path, limit: int) -> tuple[list[tuple], list[Problem]]:
    rows, problems = [], []
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or not (p.is_dir() or p.is_symlink()):
            continue
        step, tokens = step_and_tokens(p.name)
        if step is not None:
            rows.append((step, tokens, p.name))
        elif (p / CONFIG).is_file():
            problems.append(
                (None, p.name, "its name carries no step (step1000, checkpoint-1000); list it in series.csv")
            )
        if len(rows) > limit:
            break
    return rows, problems


def _cell(text: str) -> int | str | None:
    """A CSV cell: a whole number as an int, else the text (None when empty)."""
    number = whole_number(text)
    return number if number is not None else (text or None)


def _manifest_rows(path: Path) -> tuple[list[tuple], list[Problem]]:
    """(step, tokens, folder name) rows of a manifest; a CheckpointError when it is unreadable."""
    data = untrusted.read_bytes(untrusted.model_file(path.parent, path.name), MAX_MANIFEST_BYTES)
    if path.suffix == ".json":
        raw = untrusted.parse_json(data, path.name, MAX_MANIFEST_BYTES)
        raw = raw.get("checkpoints") if isinstance(raw, dict) else raw
        if not isinstance(raw, list):
            raise CheckpointError(f'{path.name} must hold a list of checkpoints ({{"checkpoints": [...]}})')
        records = [(i + 1, r) for i, r in enumerate(raw)]
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise CheckpointError(f"{path.name} is not UTF-8 text") from None
        reader = csv.DictReader(io.StringIO(text))
        fields = [str(f).strip().lower() for f in reader.fieldnames or []]
        if "step" not in fields or "folder" not in fields:
            raise CheckpointError(f"{path.name} needs a header row naming the columns step and folder (and tokens)")
        records = []
        try:
            for i, row in enumerate(reader):
                row = {str(k).strip().lower(): (v or "").strip() for k, v in row.items() if isinstance(v, str)}
                records.append((i + 2, {k: _cell(v) for k, v in row.items()}))
        except csv.Error as e:
            raise CheckpointError(f"{path.name} is not CSV ({e})") from None
    rows, problems = [], []
    for line, r in records:
        if not isinstance(r, dict) or not isinstance(r.get("folder"), str):
            problems.append((None, f"{path.name} entry {line}", "names no folder"))
            continue
        rows.append((r.get("step"), r.get("tokens"), r["folder"]))
    return rows, problems
