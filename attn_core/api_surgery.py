"""The front door's surgery (:mod:`attn_core.api` holds the rest): edit a head's B and compare
heads across models from a notebook, on the code ``attn-lab edit`` and ``attn-lab diff`` run
(:mod:`attn_core.surgery`, docs/maths.md "Surgery")::

    import attn_core as al
    m = al.load("induction-2l")
    e = al.edit(m, "L1H0", rank=2)      # e.model, e.before, e.after, e.compare()
    al.diff(m, e.model)                  # one row per matched pair of heads
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attn_core.api import Model, _frame
from attn_core.api_checks import check_text, edit_head, indices, mode_scales
from attn_core.limits import MAX_SAMPLES, MAX_SEQUENCE, check_count
from attn_core.surgery import ABLATIONS, Edited, HeadEdit, edit_inputs, edit_metrics, edit_model, parse_head
from attn_core.surgery import diff as _diff
from attn_core.validate import check_bool, check_int, check_seed, shown

__all__ = ["EditResult", "edit", "diff"]

METRICS = ("loss", "perplexity", "accuracy", "icl_score", "sink_rate")


@dataclass
class EditResult:
    """What :func:`edit` returns: the edited ``model`` (a :class:`~attn_core.api.Model`), the
    measures ``before`` and ``after`` (the ``before``/``after`` of ``attn-lab edit --json``:
    loss, perplexity, accuracy, ICL score, sink rate and, per edited head, entropy and sigma_1)."""

    model: Model
    edits: list[HeadEdit]
    before: dict
    after: dict
    _parent: Model
    _edited: Edited

    def compare(self) -> pd.DataFrame:
        """One row per measure (each edited head's entropy and sigma_1 too), before and after.

        >>> from attn_core.api import load
        >>> r = edit(load("induction-2l"), "L1H0", rank=16, samples=8)  # full rank: nothing changes
        >>> df = r.compare().set_index("metric")
        >>> bool(abs(df.loc["loss", "before"] - df.loc["loss", "after"]) < 1e-6)
        True
        """
        rows = [dict(metric=k, before=self.before[k], after=self.after[k]) for k in METRICS]
        for head, v in self.after["heads"].items():
            rows += [dict(metric=f"{head} {k}", before=self.before["heads"][head][k], after=v[k]) for k in v]
        return pd.DataFrame(rows)

    def save(self, out: str | Path) -> dict:
        """Write the edited model as a new folder ``out`` that every command and page opens (an
        imported model stays a folder of its own family); returns ``{"out", "format"}``."""
        from attn_core.destinations import check_destination
        from attn_core.surgery.save import save_edited

        out = check_destination(out, "out")  # the output rule of every write, named as the argument
        return save_edited(self._parent, self._edited, out, "", dict(before=self.before, after=self.after))

    def __repr__(self) -> str:
        what = "; ".join(" ".join(f"{k}={v}" for k, v in e.to_json().items()) for e in self.edits)
        return f"EditResult({self.model.name}: {what})"


def edit(
    model,
    head: str | tuple[int, int] | list[HeadEdit],
    rank: int | None = None,
    drop: tuple[int, ...] = (),
    scale: dict[int, float] | None = None,
    ablate: str | None = None,
    source=None,
    source_head: str | None = None,
    with_ov: bool = False,
    sink: float | None = None,
    text: str | Path | None = None,
    samples: int = 64,
    length: int | None = None,
    seed: int = 0,
) -> EditResult:
    """Edit one head of ``model`` (``"L1H0"`` or ``(1, 0)``) as ``attn-lab edit`` does: keep its
    ``rank`` strongest modes, ``drop`` modes, ``scale`` modes (``{0: 2.0}``), ``ablate`` it
    (``"zero"`` or ``"mean"``), or transplant its W_Q, W_K (and W_V, W_O with ``with_ov``) from
    ``source`` (a model or a name; ``source_head`` ``"L1H2"``, default the same head), or multiply its
    learned sink logit by ``sink`` (models with learned sinks, gpt-oss; 0 zeroes it). Several
    edits: a list of :class:`~attn_core.surgery.HeadEdit` as ``head``. Measured on ``text``
    (windows of ``length`` tokens), else the task's held-out samples. The model itself is not
    changed: the result holds an edited copy.

    >>> from attn_core.api import load
    >>> r = edit(load("induction-2l"), "L0H3", rank=1, samples=16)
    >>> r.after["loss"] > r.before["loss"] + 0.5  # the previous-token head needs two modes
    True
    >>> round(r.after["heads"]["L0H3"]["sigma_1"], 4) == round(r.before["heads"]["L0H3"]["sigma_1"], 4)
    True
    """
    loaded = Model.of(model)
    src = None if source is None else Model.of(source)
    check_bool("with_ov", with_ov)
    if source is None and (source_head is not None or with_ov):
        what = "source_head" if source_head is not None else "with_ov"
        raise ValueError(f"{what} is for a transplant, which needs source= (the model whose head is copied)")
    check_text(text)
    check_count("samples", samples, hi=MAX_SAMPLES)
    if length is not None:
        check_count("length", length, hi=MAX_SEQUENCE)
    check_seed("seed", seed)
    sources = {} if src is None else {src.name: src}
    if isinstance(head, list):
        bad = [e for e in head if not isinstance(e, HeadEdit)]
        if bad or not head:
            raise TypeError(
                f"head as a list must hold HeadEdit objects (one per edit), got {shown(bad[0] if bad else head)}"
            )
        edits = head
        for e in edits:  # a transplant's source named by the edit itself is loaded, as the CLI's --from is
            if isinstance(e.source, str) and e.source not in sources:
                sources[e.source] = Model.of(e.source)
    else:
        if source_head is not None and not isinstance(source_head, str):
            raise TypeError(f"source_head must be one L<layer>H<head> of source (a str), got {shown(source_head)}")
        if ablate is not None and (not isinstance(ablate, str) or ablate not in ABLATIONS):
            raise ValueError(f"ablate must be one of {', '.join(ABLATIONS)}, got {shown(ablate)}")
        edits = [
            HeadEdit(
                *edit_head(head, loaded),
                rank=None if rank is None else check_int("rank", rank, 1, loaded.config.d_model),
                drop=indices("drop", drop),
                scale=mode_scales(scale),
                ablate=ablate,
                source=None if src is None else src.name,
                source_head=None if source_head is None else parse_head(source_head, src.config, src.name),
                with_ov=bool(with_ov),
                sink=_sink_factor(sink),
            )
        ]
    inputs = edit_inputs(loaded, text, samples, length, seed)
    edited = edit_model(loaded, edits, sources, tokens=inputs.tokens)
    heads = list(dict.fromkeys((e.layer, e.head) for e in edits))
    before, after = edit_metrics(loaded, inputs, heads, seed), edit_metrics(edited.loaded, inputs, heads, seed)
    return EditResult(Model.of(edited.loaded), edits, before, after, loaded, edited)


def _sink_factor(sink) -> float | None:
    """A sink factor as a float: a bool, a string or an array is refused naming ``sink``."""
    if sink is None:
        return None
    if isinstance(sink, bool) or not isinstance(sink, (int, float)):
        raise TypeError(f"sink must be a number (the factor on the head's sink logit), got {shown(sink)}")
    return float(sink)


def diff(a, b, layers: list[int] | None = None) -> pd.DataFrame:
    """Every head of ``a`` against every head of ``b`` by the distance of their B alone, matched
    one to one per layer: one row per pair (``layer``, ``head_a``, ``head_b``, ``distance``), the
    ``pairs`` of ``attn-lab diff --json``; ``.attrs`` holds the distance's name, the unmatched
    heads and the per-layer matrices.

    >>> from attn_core.api import load
    >>> m = load("induction-2l")
    >>> d = diff(m, m)
    >>> len(d), float(d.distance.max()) < 1e-6, bool((d.head_a == d.head_b).all())
    (8, True, True)
    """
    a, b = Model.of(a), Model.of(b)
    if layers is not None:
        layers = indices("layers", layers)
    out = _diff(a, b, layers).to_json()
    pairs = out.pop("pairs")
    return _frame(pairs, out)
