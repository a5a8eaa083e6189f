"""What a sweep runs: the grid of (regularizer, lambda) pairs, the seeds, the lambda = 0 baseline
per seed, each trial as the :class:`~attn_core.training.config.JobConfig` that ``attn-lab retrain``
builds for the same spec, seed and steps; and the accuracy-vs-entropy Pareto frontier of the
results. Pure Python: nothing here imports Ray."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from attn_core import regularizers as R
from attn_core.training.config import JobConfig
from attn_core.validate import is_int, is_number

BASELINE = "none"  # the regularizer name of a lambda = 0 trial
# Trials of one sweep (seeds x (lambdas + a baseline)): each is a retrain, seconds to minutes, so a
# sweep beyond this is a typo (a 5,000-point grid, --seeds 1000000000), refused before it starts.
MAX_TRIALS = 1_000
# JobConfig fields a sweep may set for every trial: all but the trial's own (source, regularizers,
# seed, entmax_alpha), read from JobConfig so that a new setting is a sweep setting too
TRIAL_FIELDS = ("source", "regularizers", "seed", "entmax_alpha")
JOB_FIELDS = tuple(f.name for f in fields(JobConfig) if f.name not in TRIAL_FIELDS)
TEXT_PATHS = ("text", "eval_text")  # made absolute in the plan: a worker reads them from its own folder


class SweepError(ValueError):
    """A sweep that cannot run (bad grid, Ray missing, cluster unreachable): one sentence."""


class SweepInterrupted(SweepError):
    """Ctrl-C before the sweep began: nothing was run or recorded."""


@dataclass(frozen=True)
class Trial:
    """One retrain of a sweep: ``source`` fine-tuned with ``reg`` at strength ``lam`` (``reg`` is
    :data:`BASELINE` and ``lam`` 0 for the unregularized reference) under ``seed``;
    ``entmax_alpha`` None keeps the parent's attention."""

    source: str
    reg: str
    lam: float
    seed: int
    entmax_alpha: float | None = None

    @property
    def key(self) -> str:
        """The trial's name inside its sweep (``induction-2l/entropy=0.1/seed=2``), unique per sweep."""
        alpha = "" if self.entmax_alpha is None else f"/alpha={self.entmax_alpha:g}"
        return f"{self.source}/{self.reg}={self.lam!r}{alpha}/seed={self.seed}"

    @property
    def spec(self) -> list[str]:
        """The ``--reg`` specs of the equivalent ``attn-lab retrain`` (none for the baseline)."""
        return [] if self.reg == BASELINE or self.lam == 0 else [f"{self.reg}={self.lam!r}"]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping) -> Trial:
        return cls(
            source=str(raw["source"]),
            reg=str(raw["reg"]),
            lam=float(raw["lam"]),
            seed=int(raw["seed"]),
            entmax_alpha=None if raw.get("entmax_alpha") is None else float(raw["entmax_alpha"]),
        )

    def job_config(self, job: Mapping | None = None):
        """The JobConfig of this trial: what ``attn-lab retrain SOURCE --reg SPEC --seed S`` builds,
        with the sweep's common ``job`` settings (steps, lr, ...)."""
        return JobConfig(
            source=self.source,
            regularizers=self.spec,
            entmax_alpha=self.entmax_alpha,
            seed=self.seed,
            **dict(job or {}),
        )


@dataclass
class SweepPlan:
    """A sweep's name (for the CLI, the model it sweeps), its trials and the JobConfig settings
    every trial shares. Stored with the sweep, so ``--resume`` knows what is left."""

    name: str
    trials: list[Trial]
    job: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.job) - set(JOB_FIELDS))
        if unknown:
            raise SweepError(f"unknown trial setting(s) {', '.join(unknown)}; known: {', '.join(JOB_FIELDS)}")
        if not self.trials:
            raise SweepError("the sweep has no trials")
        if len(self.trials) > MAX_TRIALS:
            raise SweepError(f"the sweep has {len(self.trials):,} trials; the limit is {MAX_TRIALS:,}")
        keys = [t.key for t in self.trials]
        if len(set(keys)) != len(keys):
            raise SweepError("the sweep lists a trial twice")
        self.trials[0].job_config(self.job)  # every setting is checked once, before anything starts

    def to_dict(self) -> dict:
        return {"name": self.name, "trials": [t.to_dict() for t in self.trials], "job": dict(self.job)}

    @classmethod
    def from_dict(cls, raw: Mapping) -> SweepPlan:
        return cls(name=str(raw["name"]), trials=[Trial.from_dict(t) for t in raw["trials"]], job=dict(raw["job"]))


def _base_name(name: str) -> str:
    return name.split(":", 1)[0].split("@", 1)[0]


def parse_grid(items: Sequence[str] | Mapping[str, Iterable[float]]) -> dict[str, list[float]]:
    """``["entropy=0.01,0.1,1", "hoyer=0.1,1"]`` (or a mapping) as {regularizer: [lambda, ...]}.

    A name is any :data:`attn_core.regularizers.REGULARIZERS` name, optionally with K and heads
    as in a spec (``topk:2``, ``entropy@L1``); lambdas are numbers > 0 (the lambda = 0 baseline
    is added per seed). Raises :class:`SweepError` with one sentence otherwise."""
    pairs: list[tuple[str, list]] = []
    if isinstance(items, Mapping):
        pairs = [(str(k), list(v)) for k, v in items.items()]
    else:
        for item in items:
            name, sep, lams = str(item).partition("=")
            if not sep or not name.strip():
                raise SweepError(f"--grid {item!r} is not NAME=LAMBDA[,LAMBDA...] (e.g. entropy=0.01,0.1,1)")
            pairs.append((name.strip(), [x.strip() for x in lams.split(",")]))
    grid: dict[str, list[float]] = {}
    for name, lams in pairs:
        if _base_name(name) not in R.REGULARIZERS:
            raise SweepError(
                f"unknown regularizer {_base_name(name)!r} in the grid; known: {', '.join(R.REGULARIZERS)}"
            )
        values = [_lambda(name, x) for x in lams]
        if not values:
            raise SweepError(f"--grid {name}= lists no lambda")
        try:
            R.parse_spec(f"{name}={values[0]!r}")  # K and heads are checked here
        except ValueError as e:
            raise SweepError(f"--grid {name}: {e}") from None
        grid[name] = list(dict.fromkeys([*grid.get(name, []), *values]))  # in order, each once
    if not grid:
        raise SweepError(
            "the grid is empty: give at least one --grid NAME=LAMBDA[,LAMBDA...] (e.g. --grid entropy=0.01,0.1,1)"
        )
    return grid


def _lambda(name: str, raw) -> float:
    try:
        value = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not (is_number(value) and math.isfinite(value) and value > 0):
        raise SweepError(
            f"lambda {raw!r} of {name} in the grid is not a number > 0 (the lambda = 0 baseline is added per seed)"
        )
    return value


def grid_plan(
    source: str, grid: Sequence[str] | Mapping, seeds: int = 1, *, baseline: bool = True, name: str | None = None, **job
) -> SweepPlan:
    """Every (regularizer, lambda, seed) of ``grid`` on ``source``, seeds 0..seeds-1, plus a
    lambda = 0 baseline per seed; ``job`` are the shared JobConfig settings (steps, lr, ...)."""
    if not (is_int(seeds) and seeds >= 1):
        raise SweepError(f"--seeds must be a positive integer, got {seeds!r}")
    if seeds > MAX_TRIALS:
        raise SweepError(f"--seeds must be at most {MAX_TRIALS:,} (the limit on a sweep's trials), got {seeds:,}")
    if not (isinstance(source, str) and source.strip()):
        raise SweepError("the sweep needs a model: a zoo name, a folder, run:<id> or scratch:<preset>")
    parsed = parse_grid(grid)
    n = seeds * (int(baseline) + sum(len(lams) for lams in parsed.values()))
    if n > MAX_TRIALS:
        raise SweepError(
            f"the sweep would have {n:,} trials (seeds x (lambdas + a baseline)); the limit is {MAX_TRIALS:,}"
        )
    for key in TEXT_PATHS:
        if isinstance(job.get(key), str) and job[key].strip():
            job[key] = str(Path(job[key]).expanduser().absolute())
    trials = []
    for seed in range(seeds):
        if baseline:
            trials.append(Trial(source, BASELINE, 0.0, seed))
        trials += [Trial(source, reg, lam, seed) for reg, lams in parsed.items() for lam in lams]
    try:
        return SweepPlan(name or source, trials, {k: v for k, v in job.items() if v is not None})
    except SweepError:
        raise
    except ValueError as e:  # JobConfig's own checks (steps, lr ...)
        raise SweepError(str(e)) from None


def pareto(points: Iterable[tuple[str, float, float]]) -> list[str]:
    """The ids of the (id, accuracy, entropy) points on the frontier (maximise accuracy, minimise
    entropy), ordered by entropy; points with a non-finite value are left out."""
    pts = [(i, a, h) for i, a, h in points if a is not None and h is not None and math.isfinite(a) and math.isfinite(h)]
    front = [p for p in pts if not any(q[1] >= p[1] and q[2] <= p[2] and (q[1] > p[1] or q[2] < p[2]) for q in pts)]
    return [p[0] for p in sorted(front, key=lambda p: (p[2], -p[1]))]
