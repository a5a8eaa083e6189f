"""Metrics over a series: :func:`dynamics` measures every member (``metrics.checkpoint_metrics``) on the same
held-out inputs and finds the phase change (``phase``); a :class:`~attn_core.dynamics.cache.MetricCache`
keeps each member's result on disk, keyed by the member's files (path, size, modification time),
the inputs and the settings, so a second call reads instead of computing and says how many it
read. A member that cannot be loaded (a damaged file) is skipped with its reason, as the series
skips those it cannot list; the others are measured."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attn_core.checkpoint import CheckpointError
from attn_core.dynamics.cache import MetricCache
from attn_core.dynamics.metrics import Inputs, Measured, checkpoint_metrics, task_inputs, text_inputs
from attn_core.dynamics.phase import phase_change
from attn_core.dynamics.series import Series, Skipped, header_params
from attn_core.regularizers import head_label
from attn_core.runs import RunStore
from attn_core.text.corpus import MAX_WORDS_BYTES

VERSION = 2  # of what a cached entry holds; bump when a metric's definition changes


@dataclass
class Dynamics:
    """Metrics of a series: ``steps`` (those measured), ``tokens`` seen at each (or None),
    ``metrics`` (name -> one value per step, None where not measurable), the ``phase_change``
    (or None), per step the K-composition matrix between heads in ``order`` (their ``layers``),
    the checkpoints ``skipped`` with their reasons, and the cache's ``hits``/``misses`` (and
    ``refused``: entries that failed their checks and were measured again, ``reasons``)."""

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
    skipped: list[Skipped] = field(default_factory=list)
    tokens: list[int | None] | None = None
    refused: int = 0
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """What ``attn-lab dynamics --json`` prints: steps (and tokens), metrics, phase_change, the
        inputs they were measured on (which positions the ICL score compares) and the checkpoints
        skipped, each with its step, source and reason."""
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "metrics": self.metrics,
            "phase_change": self.phase_change,
            "inputs": self.inputs,
            "skipped": [s.to_json() for s in self.skipped],
        }

    def series(self, name: str) -> list[float | None]:
        if name not in self.metrics:
            raise KeyError(f"no metric {name!r}; the metrics are {', '.join(self.metrics)}")
        return self.metrics[name]

    def k_from(self, writer: str, reader: str) -> list[float | None]:
        """K-composition from head ``writer`` into head ``reader`` at every step (labels L0H3)."""
        i, j = self.order.index(writer), self.order.index(reader)
        return [k[i][j] for k in self.k_composition]

    def thinned(self, most: int) -> Dynamics:
        """At most ``most`` (>= 2) of the steps, evenly spaced in their order, the first and the last
        and the phase-change window's ends among them, with their values unchanged: what curves
        of a long series draw (every step stays measured; ``self`` when it has no more)."""
        n = len(self.steps)
        if n <= most:
            return self
        keep = {round(i * (n - 1) / (most - 1)) for i in range(most)}
        if self.phase_change is not None:
            keep |= {i for i, s in enumerate(self.steps) if s in self.phase_change["window"]}
        idx = sorted(keep)

        def pick(values):
            return None if values is None else [values[i] for i in idx]

        return dataclasses.replace(
            self,
            steps=pick(self.steps),
            metrics={k: pick(v) for k, v in self.metrics.items()},
            k_composition=pick(self.k_composition),
            partial=pick(self.partial) if self.partial else [],
            tokens=pick(self.tokens),
        )


def cache_key(member_key: str, inputs: Inputs | None, detector_samples: int, seed: int, partial: bool) -> str:
    text = json.dumps([VERSION, member_key, inputs.digest if inputs else None, detector_samples, seed, partial])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def default_inputs(
    series: Series, store: RunStore | None = None, samples: int = 256, seed: int = 0, early=None, late=None
) -> Inputs | None:
    """Held-out inputs of the series' task, or None when it has none. The task is the series' own
    (its run's or folder's), else the reference model's card.json (no weights loaded), else the
    first member that loads."""
    from attn_core.checkpoint import CARD, read_card
    from attn_core.sources import weights_path
    from attn_core.tasks import TASKS

    name = series.task
    if name is None and series.reference is not None:
        name = read_card(weights_path(series.reference, store).parent / CARD).task
    if name is None:
        name = series.first_loaded(store).card.task
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
    of the ``by`` metric. A member that cannot be loaded is skipped with its reason (one sentence);
    when none can be, a ValueError says why the first could not. ``progress(done, total)`` after
    each member."""
    if inputs is not None and int(inputs.tokens.max()) >= series.config.d_vocab:
        raise ValueError("the inputs hold tokens outside the series' vocabulary")
    if inputs is not None and inputs.tokens.shape[1] > series.config.n_ctx:
        raise ValueError(f"inputs of {inputs.tokens.shape[1]} tokens exceed the context of {series.config.n_ctx}")
    cfg = series.config
    n_heads = cfg.n_layers * cfg.n_heads
    rows: list[Measured] = []
    partial: list[bool] = []
    kept, skipped = [], list(series.skipped)
    for i, member in enumerate(series.members):
        try:
            is_partial = member.checkpoint and series.partial and _partial_file(member.file)
            key = cache_key(member.key, inputs, detector_samples, seed, is_partial)
            found = cache.get(key, n_heads) if cache is not None else None
            if found is None:
                loaded = series.load(member, store)
                found = checkpoint_metrics(loaded.model, inputs, detector_samples, seed, partial=is_partial)
                if cache is not None:
                    cache.put(key, found)
        except (CheckpointError, OSError) as e:
            skipped.append(Skipped(member.step, member.source, " ".join(str(e).split())[:300]))
        else:
            rows.append(found)
            partial.append(is_partial)
            kept.append(member)
        if progress is not None:
            progress(i + 1, len(series.members))
    if not rows:
        raise ValueError(f"no checkpoint of {series.name} can be measured ({skipped[0].line()})")
    steps = [m.step for m in kept]
    names = list(rows[0].values)
    metrics = {n: [r.values.get(n) for r in rows] for n in names}
    if by not in metrics:
        raise ValueError(f"the phase change is found on a measured metric; {by!r} is not one")
    order = [head_label(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    tokens = [m.tokens for m in kept]
    return Dynamics(
        steps=steps,
        metrics=metrics,
        phase_change=phase_change(steps, metrics[by], by=by, loss=metrics.get("loss")),
        k_composition=[r.k_composition for r in rows],
        order=order,
        layers=[l for l in range(cfg.n_layers) for _ in range(cfg.n_heads)],
        inputs=inputs.describe() if inputs is not None else "no inputs: only the weight metrics",
        partial=partial,
        hits=cache.hits if cache is not None else 0,
        misses=cache.misses if cache is not None else 0,
        skipped=sorted(skipped, key=lambda s: (s.step is None, s.step or 0, s.source)),
        tokens=tokens if any(t is not None for t in tokens) else None,
        refused=cache.refused if cache is not None else 0,
        reasons=list(cache.reasons) if cache is not None else [],
    )


def _partial_file(path: Path) -> bool:
    try:
        return header_params(path) != "all"
    except (OSError, ValueError):
        return False


MAX_TEXT_BYTES = MAX_WORDS_BYTES  # of a text of a task's token names (a text for a tokenizer: the corpus limits)


def read_text(path: str | Path) -> str:
    """A UTF-8 text file of at most :data:`MAX_TEXT_BYTES` (a regular file: ``limits.read_file``)."""
    from attn_core import limits

    raw = limits.read_file(path, MAX_TEXT_BYTES, str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None


def series_text_inputs(
    series: Series, text: str | Path, length: int | None, samples: int, early=None, late=None, store=None
) -> Inputs:
    """Windows of the text file ``text`` (``length`` tokens each, default the context up to 128)
    tokenized for the series by a tokenizer.json: of its folder (the run's, or its checkpoints
    folder's, where a text run writes it when it starts), else of the first member that loads.
    That text is read as retrain, spectrum and sinks read theirs (``text.source.tokenize_text``:
    a .txt/.jsonl/.parquet file or folder, the corpus limits, the token cache), so every command
    takes the same texts. A model without a tokenizer reads the text's space-separated token
    names of its task (:func:`text_ids`, a file of at most :data:`MAX_TEXT_BYTES`)."""
    from attn_core.hf.tokenizer import TOKENIZER
    from attn_core.text.source import tokenize_text

    cfg = series.config
    length = min(cfg.n_ctx, 128) if length is None else length
    if not 2 <= length <= cfg.n_ctx:
        raise ValueError(f"--length must be 2..{cfg.n_ctx} (the context), got {length}")
    found = [f for f in series.folders if f.is_dir() and os.path.lexists(f / TOKENIZER)]
    if not found:
        loaded = series.first_loaded(store)
        own = Path(loaded.path) if loaded.path is not None and Path(loaded.path).is_dir() else None
        if own is None or not os.path.lexists(own / TOKENIZER):
            return text_inputs(text_ids(loaded, read_text(text)), length, samples, early, late)
        found = [own]
    root = store.root if store is not None else None
    _, done = tokenize_text(found[0], series.name, str(text), cache_root=root)
    ids = np.concatenate([token_file.array() for _, token_file in done]).tolist()
    return text_inputs(ids, length, samples, early, late)


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


def step_views(series: Series, tokens: list[int], layer: int, head: int, store: RunStore | None = None, steps=None):
    """Per member (of ``steps``, default all): the sequence view of ``tokens`` at ``layer`` and the
    singular values of the head's B (``bilinear.spectrum_frame`` rows), what the animation shows."""
    from attn_core.bilinear import sequence_view, spectrum_frame

    views, spectra = [], []
    for step in series.steps if steps is None else steps:
        loaded = series.load(step, store)
        views.append(sequence_view(loaded, tokens, layer))
        frame = spectrum_frame(loaded.model)
        spectra.append(frame[(frame["layer"] == layer) & (frame["head"] == head)])
    return views, spectra
