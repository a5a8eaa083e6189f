"""Metrics over a series: :func:`dynamics` measures every member (``metrics.measure``) on the same
held-out inputs and finds the phase change (``phase``); :class:`MetricCache` keeps each member's
result on disk, keyed by the member's file (path, size, modification time), the inputs and the
settings, so a second call reads instead of computing and says how many it read."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from attn_core.checkpoint import CheckpointError
from attn_core.dynamics.metrics import Inputs, Measured, measure, task_inputs
from attn_core.dynamics.phase import phase_change
from attn_core.dynamics.series import Series, header_params
from attn_core.regularizers import head_label
from attn_core.runs import RunStore, default_root

VERSION = 2  # of what a cached entry holds; bump when a metric's definition changes
CACHE_DIR = "dynamics-cache"  # in the run store's folder: $ATTN_LAB_RUNS, else the user data folder


class MetricCache:
    """One JSON file per (member, inputs, settings) under ``folder`` (default: the data
    directory's ``dynamics-cache``), at most ``max_bytes`` in all: a write that goes over removes
    the least recently used entries (a hit marks its entry used) until the folder is at 3/4 of
    it. ``hits`` and ``misses`` count this object's lookups. A folder that takes no write makes
    the cache read-only (``write_errors`` counts the failed writes)."""

    MAX_BYTES = 64 * 2**20

    def __init__(self, folder: str | Path | None = None, max_bytes: int = MAX_BYTES):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be a whole number of bytes >= 1, got {max_bytes!r}")
        self.folder = Path(folder) if folder is not None else default_root() / CACHE_DIR
        self.max_bytes = max_bytes
        self.hits = self.misses = self.write_errors = self.evicted = 0

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> Measured | None:
        path = self._path(key)
        try:
            raw = json.loads(path.read_text())
            found = Measured(dict(raw["values"]), list(raw["k_composition"]))
        except (OSError, ValueError, KeyError, TypeError):
            self.misses += 1
            return None
        self.hits += 1
        try:
            os.utime(path)  # used now: the last to go when the folder is trimmed
        except OSError:
            pass
        return found

    def put(self, key: str, value: Measured) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self._path(f".{key}.tmp-{os.getpid()}")
            tmp.write_text(json.dumps({"values": value.values, "k_composition": value.k_composition}))
            os.replace(tmp, self._path(key))
        except OSError:
            self.write_errors += 1
            return
        self._trim(keep=self._path(key))

    def _trim(self, keep: Path) -> None:
        """Remove the least recently used entries (never ``keep``, the one just written) while
        the folder holds more than ``max_bytes``, down to 3/4 of it."""
        entries = []
        for path in self.folder.glob("*.json"):
            try:
                st = path.stat()
            except OSError:  # removed meanwhile (another process trims too)
                continue
            entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        if total <= self.max_bytes:
            return
        for _, size, path in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes * 3 // 4:
                break
            if path == keep:
                continue
            try:
                path.unlink()
            except OSError:
                continue
            total -= size
            self.evicted += 1


@dataclass
class Dynamics:
    """Metrics of a series: ``steps``, ``metrics`` (name -> one value per step, None where not
    measurable), the ``phase_change`` (or None), per step the K-composition matrix between heads
    in ``order`` (their ``layers``), and the cache's ``hits``/``misses``."""

    steps: list[int]
    metrics: dict[str, list[float | None]]
    phase_change: dict | None
    k_composition: list[list[list[float | None]]]
    order: list[str]
    layers: list[int]
    inputs: str = ""
    partial: list[bool] = field(default_factory=list)
    hits: int = 0
    misses: int = 0

    def to_json(self) -> dict:
        """What ``attn-lab dynamics --json`` prints: steps, metrics, phase_change, and the inputs
        they were measured on (which positions the ICL score compares)."""
        return {"steps": self.steps, "metrics": self.metrics, "phase_change": self.phase_change, "inputs": self.inputs}

    def series(self, name: str) -> list[float | None]:
        if name not in self.metrics:
            raise KeyError(f"no metric {name!r}; the metrics are {', '.join(self.metrics)}")
        return self.metrics[name]

    def k_from(self, writer: str, reader: str) -> list[float | None]:
        """K-composition from head ``writer`` into head ``reader`` at every step (labels L0H3)."""
        i, j = self.order.index(writer), self.order.index(reader)
        return [k[i][j] for k in self.k_composition]


def cache_key(member_key: str, inputs: Inputs | None, detector_samples: int, seed: int, partial: bool) -> str:
    text = json.dumps([VERSION, member_key, inputs.digest if inputs else None, detector_samples, seed, partial])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def default_inputs(
    series: Series, store: RunStore | None = None, samples: int = 256, seed: int = 0, early=None, late=None
) -> Inputs | None:
    """Held-out inputs of the series' task, or None when it has none. The task is the series' own
    (its run's or folder's), else the reference model's card.json (no weights loaded), else the
    first member's."""
    from attn_core.checkpoint import CARD, read_card
    from attn_core.sources import weights_path
    from attn_core.tasks import TASKS

    name = series.task
    if name is None and series.reference is not None:
        name = read_card(weights_path(series.reference, store).parent / CARD).task
    if name is None:
        name = series.load(series.members[0], store).card.task
    task = TASKS.get(name or "")
    if task is None or task.d_vocab != series.config.d_vocab or task.n_ctx > series.config.n_ctx:
        return None
    return task_inputs(task, samples, seed, early, late)


def dynamics(
    series: Series,
    inputs: Inputs | None,
    *,
    detector_samples: int = 32,
    seed: int = 0,
    cache: MetricCache | None = None,
    store: RunStore | None = None,
    progress: Callable[[int, int], None] | None = None,
    by: str = "icl_score",
) -> Dynamics:
    """Measure every member of ``series`` (reading what ``cache`` holds) and find the phase change
    of the ``by`` metric. ``progress(done, total)`` after each member."""
    if inputs is not None and int(inputs.tokens.max()) >= series.config.d_vocab:
        raise ValueError("the inputs hold tokens outside the series' vocabulary")
    if inputs is not None and inputs.tokens.shape[1] > series.config.n_ctx:
        raise ValueError(f"inputs of {inputs.tokens.shape[1]} tokens exceed the context of {series.config.n_ctx}")
    rows: list[Measured] = []
    partial: list[bool] = []
    for i, member in enumerate(series.members):
        is_partial = member.checkpoint and series.partial and _partial_file(member.file)
        key = cache_key(member.key, inputs, detector_samples, seed, is_partial)
        found = cache.get(key) if cache is not None else None
        if found is None:
            loaded = series.load(member, store)
            found = measure(loaded.model, inputs, detector_samples, seed, partial=is_partial)
            if cache is not None:
                cache.put(key, found)
        rows.append(found)
        partial.append(is_partial)
        if progress is not None:
            progress(i + 1, len(series.members))
    steps = series.steps
    names = list(rows[0].values)
    metrics = {n: [r.values.get(n) for r in rows] for n in names}
    if by not in metrics:
        raise ValueError(f"the phase change is found on a measured metric; {by!r} is not one")
    cfg = series.config
    order = [head_label(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    return Dynamics(
        steps=steps,
        metrics=metrics,
        phase_change=phase_change(steps, metrics[by], by=by),
        k_composition=[r.k_composition for r in rows],
        order=order,
        layers=[l for l in range(cfg.n_layers) for _ in range(cfg.n_heads)],
        inputs=inputs.describe() if inputs is not None else "no inputs: only the weight metrics",
        partial=partial,
        hits=cache.hits if cache is not None else 0,
        misses=cache.misses if cache is not None else 0,
    )


def _partial_file(path: Path) -> bool:
    try:
        return header_params(path) != "all"
    except (OSError, CheckpointError):
        return False


def text_ids(loaded, text: str) -> list[int]:
    """Token ids of a text for a member of the series: through its folder's tokenizer.json, else
    (a model with a task) the text's space-separated token names; one sentence otherwise."""
    from attn_core.bilinear import tokenizer
    from attn_core.hf import tokenizer as hf_tokenizer

    tok = tokenizer(loaded)
    if tok is not None:
        return hf_tokenizer.encode(tok, text)
    if loaded.task is not None:
        index = {n: i for i, n in enumerate(loaded.task.token_names)}
        words = text.split()
        unknown = [w for w in words if w not in index]
        if unknown:
            raise ValueError(f"{len(unknown)} words of the text are not tokens of the task (first: {unknown[0]!r})")
        return [index[w] for w in words]
    raise ValueError(f"{loaded.name} has no tokenizer.json and no task: its text cannot be tokenized")


def step_views(series: Series, tokens: list[int], layer: int, head: int, store: RunStore | None = None):
    """Per member: the sequence view of ``tokens`` at ``layer`` and the singular values of the
    head's B (``bilinear.spectrum_frame`` rows), what the animation shows."""
    from attn_core.bilinear import sequence_view, spectrum_frame

    views, spectra = [], []
    for member in series.members:
        loaded = series.load(member, store)
        views.append(sequence_view(loaded, tokens, layer))
        frame = spectrum_frame(loaded.model)
        spectra.append(frame[(frame["layer"] == layer) & (frame["head"] == head)])
    return views, spectra
