"""The documents of the analysis commands, built in one place for the CLI's ``--json`` and the
Python front door (:mod:`attn_core.api`, whose DataFrames have the documents' columns):
``spectrum`` (B of every head and its two ranks), ``sinks``, ``heads`` (the head detectors) and
``dynamics`` (the metrics of every checkpoint of a series). ``circuits`` is
:func:`attn_core.circuits.circuits_report`. Each takes what the command's options say, checks it
(one sentence), and returns plain records (tensors where the command prints lists)."""

from __future__ import annotations

from pathlib import Path

from attn_core import limits
from attn_core.bilinear.checks import check_loaded, check_model
from attn_core.checkpoint import LoadedModel
from attn_core.model import Transformer
from attn_core.validate import check_int, check_seed

PROBES = 32  # probes of spectrum and sinks (text windows or task samples)
VARIANCE = 0.9  # share of the variance the effective ranks of B and of the scores reach
DETECTOR_SAMPLES = 32  # generated sequences per head detector


def probe_inputs(loaded, text, field, samples: int, length: int | None, seed: int, progress=None):
    """The probes of ``loaded`` (:func:`attn_core.text.probes.probes`)."""
    from attn_core.text.probes import probes

    return probes(loaded, text, samples, length, seed, field=field, progress=progress)


def spectrum_document(
    loaded: LoadedModel | Transformer,
    augmented: bool = False,
    text: str | Path | None = None,
    text_field: str | None = None,
    samples: int = PROBES,
    length: int | None = None,
    seed: int = 0,
    variance: float = VARIANCE,
    progress=None,
) -> list[dict]:
    """One record per head (``attn-lab spectrum --json``): the spectrum of B and the two ranks of
    the head, of B and of its centred scores on probes (text, or the task's samples; none
    measured for a model with neither); with learned sinks, each head's sink logit and its
    ``sink_share`` on the probes (the mean mass of a row on the sink)."""
    from attn_core import bilinear
    from attn_core.bilinear.ranks import check_variance, ranks

    check_variance(variance)
    loaded = check_loaded(loaded, "spectrum")
    rows = bilinear.spectrum_rows(loaded.model, augmented=augmented)
    probes = None
    if text is not None or loaded.task is not None:
        probes = probe_inputs(loaded, text, text_field, samples, length, seed, progress)
    both = ranks(
        loaded.model,
        None if probes is None else probes.tokens,
        variance,
        "" if probes is None else probes.what,
        weight=None if augmented else _singular_values(rows, loaded.config.n_layers),
    )
    inputs = probes.what if probes is not None else None
    learned = None
    if probes is not None and loaded.model.cfg.attn_sinks:
        from attn_core.bilinear.sinks import sinks

        learned = sinks(loaded.model, probes.tokens).learned
    for row, two in zip(rows, both.heads()):
        row.update({k: two[k] for k in ("weight_rank", "data_rank", "data_stable_rank")}, variance=variance)
        row["data_inputs"] = inputs
        if learned is not None:
            row["sink_share"] = float(learned[row["layer"], row["head"]])
    return rows


def _singular_values(rows: list[dict], n_layers: int):
    """B's singular values [L, H, k] from the spectrum's rows (the weight ranks read them), or None
    when the layers' widths differ (grown heads: computed again there)."""
    import torch

    by_layer = [[r["singular_values"] for r in rows if r["layer"] == l] for l in range(n_layers)]
    if len({len(s) for layer in by_layer for s in layer}) != 1:
        return None
    return torch.tensor(by_layer, dtype=torch.float64, device="cpu")  # from the rows' Python floats


def sinks_document(
    loaded: LoadedModel | Transformer,
    text: str | Path | None = None,
    text_field: str | None = None,
    eps: float = 0.3,
    samples: int = PROBES,
    length: int | None = None,
    seed: int = 0,
    progress=None,
):
    """The sinks of every head on probes (:class:`attn_core.bilinear.sinks.Sinks`; its
    ``to_json()`` is ``attn-lab sinks --json`` less the model's name)."""
    from attn_core.bilinear.sinks import check_eps
    from attn_core.bilinear.sinks import sinks as find

    check_eps(eps)
    loaded = check_loaded(loaded, "sinks")
    p = probe_inputs(loaded, text, text_field, samples, length, seed, progress)
    return find(loaded.model, p.tokens, eps, p.what)


def heads_document(
    model: LoadedModel | Transformer,
    samples: int = DETECTOR_SAMPLES,
    seed: int = 0,
    length: int | None = None,
    rows: str = "supported",
) -> dict:
    """``attn-lab heads --json``: the detector scores of every head (``heads``), the best head of
    each detector, and the settings."""
    from attn_core import bilinear

    check_seed("--seed", seed)
    model = check_model(model, "heads")
    if length is not None:
        check_int("--length", length, 2, model.cfg.n_ctx)
    T = min(model.cfg.n_ctx, 64 if length is None else length)  # a longer length is refused by head_detectors
    limits.check_forward("--samples", samples, model.cfg, T)
    det = bilinear.head_detectors(model, n_samples=samples, seed=seed, length=length, rows=rows)
    wide = det.pivot(index=["layer", "head"], columns="detector", values="score").reset_index()
    found = [
        {"layer": int(r["layer"]), "head": int(r["head"]), **{d: float(r[d]) for d in bilinear.DETECTORS}}
        for _, r in wide.iterrows()
    ]
    return {"heads": found, "best": bilinear.best_heads(det), "samples": samples, "seed": seed, "rows": rows}


def dynamics_inputs(series, samples: int = 256, seed: int = 0, early=None, late=None, text=None, length=None):
    """The held-out inputs ``attn-lab dynamics`` measures a series on: windows of the text file
    ``text``, else the task's held-out samples (a series without a task needs a text)."""
    from attn_core import dynamics as D

    limits.check_count("--samples", samples, hi=limits.MAX_SAMPLES)
    check_seed("--seed", seed)
    if length is not None:
        limits.check_count("--length", length, lo=2, hi=limits.MAX_SEQUENCE)
    if text is not None:
        return D.series_text_inputs(series, text, length, samples, early, late)
    inputs = D.default_inputs(series, samples=samples, seed=seed, early=early, late=late)
    if inputs is None:
        raise ValueError("these models have no task in their card: give --text FILE to measure them on a text")
    return inputs
