"""The front door: attn-lab from Python, in a notebook or a script (docs/python.md).

    >>> import attn_core as al
    >>> m = al.load("induction-2l")
    >>> m
    Model('induction-2l': 2 layers x 4 heads, d_model 64, task induction)
    >>> round(float(m.QK[1, 0].stable_rank), 2)
    5.19

One model type: :func:`load` returns a :class:`Model`, which is a ``LoadedModel`` (what the
sources, views and jobs take) with the heads' forms as ``m.QK[l, h]`` and ``m.OV[l, h]``; every
library function takes it, a ``LoadedModel`` or a bare ``Transformer`` (``bilinear.check_model``
and ``check_loaded`` convert it at the top). The analyses return pandas DataFrames with the
columns of the CLI's ``--json`` of the same command (the rest of that document in ``df.attrs``),
built by the code the CLI runs (:mod:`attn_core.documents`); a view's ``plot`` is the CLI's and
the page's figure (:class:`attn_core.figures.Plot`), drawn inline by Jupyter and written with
``.save(path)`` as ``attn-lab export`` writes it; :func:`retrain` runs a
:class:`attn_core.retraining.job.TrainingJob` with a progress bar. ``import attn_core`` stays
light: these names are imported on first use (``attn_core/__init__.py``)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from attn_core import documents
from attn_core.api_checks import check_device, check_source, check_text, check_token_ids, positions
from attn_core.bilinear.checks import check_heads, check_layer, check_loaded
from attn_core.bilinear.heads import qk_form
from attn_core.bilinear.views import View
from attn_core.checkpoint import CheckpointError, LoadedModel
from attn_core.circuits.settings import N_SAMPLES
from attn_core.destinations import check_path
from attn_core.figures.base import Plot
from attn_core.limits import MAX_SAMPLES, check_count
from attn_core.model import Transformer
from attn_core.model.qk_form import QKForm
from attn_core.validate import check_bool, check_int, check_seed, integral, is_int, shown

__all__ = ["Model", "HeadView", "Retrained", "load", "spectrum", "sinks", "heads", "circuits", "dynamics"]
__all__ += ["view", "long_view", "retrain"]


@dataclass(repr=False)
class Model(LoadedModel):
    """A model and what is known about it (a :class:`LoadedModel`: ``.model`` the Transformer,
    ``.cfg``, ``.card``, ``.task``), with the forms of its heads:

    >>> m = load("induction-2l")
    >>> m.QK[1, 0]
    QKForm(factored r=16, shape=[64, 64])
    >>> m.OV[0, 3].singular_values.shape
    torch.Size([16])
    """

    @classmethod
    def of(cls, obj: Model | LoadedModel | Transformer | str | Path) -> Model:
        """``obj`` as a Model: a name, folder or ``run:<id>`` is loaded (:func:`load`)."""
        if isinstance(obj, Model):
            return obj
        if isinstance(obj, (str, Path)):
            return load(obj)
        loaded = check_loaded(obj, "attn_core.Model")
        return cls(**{f.name: getattr(loaded, f.name) for f in fields(LoadedModel)})

    @property
    def QK(self) -> Heads:
        """``m.QK[l, h]``: the QK form B of head h of layer l (:class:`QKForm`: ``.B``,
        ``.singular_values``, ``.svd()``, ``.stable_rank``, rotary ``.at_offset(delta)``)."""
        return Heads(self, "QK")

    @property
    def OV(self) -> Heads:
        """``m.OV[l, h]``: W_OV = W_V W_O of head h of layer l as a factored :class:`QKForm`."""
        return Heads(self, "OV")

    def __repr__(self) -> str:
        c = self.cfg
        task = f", task {self.card.task}" if self.card.task else ""
        return f"Model({self.name!r}: {c.n_layers} layers x {c.n_heads} heads, d_model {c.d_model}{task})"


class Heads:
    """The forms of a model's heads, indexed ``[layer, head]`` (``Model.QK``, ``Model.OV``)."""

    def __init__(self, model: Model, kind: str) -> None:
        self.model, self.kind = model, kind

    def __getitem__(self, index: tuple[int, int]) -> QKForm:
        if not (isinstance(index, tuple) and len(index) == 2):
            raise IndexError(f"index the heads by [layer, head], e.g. m.{self.kind}[1, 0], got {shown(index)}")
        t = self.model.model
        layer, head = check_layer(t, index[0]), integral(index[1])
        if not is_int(head):  # a list, range, array or None is no one head: never the first of them in silence
            raise IndexError(
                f"m.{self.kind}[layer, head] takes one head index (an integer in 0..{t.cfg.n_heads - 1}), got "
                f"{shown(head)}; for several heads index each: [m.{self.kind}[{layer}, h] for h in heads]"
            )
        head = check_heads(t, head)[0]
        if self.kind == "OV":
            from attn_core.circuits.ov import ov_form

            return _detached(ov_form(t, layer)[head])
        form = qk_form(t, layer, head)
        out = _detached(form)
        out._at_offset = lambda delta: _detached(form.at_offset(delta))
        return out

    def __repr__(self) -> str:
        c = self.model.cfg
        return f"{self.kind} forms of {c.n_layers} layers x {c.n_heads} heads: index [layer, head]"


def _detached(form: QKForm) -> QKForm:
    """``form`` to look at: no gradient (a regularizer builds its forms with ``bilinear.qk_form``)."""
    if form.is_dense:
        return QKForm(dense=form.dense.detach())
    return QKForm(left=form.left.detach(), right=form.right.detach())


def load(source: str | Path, device: str = "cpu") -> Model:
    """The model a zoo name, a model or Hugging Face folder, ``run:<id>`` or ``upload: <name>``
    names (``attn_core.sources.resolve``), loaded and checked; one ``CheckpointError`` sentence
    when it names nothing.

    >>> load("induction-2l").cfg.n_layers
    2
    """
    from attn_core.sources import resolve

    return Model.of(resolve(check_source(source), check_device(device)))


def _frame(rows: list[dict], rest: dict | None = None) -> pd.DataFrame:
    df = pd.DataFrame([{k: v.tolist() if hasattr(v, "tolist") else v for k, v in r.items()} for r in rows])
    df.attrs.update(rest or {})
    return df


def spectrum(model, augmented: bool = False, text: str | Path | None = None, **probes) -> pd.DataFrame:
    """One row per head: the spectrum of B (singular values, eigenvalues of the symmetric part,
    norms, stable and effective rank) and the head's two ranks, of B and of its centred scores on
    probes (``text``, else the task's samples; ``samples``, ``length``, ``seed``, ``variance``,
    ``text_field`` as ``attn-lab spectrum`` takes them): the rows of ``attn-lab spectrum --json``.

    >>> df = spectrum(load("induction-2l"), samples=4)
    >>> df.loc[0, ["layer", "head", "rank_cap"]].tolist(), round(float(df.stable_rank[4]), 2)
    ([0, 0, 16], 5.19)
    """
    check_bool("augmented", augmented)
    return _frame(documents.spectrum_document(Model.of(model), augmented, check_text(text), **probes))


def sinks(model, text: str | Path | None = None, eps: float = 0.3, **probes) -> pd.DataFrame:
    """One row per head: the importance of its keys on probes (``text``, else the task's
    samples), whether it is a sink head (a key above ``eps``) and its strongest key: the heads of
    ``attn-lab sinks --json``; the sink rate and the rest of that document in ``df.attrs``.

    >>> df = sinks(load("induction-2l"), samples=4)
    >>> len(df), 0 <= df.attrs["rate"] <= 1
    (8, True)
    """
    found = documents.sinks_document(Model.of(model), check_text(text), eps=eps, **probes).to_json()
    return _frame(found.pop("heads"), found)


def heads(model, samples: int = documents.DETECTOR_SAMPLES, seed: int = 0, **options) -> pd.DataFrame:
    """One row per head: its previous-token, induction, duplicate-token and self scores (the
    heads of ``attn-lab heads --json``; the best head of each detector in ``df.attrs["best"]``).

    >>> df = heads(load("induction-2l"), samples=4)
    >>> df.columns.tolist()[:3], df.attrs["best"]["induction"]["layer"]
    (['layer', 'head', 'previous_token'], 1)
    """
    doc = documents.heads_document(Model.of(model), samples, seed, **options)
    return _frame(doc.pop("heads"), doc)


def circuits(model, samples: int = N_SAMPLES, seed: int = 0) -> pd.DataFrame:
    """One row per head: copying score, QK positivity and the singular values of W_OV (the heads
    of ``attn-lab circuits --json``; the composition scores and their baseline in ``df.attrs``).

    >>> circuits(load("induction-2l"), samples=8).columns.tolist()[:4]
    ['layer', 'head', 'copying_score', 'qk_positivity']
    """
    from attn_core.circuits import circuits_report

    m = Model.of(model)
    check_count("samples", samples, hi=MAX_SAMPLES)
    check_seed("seed", seed)
    doc = circuits_report(m, n_samples=samples, seed=seed)
    return _frame(doc.pop("heads"), doc)


DYNAMICS_OPTIONS = ("text", "length", "early", "late", "cache")  # dynamics()'s keywords beyond its arguments


def dynamics(
    source: str | Path | list, samples: int = 256, seed: int = 0, detector_samples: int = 32, **options
) -> pd.DataFrame:
    """One row per checkpoint of a series (a run, a folder with checkpoints/, a folder of model
    folders, or a list of models): its step and every metric ``attn-lab dynamics --json`` lists
    (loss, ICL score, prefix matching, ...); the phase change and the inputs in ``df.attrs``.
    ``text``, ``length``, ``early``/``late`` (positions (A, B)) and ``cache`` as the command's.

    >>> import tempfile
    >>> folder = retrain("induction-2l", steps=2, save=tempfile.mkdtemp(), checkpoint_every=1).model.path
    >>> dynamics(folder, samples=4, detector_samples=4)[["step", "loss"]].shape
    (3, 2)
    """
    from attn_core import dynamics as D

    unknown = [k for k in options if k not in DYNAMICS_OPTIONS]
    if unknown:
        raise TypeError(
            f"dynamics() got unknown options: {', '.join(unknown)} (it takes {', '.join(DYNAMICS_OPTIONS)})"
        )
    cache = check_bool("cache", options.pop("cache", True))
    check_count("detector_samples", detector_samples, hi=MAX_SAMPLES)
    if not isinstance(source, (str, Path, list)):
        raise TypeError(f"source must be a run, a folder or a list of models, got {type(source).__name__}")
    series = D.series([str(s) for s in source] if isinstance(source, list) else [str(source)])
    early, late = (positions(k, options.pop(k, None)) for k in ("early", "late"))
    inputs = documents.dynamics_inputs(
        series, samples, seed, early, late, check_text(options.pop("text", None)), options.pop("length", None)
    )
    found = D.dynamics(
        series, inputs, detector_samples=detector_samples, seed=seed, cache=D.MetricCache() if cache else None
    ).to_json()
    columns = {"step": found.pop("steps"), **({"tokens": found["tokens"]} if found["tokens"] else {})}
    found.pop("tokens")
    df = pd.DataFrame({**columns, **found.pop("metrics")})
    df.attrs.update(found)
    return df


class HeadView(View):
    """A view of one layer's heads on one input (:class:`attn_core.bilinear.View`: ``scores``,
    ``pattern``, ``frame()``...) that draws itself: :meth:`plot`."""

    def plot(self, head: int = 0, value: str = "scores", query: int | None = None) -> Plot:
        """The heatmap of S (``value="scores"``) or A (``"pattern"``) of ``head``: the figure the
        Heatmaps page and ``attn-lab export`` draw. Jupyter shows it; ``.fig`` is the plotly
        figure, ``.save("a.png")`` writes it (png, svg, html or csv).

        >>> view(load("induction-2l"), layer=1).plot(head=0)
        Plot('sequence_scores_L1H0')
        """
        from attn_core.figures.bilinear import VALUES, view_plot

        head = self.heads[self.head_index(head)]  # one of this view's heads, as an int
        if not isinstance(value, str) or value not in VALUES:
            raise ValueError(f"value must be one of {', '.join(VALUES)}, got {shown(value)}")
        if query is not None:
            query = check_int("query", query, 0, len(self.queries) - 1)
        return view_plot(self, head, query, value=value)


def view(model, text_or_tokens: str | list[int] | None = None, layer: int = 0, heads=None) -> HeadView:
    """The scores and pattern of ``layer``'s heads (default every head) on one input: typed
    text (the task's token names, or what the model's tokenizer makes of it), token ids, or
    None: a held-out sample of the model's task or text (random tokens, seed 0, for a model
    with neither).

    >>> v = view(load("induction-2l"), layer=1)
    >>> v.scores.shape[0], v.kind
    (4, 'sequence')
    """
    from attn_core.bilinear.tokens import input_ids, random_tokens
    from attn_core.bilinear.views import sequence_view
    from attn_core.text.source import has_sample, held_out_input

    m = Model.of(model)
    if text_or_tokens is None:
        tokens = held_out_input(m) if has_sample(m) else random_tokens(m)
    elif isinstance(text_or_tokens, str):
        tokens = input_ids(m, text_or_tokens)
    else:
        tokens = check_token_ids(text_or_tokens)
    v = sequence_view(m, tokens, check_int("layer", layer), heads)
    return HeadView(**{f.name: getattr(v, f.name) for f in fields(View)})


def long_view(model, text_or_tokens: str | list[int], layer: int = 0, head: int = 0, query: int = -1, **options):
    """One head's view of a long input for one query, from the blocked engine (never the n x n
    scores; a learned sink kept): :class:`attn_core.bilinear.LongView` with the exact window of
    the positions that end at ``query`` (negative counts from the end), its top keys and a pooled
    overview; ``options`` are ``window``, ``k``, ``blocks`` and ``pool`` of
    :meth:`attn_core.bilinear.LayerScores.view`. Alpha-entmax heads are refused.

    >>> lv = long_view(load("induction-2l"), [1, 2, 3, 4, 5, 6] * 3, layer=1, head=0, window=8)
    >>> lv.n, (lv.lo, lv.hi), len(lv.top)
    (18, (10, 17), 8)
    """
    from attn_core.bilinear.long import layer_scores
    from attn_core.bilinear.tokens import input_ids

    m = Model.of(model)
    tokens = input_ids(m, text_or_tokens) if isinstance(text_or_tokens, str) else check_token_ids(text_or_tokens)
    scores = layer_scores(m, tokens, check_int("layer", layer))
    head = check_int("head", head, 0, scores.n_heads - 1)
    query = check_int("query", query, -scores.n, scores.n - 1)
    for name in ("window", "k", "blocks"):  # the view's own checks, with the same words as every al.* argument
        if options.get(name) is not None:
            options[name] = check_int(name, options[name], 1)
    return scores.view(head, query, **options)


@dataclass
class Retrained:
    """What :func:`retrain` returns: the retrained ``model`` (a :class:`Model`), the measures
    ``before`` and ``after`` (dicts: loss, accuracy, entropy, stable rank, ``per_head``), the
    metric ``log`` (one row per logged step, one column per metric), and ``run_id`` when saved."""

    model: Model
    status: str
    message: str
    before: dict | None
    after: dict | None
    log: pd.DataFrame
    run_id: str | None = None

    def compare(self) -> pd.DataFrame:
        """Per regularized head, each measure before and after (columns ``<measure>_before`` and
        ``<measure>_after``).

        >>> r = retrain("induction-2l", reg={"entropy@L1": 0.1}, steps=2, progress=False)
        >>> r.compare()[["head", "entropy_data_before", "entropy_data_after"]].shape
        (4, 3)
        """
        rows = {}
        for when, measured in (("before", self.before), ("after", self.after)):
            for h in (measured or {}).get("per_head", []):
                row = rows.setdefault(h["head"], {"head": h["head"]})
                row.update({f"{k}_{when}": v for k, v in h.items() if isinstance(v, float)})
        return pd.DataFrame(list(rows.values()))

    def __repr__(self) -> str:
        saved = f", run {self.run_id}" if self.run_id else ""
        return f"Retrained({self.status}: {self.message}{saved})"


def retrain(
    model,
    reg: dict | list | None = None,
    steps: int = 300,
    text: str | Path | None = None,
    save: bool | str | Path = False,
    progress: bool = True,
    **settings,
) -> Retrained:
    """Retrain ``model`` (a Model, or a zoo name, folder or ``run:<id>``) with the regularizers
    ``reg`` (``{"entropy": 0.1}``, ``["topk:2@L1=0.5"]``) for ``steps`` steps, on its task or on
    ``text`` (a corpus for its tokenizer). Any other :class:`JobConfig` setting is a keyword
    (``lr``, ``seed``, ``heads``, ``penalty_rows``...). ``save``: True keeps the run in the run
    store (``ATTN_LAB_RUNS``), a folder keeps it in the run store there. A tqdm bar shows the
    steps (in a notebook, its widget).

    >>> r = retrain(load("induction-2l"), reg={"entropy": 0.1}, steps=3, progress=False)
    >>> r.status, int(r.log.step.max()), r.after["loss"] < 1
    ('completed', 3, True)
    """
    from attn_core.retraining.job import TrainingJob
    from attn_core.runs import RunStore
    from attn_core.training.config import JobConfig
    from attn_core.training.record import Outcome

    source = _source_of(model)
    text = check_text(text)
    text = None if text is None else str(text)
    check_bool("progress", progress)
    if reg is not None and not isinstance(reg, (dict, list, tuple)):
        raise TypeError(f"reg must be a dict of regularizer strengths or a list of specs, got {type(reg).__name__}")
    if not isinstance(save, bool):
        save = check_path(save, "save")
    cfg = JobConfig(source, reg or {}, steps=steps, text=text, **settings)
    store = False if save is False else RunStore() if save is True else RunStore(save)
    job = TrainingJob.open(cfg, store=store)
    bar = _bar(steps, f"retrain {source}") if progress else None
    if bar is not None:
        job.on_publish = lambda j: bar.update(j.snapshot().step - bar.n)
    try:
        out = job.run()
    finally:
        if bar is not None:
            bar.close()
    snap = job.snapshot()
    log = snap.metrics().pivot_table(index="step", columns="name", values="value").reset_index()
    log.columns.name = None
    if out["run_id"] is not None:
        retrained = load(f"run:{out['run_id']}") if save is True else _from_store(job.store, out["run_id"])
    else:
        card = job.card(Outcome(snap.status, snap.message), snap.after)
        t = job.model_copy()
        retrained = Model(name=f"retrained {source} (not saved)", model=t, config=t.cfg, card=card)
    return Retrained(retrained, snap.status, snap.message, snap.before, snap.after, log, out["run_id"])


def _source_of(model) -> str:
    """What a JobConfig names for ``model``: a name, folder or run as given; a loaded model by
    the name it was loaded under (a run, an upload, a zoo name) or else its folder."""
    if isinstance(model, (str, Path)):
        return str(check_source(model, "model"))
    m = Model.of(model)
    from attn_core import zoo
    from attn_core.sources import is_run, is_upload

    if is_run(m.name) or is_upload(m.name):
        return m.name
    if m.path is not None:
        try:
            if zoo.locate(m.name) == m.path:
                return m.name
        except CheckpointError:  # not a zoo name
            pass
        return str(m.path)
    raise ValueError(f"{m.name} was not read from a folder or a run: retrain it with save=True to retrain it again")


def _from_store(store, run_id: str) -> Model:
    return Model.of(store.load_model(f"run:{run_id}", "cpu"))


def _bar(total: int, desc: str):
    """A tqdm bar: a widget in a notebook that has ipywidgets, else text (tqdm's own choice,
    without its warning that ipywidgets is missing)."""
    import warnings

    from tqdm import TqdmWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TqdmWarning)
        from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step")
