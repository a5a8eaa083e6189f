"""Bilinear-form commands on one model: ``spectrum`` (of B per head, and the two ranks), ``scores`` (S and A of one
head on one input), ``heads`` (the head detectors) and ``export`` (any of their figures)."""

from __future__ import annotations

from pathlib import Path

import typer

from attn_core.cli import common, long_scores
from attn_core.cli.common import JsonOpt, NameArg, check_finite, check_head, emit, guarded, input_tokens, table
from attn_core.cli.sinks import FieldOpt, LengthOpt, SamplesOpt, SeedOpt, TextOpt
from attn_core.validate import check_seed

app = typer.Typer()

FIGURES = (
    "scores",
    "pattern",
    "query",
    "vocab",
    "vocab-pattern",
    "positional",
    "spectrum",
    "eigenvalues",
    "concentration",
    "heads",
    "pattern-sinks-apart",
    "pattern-no-sinks",
    "sinks",
    "ranks",
    "long-map",
    "long-rows",
)

SINK_VIEWS = {"pattern-sinks-apart": "apart", "pattern-no-sinks": "renormalized"}
LONG = ("long-map", "long-rows")  # blocked scores (long_scores.long_plot), any length


@app.command("spectrum")
@guarded
def spectrum_cmd(
    name: str = NameArg,
    augmented: bool = typer.Option(False, help="Spectrum of the bias-augmented B' (d_model + 1)."),
    text: Path | None = TextOpt,
    text_field: str | None = FieldOpt,
    samples: int = SamplesOpt,
    length: int | None = LengthOpt,
    seed: int = SeedOpt,
    variance: float = typer.Option(
        0.9, "--variance", help="Share of the variance the effective ranks of B and of the scores reach."
    ),
    as_json: bool = JsonOpt,
):
    """Singular values, eigenvalues of the symmetric part, norms and ranks of B for every head, and
    the two ranks of each head: of B (weight space) and of the centred scores S_c on probes cut
    from --text or the model's task samples (data space)."""
    from attn_core import documents
    from attn_core.bilinear.ranks import check_variance
    from attn_core.cli.text_options import byte_bars
    from attn_core.sources import resolve

    check_variance(variance)
    loaded = resolve(name)
    with byte_bars() as progress:  # tokenizing a text: a bar on stderr, with --json too
        rows = documents.spectrum_document(
            loaded, augmented, text, text_field, samples, length, seed, variance, progress
        )
    check_finite("the spectrum of B", *(r["singular_values"] for r in rows))
    inputs = rows[0]["data_inputs"]

    def human(rs):
        rows = [dict(r, sigma_1=r["singular_values"][0], lambda_sym_1=r["eigenvalues_sym"][0]) for r in rs]
        cols = ["layer", "head", "rank_cap", "sigma_1", "lambda_sym_1", "stable_rank", "effective_rank"]
        cols += ["frobenius_norm", "nuclear_norm", "weight_rank", "data_rank", "data_stable_rank"]
        where = f"on {inputs}" if inputs else "not measured: give --text FILE"
        return table(rows, cols) + (
            f"\nweight_rank, data_rank: components of B and of the centred scores S_c for {variance:.0%} of the "
            f"variance (data {where})"
        )

    emit(rows, as_json, human)


@app.command("scores")
@guarded
def scores_cmd(
    name: str = NameArg,
    layer: int = typer.Option(0, help="Layer index."),
    head: int = typer.Option(0, help="Head index."),
    tokens: str | None = common.TokensOpt,
    sample_seed: int | None = common.SampleSeedOpt,
    random_seed: int | None = common.RandomSeedOpt,
    k: int = typer.Option(1, help="k of the top-k mass."),
    eps: float = typer.Option(
        0.3, "--eps", help="Sink keys on this input: importance above this (concentration without them too)."
    ),
    text: Path | None = long_scores.TextOpt,
    length: int | None = long_scores.LengthOpt,
    topk: int | None = long_scores.TopkOpt,
    as_json: bool = JsonOpt,
):
    """Scores S = X'B'X'^T (the model's own pre-softmax scores), pattern A and the concentration
    of every query row for one head on one input, with and without the head's sink keys on it.
    With --topk (any length, e.g. --text FILE --length 8192): per query its top keys, entropy
    and sink mass from blocked scores, never T x T."""
    import torch

    from attn_core import bilinear, metrics
    from attn_core.bilinear.sinks import check_eps
    from attn_core.sources import resolve

    long_scores.check_options(text, length, topk, tokens, sample_seed, random_seed)
    check_eps(eps)
    loaded = resolve(name)
    check_head(loaded, layer, head)
    ids = long_scores.long_tokens(loaded, text, length, tokens, sample_seed, random_seed)
    long_scores.check_long_input(loaded, ids, topk)
    if topk is not None:
        return long_scores.blocked_scores(loaded, ids, layer, head, topk, as_json)
    view = bilinear.sequence_view(loaded, ids, layer, [head])
    check_finite(f"the scores of L{layer}H{head}", view.scores[0][view.mask], view.pattern[0][view.mask])
    per_row = {m: v[0] for m, v in view.concentration(k).items()}
    valid = metrics.informative_rows(view.mask, view.pattern[0].shape)
    summary = {m: {s: float(t) for s, t in metrics.summarize(v, valid).items()} for m, v in per_row.items()}
    sink_keys = view.sink_keys(eps)[0]
    without = {m: v[0] for m, v in view.concentration(k, without_sinks=True, eps=eps).items()}
    _, kept = metrics.drop_keys(view.pattern[0], view.mask, sink_keys)
    kept_rows = metrics.informative_rows(kept, kept.shape)
    summary_without = {m: {s: float(t) for s, t in metrics.summarize(v, kept_rows).items()} for m, v in without.items()}
    names = bilinear.token_names(loaded)
    result = {
        "name": loaded.name,
        "layer": layer,
        "head": head,
        "tokens": [names[t] for t in ids],
        "token_ids": ids,
        "scores": view.scores[0].masked_fill(~view.mask, float("nan")),
        "pattern": view.pattern[0],
        "concentration": {"per_query": per_row, "summary": summary, "k": k},
        "sink_keys": torch.nonzero(sink_keys).flatten().tolist(),
        "eps": eps,
        "concentration_without_sinks": {
            "per_query": {m: v.masked_fill(~kept_rows, float("nan")) for m, v in without.items()},
            "summary": summary_without,
            "k": k,
        },
    }

    def human(r):
        rows = []
        for q, tok in enumerate(r["tokens"]):
            top = int(view.pattern[0, q].argmax())
            rows.append(
                dict(
                    query=q,
                    token=tok,
                    top_key=f"{top}:{r['tokens'][top]}",
                    top_prob=float(view.pattern[0, q, top]),
                    norm_entropy=float(per_row["normalized_entropy"][q]),
                    hoyer=float(per_row["hoyer"][q]),
                )
            )
        tail = "  ".join(f"{m} {v['mean']:.3g}" for m, v in summary.items())
        out = table(rows, list(rows[0])) + f"\nmean over rows with >= 2 keys: {tail}"
        if r["sink_keys"]:
            free = "  ".join(f"{m} {v['mean']:.3g}" for m, v in summary_without.items())
            keys = ", ".join(f"{i}:{r['tokens'][i]}" for i in r["sink_keys"])
            out += f"\nwithout the sink keys ({keys}; importance > {eps:g}), rows renormalized: {free}"
        else:
            out += f"\nno sink key on this input (importance > {eps:g})"
        return out

    emit(result, as_json, human)


@app.command("heads")
@guarded
def heads_cmd(
    name: str = NameArg,
    samples: int = typer.Option(32, help="Generated sequences per detector."),
    seed: int = typer.Option(0, help="Seed of the generated sequences."),
    length: int | None = typer.Option(None, help="Sequence length (default: the context, at most 64)."),
    rows: str = typer.Option(
        "supported",
        help="Average over 'supported' rows (a perfect head scores 1) or 'all' rows (TransformerLens' normalisation).",
    ),
    as_json: bool = JsonOpt,
):
    """Previous-token, induction, duplicate-token and self scores of every head, on seeded
    random and repeated random sequences from the model's vocabulary."""
    from attn_core import bilinear, documents
    from attn_core.sources import resolve

    check_seed("--seed", seed)
    result = documents.heads_document(resolve(name), samples, seed, length, rows)
    emit(result, as_json, lambda r: table(r["heads"], ["layer", "head", *bilinear.DETECTORS]))


@app.command("export")
@guarded
def export_cmd(
    name: str = NameArg,
    figure: str = typer.Option(..., help=f"One of: {', '.join(FIGURES)}."),
    out: Path = typer.Option(..., help="File to write (never overwritten)."),
    fmt: str | None = typer.Option(None, "--format", help="png, svg, html or csv (default: from --out)."),
    layer: int = typer.Option(0, help="Layer (views)."),
    head: int = typer.Option(0, help="Head (views)."),
    query: int | None = typer.Option(None, help="Query row to highlight (the 'query' figure needs one; default last)."),
    tokens: str | None = common.TokensOpt,
    sample_seed: int | None = common.SampleSeedOpt,
    random_seed: int | None = common.RandomSeedOpt,
    without_sinks: bool = typer.Option(
        False, "--without-sinks", help="concentration: measured without each head's sink keys (rows renormalized)."
    ),
    text: Path | None = long_scores.TextOpt,
    length: int | None = long_scores.LengthOpt,
    as_json: bool = JsonOpt,
):
    """Write one figure as PNG, SVG, HTML or its data as CSV. The sink figures (pattern-sinks-apart,
    pattern-no-sinks: one head's pattern with its sink keys apart or left out; sinks: key importance
    per head) and ranks (the two ranks of each head) are measured on the model's task samples;
    ``attn-lab sinks --out`` and ``spectrum`` take a text. long-map (one head's multi-resolution
    map, its sink column apart) and long-rows (entropy and sink mass per query; its CSV every
    query's top keys) take any length (--text FILE --length N, or --random-seed S --length N)."""
    from attn_core import bilinear
    from attn_core.destinations import check_destination
    from attn_core.figures import EXPORT_FORMATS, ExportError, write_plot
    from attn_core.figures import bilinear as fb
    from attn_core.sources import resolve

    if figure not in FIGURES:
        raise ValueError(f"unknown figure {figure!r}; choose one of {', '.join(FIGURES)}")
    fmt = (fmt or out.suffix.lstrip(".")).lower()
    if fmt not in EXPORT_FORMATS:
        raise ValueError(
            f"unknown format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)} (--format or the --out suffix)"
        )
    check_destination(out, "--out")  # the output rule of every command that writes, before any work
    long_scores.check_options(text, length, None, tokens, sample_seed, random_seed)
    if (text is not None or length is not None) and figure not in LONG:
        raise ValueError(f"--text and --length are for {' and '.join(LONG)}; {figure} takes --tokens or a seed")
    loaded = resolve(name)
    model = loaded.model
    if figure in ("scores", "pattern", "query", "vocab", "vocab-pattern", "positional", *SINK_VIEWS, *LONG):
        check_head(loaded, layer, head)
    if figure in LONG:
        ids = long_scores.long_tokens(loaded, text, length, tokens, sample_seed, random_seed)
        plot = long_scores.long_plot(loaded, figure, ids, layer, head, query)
    elif figure in SINK_VIEWS:
        from attn_core.figures.sinks import sink_view_plot

        view = bilinear.sequence_view(loaded, input_tokens(loaded, tokens, sample_seed, random_seed), layer, [head])
        plot = sink_view_plot(view, head, SINK_VIEWS[figure])
    elif figure in ("sinks", "ranks"):
        from attn_core.text.probes import measure_ranks, measure_sinks

        if figure == "sinks":
            from attn_core.figures.sinks import importance_plot

            plot = importance_plot(measure_sinks(loaded))
        else:
            from attn_core.figures.ranks import ranks_plot

            plot = ranks_plot(measure_ranks(loaded))
    elif figure in ("scores", "pattern", "query"):
        view = bilinear.sequence_view(loaded, input_tokens(loaded, tokens, sample_seed, random_seed), layer, [head])
        if figure == "query":
            plot = fb.query_plot(view, head, len(view.queries) - 1 if query is None else query)
        else:
            plot = fb.view_plot(view, head, query, value="scores" if figure == "scores" else "pattern")
    elif figure in ("vocab", "vocab-pattern"):
        plot = fb.view_plot(
            bilinear.vocabulary_view(loaded, layer, [head]),
            head,
            query,
            value="scores" if figure == "vocab" else "pattern",
        )
    elif figure == "positional":
        plot = fb.view_plot(bilinear.positional_view(loaded, layer, [head]), head, query)
    elif figure == "spectrum":
        plot = fb.spectrum_plot(bilinear.spectrum_frame(model))
    elif figure == "eigenvalues":
        plot = fb.eigen_plot(bilinear.eigen_frame(model))
    elif figure == "concentration":
        seq = input_tokens(loaded, tokens, sample_seed, random_seed)
        plot = fb.concentration_plot(bilinear.concentration_table(loaded, seq, without_sinks=without_sinks))
    else:
        plot = fb.heads_plot(bilinear.head_detectors(model))
    try:
        path = write_plot(plot, out, fmt, what="--out")
    except ExportError as e:
        raise ValueError(str(e)) from None
    emit(
        {"figure": figure, "plot": plot.name, "format": fmt, "out": str(path), "bytes": path.stat().st_size},
        as_json,
        lambda r: f"wrote {r['out']} ({r['format']}, {r['bytes']} bytes)",
    )
